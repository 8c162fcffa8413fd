"""What a model can take: the model table for real providers, the script's ``limits`` block."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from activities.providers.models import lookup
from activities.providers.scripted import load_script
from sessionflow.models.common import Limits, ModelRef


def model_limits(model: ModelRef) -> Limits | None:
    """The window and output limit of ``model``; None when unknown (no auto compaction)."""
    if model.provider_id == "scripted":
        try:
            stat = os.stat(model.id)
        except OSError:
            return None  # the turn itself reports the missing script
        return _script_limits(model.id, stat.st_mtime_ns, stat.st_size)
    info = lookup(model)
    return None if info is None else Limits(context=info.context, output=info.output)


@lru_cache(maxsize=256)
def _script_limits(path: str, _mtime_ns: int, _size: int) -> Limits | None:
    """Parsed once per version of the file: this runs before every turn."""
    return load_script(Path(path)).limits
