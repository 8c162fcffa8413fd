"""The scripted provider reads its file once per version of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from activities.providers import base as p
from activities.providers.scripted import ScriptedProvider, load_script
from sessionflow.models.common import ModelRef


def _write(path: Path, text: str) -> None:
    path.write_text(json.dumps({"turns": [{"events": [{"text": text}]}]}))


async def _text(provider: ScriptedProvider, path: Path) -> str:
    request = p.ProviderRequest(
        session_id="ses_1", request_index=0, model=ModelRef.parse(f"scripted/{path}")
    )
    return "".join([e.delta async for e in provider.stream(request) if isinstance(e, p.TextDelta)])


async def test_an_unchanged_script_is_parsed_once(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _write(path, "Hello.")
    assert load_script(path) is load_script(path)


async def test_an_edited_script_plays_its_new_turns(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    provider = ScriptedProvider(path, record=False)
    _write(path, "First.")
    assert await _text(provider, path) == "First."
    _write(path, "Other.")  # same size: only the modification time tells them apart
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert await _text(provider, path) == "Other."
    _write(path, "A longer text.")
    assert await _text(provider, path) == "A longer text."
