"""Activity test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def checks_invariants() -> bool:
    """Every store a test leaves keeps the log invariants (``tests/conftest.py``)."""
    return True
