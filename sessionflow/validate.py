"""A session's workspace and model, checked once, when the session is created.

Both are resolved against the creator's working directory and stored absolute: a worker runs
elsewhere, and a relative path would name another file there (or none), failing only when a
tool runs or a turn starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sessionflow.errors import InvalidInputError
from sessionflow.models.common import PROVIDER_IDS, ModelRef

if TYPE_CHECKING:
    from pydantic import BaseModel


def workspace(directory: str | Path) -> str:
    """``directory`` made absolute; an error when it is missing or not a directory."""
    path = Path(directory).expanduser().resolve()
    if not path.exists():
        raise InvalidInputError(
            f"Workspace {path} does not exist: create it, or pass the project's directory",
            field="workspace",
        )
    if not path.is_dir():
        raise InvalidInputError(
            f"Workspace {path} is not a directory: pass the project's directory, not a file in it",
            field="workspace",
        )
    return str(path)


def new_workspace(directory: str | Path, host: str) -> str:
    """A workspace to create on ``host`` (a fork's): made absolute on this machine's own
    host; elsewhere it must be absolute already (the host checks the rest)."""
    if host == "local":  # lexically: what the caller wrote, as the caller's shell reads it
        return os.path.abspath(Path(directory).expanduser())
    if not str(directory).startswith("/"):
        raise InvalidInputError(
            f"Workspace {directory} must be an absolute path on host {host}: a relative path "
            "names a directory of this machine, not of that host",
            field="workspace",
        )
    return str(directory)


def model(ref: str | ModelRef) -> ModelRef:
    """``ref`` parsed and checked; a scripted model's script is loaded and made absolute."""
    parsed = ModelRef.parse(ref) if isinstance(ref, str) else ref
    if parsed.provider_id not in PROVIDER_IDS:
        known = ", ".join(f"{p}/…" for p in PROVIDER_IDS)
        raise InvalidInputError(
            f"Unknown model provider {parsed.provider_id!r} in {parsed}: use one of {known}",
            field="model",
        )
    if parsed.provider_id != "scripted":
        return parsed
    script = Path(parsed.id).expanduser().resolve()
    check_script(script)
    return parsed.model_copy(update={"id": str(script)})


def check_script(path: Path) -> int:
    """Load the script as a worker would and check its calls of built-in tools; its turns."""
    from activities.providers.scripted import ScriptError, check_script

    try:
        return len(check_script(path, _builtin_inputs()).turns)
    except ScriptError as error:
        raise InvalidInputError(str(error), field="model") from None


def _builtin_inputs() -> dict[str, type[BaseModel]]:
    from activities.tools.builtin import builtin_tools

    return {tool.name: tool.input_model for tool in builtin_tools()}
