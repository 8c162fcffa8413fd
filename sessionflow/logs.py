"""Worker logs a user can read: expected recovery paths are one line, not a traceback.

A lost claim after a takeover, a held claim, a script that does not load, a session missing
from this worker's store, the store unavailable for a moment (an outage the drain rides out):
each is handled (the session recovers, or the outcome carries the
error), so Temporal's "Completing activity as failed" warning with a full traceback only hides
the log lines that matter.
"""

from __future__ import annotations

import logging

EXPECTED = frozenset(
    {
        "ClaimLostError",
        "ClaimHeldError",
        "StaleAttemptError",
        "ScriptError",
        "SessionNotFoundError",
        "StoreUnavailableError",
    }
)


def expected_failure(error: BaseException | None) -> BaseException | None:
    """The expected error in ``error``'s chain (by class name or ``ApplicationError.type``)."""
    seen = 0
    while error is not None and seen < 10:
        if type(error).__name__ in EXPECTED or getattr(error, "type", None) in EXPECTED:
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


class OneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        found = expected_failure(error)
        if found is not None:
            kind = getattr(found, "type", None) or type(found).__name__
            first = (str(found).splitlines() or [""])[0]
            record.msg = f"{record.getMessage()} (expected, handled): {kind}: {first}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_expected_failures() -> None:
    """Install the filter on the loggers that report failed activities (idempotent)."""
    for name in ("temporalio.activity", "temporalio.worker._activity"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLine) for f in logger.filters):
            logger.addFilter(OneLine())
