"""Worker logs (``sessionflow/logs.py``): an expected failure is one line, a defect a traceback."""

from __future__ import annotations

import logging

import pytest

from sessionflow.errors import StoreUnavailableError
from sessionflow.logs import quiet_expected_failures


def _failed(caplog: pytest.LogCaptureFixture, error: BaseException) -> logging.LogRecord:
    quiet_expected_failures()
    logger = logging.getLogger("temporalio.activity")
    try:
        raise RuntimeError("activity failed") from error
    except RuntimeError:
        with caplog.at_level(logging.WARNING, logger="temporalio.activity"):
            logger.warning("Completing activity as failed", exc_info=True)
    return caplog.records[-1]


def test_a_store_outage_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32: a PostgreSQL restart logged a full traceback for an outage the drain rides
    out."""
    record = _failed(caplog, StoreUnavailableError("connection refused"))
    assert record.exc_info is None
    assert "(expected, handled): StoreUnavailableError: The database is unavailable" in (
        record.getMessage()
    )


def test_a_defect_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    record = _failed(caplog, KeyError("bug"))
    assert record.exc_info is not None
