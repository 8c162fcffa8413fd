"""The adapter registry loads an SDK only for the provider a session asks for (which adapter
each reference gets: ``test_settings.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[3]


def test_a_worker_starts_without_importing_the_provider_sdks() -> None:
    """A worker (re)started by a deploy or a crash polls sooner: ``openai`` and ``anthropic``
    took about 4 s of its 7 s of imports here, for sessions that may never use them."""
    probe = (
        "import sys, worker, activities.runtime, activities.providers.errors;"
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stderr
