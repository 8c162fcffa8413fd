"""What an MCP tool call costs over a built-in's (``.venv/bin/python bench/mcp.py``; also run by
``make bench``).

1. A call of a read-only MCP tool over stdio (the test server's ``read_note``) against the
   built-in ``read`` of a small file, each through its ``Tool.execute``, interleaved call by call
   once the server runs: median and p95 ms, and the difference. Everything around ``execute``
   (the policy, the activity, the fenced settlement) is the same path for both. Target: MCP adds
   <= 5 ms median.
2. A server's start-up (the launcher, the interpreter, the SDK's handshake and its tool list):
   median and p95 ms over fresh pools.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from activities.tools.base import ToolContext  # noqa: E402
from activities.tools.files import Read, ReadInput  # noqa: E402
from activities.tools.mcp import McpPool  # noqa: E402
from activities.tools.mcp_config import McpConfig  # noqa: E402
from activities.tools.settings import ToolSettings  # noqa: E402

SERVER = str(_BENCH_DIR.parent / "tests" / "activities" / "tools" / "mcp_server.py")


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def _pool(root: Path) -> McpPool:
    command = [sys.executable, SERVER, "stdio", str(root / "calls")]
    config = McpConfig.model_validate({"mcp": {"t": {"type": "local", "command": command}}})
    return McpPool(config, ToolSettings())


async def _timed(call: Any) -> float:
    started = time.perf_counter()
    await call
    return (time.perf_counter() - started) * 1000


async def call_costs(root: Path, calls: int = 200) -> dict[str, list[float]]:
    async def progress(_structured: dict[str, Any], _text: str) -> None:
        return None

    (root / "note.txt").write_text("a note\n")
    context = ToolContext("ses_bench", root, "msg_bench", "call_bench", progress)
    read = Read(ToolSettings())
    pool = _pool(root)
    try:
        (note,) = [t for t in await pool.tools("t", str(root)) if t.name == "t_read_note"]
        arguments = note.input_model.model_validate({"topic": "bench"})
        costs: dict[str, list[float]] = {"built-in read": [], "MCP read_note": []}
        for _ in range(calls):
            costs["built-in read"].append(
                await _timed(read.execute(ReadInput(path="note.txt"), context))
            )
            costs["MCP read_note"].append(await _timed(note.execute(arguments, context)))
        return costs
    finally:
        await pool.close()


async def start_costs(root: Path, starts: int = 10) -> list[float]:
    took = []
    for _ in range(starts):
        pool = _pool(root)
        took.append(await _timed(pool.connection("t", str(root))))
        await pool.close()
    return took


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        costs = await call_costs(root)
        starts = await start_costs(root)
    print("MCP tool call over stdio vs a built-in, through Tool.execute (ms)")
    for name, values in costs.items():
        print(f"  {name:<16} median {statistics.median(values):6.2f}  p95 {p95(values):6.2f}")
    added = statistics.median(costs["MCP read_note"]) - statistics.median(costs["built-in read"])
    print(f"  MCP adds {added:.2f} ms median (target <= 5 ms)")
    print(f"server start-up: median {statistics.median(starts):.0f} ms, p95 {p95(starts):.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
