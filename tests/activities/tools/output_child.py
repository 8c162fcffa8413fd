"""Runs one bash call in a process of its own and reports its peak memory (catalogue D1).

``python -m tests.activities.tools.output_child WORKSPACE COMMAND REPORT``: the tool runs as the
worker runs it (default settings: the model's cap and the store's cap), and REPORT gets the
process's peak resident set (``VmHWM``) before and after the call, with what the call returned.
A test reads the peak of a process that ran nothing else, so the growth is the call's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from activities.tools.base import ToolContext
from activities.tools.builtin import builtin_registry
from activities.tools.settings import ToolSettings


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


async def _progress(structured: dict[str, Any], text: str) -> None:
    del structured, text  # the worker would heartbeat; nothing here keeps what it reports


async def main(workspace: str, command: str, report: str) -> None:
    tool = builtin_registry(ToolSettings(kill_grace=0.3)).get("bash")
    assert tool is not None
    context = ToolContext("ses_test", Path(workspace), "msg_test", "call_test", _progress)
    before = peak_rss_bytes()
    output = await tool.execute(tool.input_model.model_validate({"command": command}), context)
    after = peak_rss_bytes()
    shown = "".join(getattr(part, "text", "") for part in output.content)
    result = {
        "before": before,
        "after": after,
        "shown": shown,
        "full_text": output.full_text,
        "structured": output.structured,
    }
    Path(report).write_text(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
