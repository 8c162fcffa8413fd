"""What containment and the permission policy cost a shell call (printed by ``bench/drain.py``;
also ``.venv/bin/python bench/shell.py`` alone).

1. ``bash`` running ``true`` through the tool (snapshot, spawn, supervision, output), with the
   sandbox off and on, interleaved call by call: median and p95 ms, and the difference. Target:
   the sandbox adds <= 15 ms median.
2. One policy check of a compound command (``git status && ls | grep x; echo $(cat a) > /dev/null
   && rm -rf build``) against the build agent's rules plus a session deny rule: median and p95
   microseconds, parse included.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# As in drain.py: bench/store.py must not shadow the ``store`` package.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from activities.permissions import evaluate  # noqa: E402
from activities.tools.base import ToolContext  # noqa: E402
from activities.tools.bash import Bash, BashInput  # noqa: E402
from activities.tools.settings import ToolSettings  # noqa: E402
from sessionflow.agents import BUILD  # noqa: E402
from sessionflow.models.permissions import Rule  # noqa: E402

COMPOUND = "git status && ls | grep x; echo $(cat a) > /dev/null && rm -rf build"


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


async def _call(tool: Bash, context: ToolContext) -> float:
    started = time.perf_counter()
    await tool.execute(BashInput(command="true"), context)
    return (time.perf_counter() - started) * 1000


async def shell_costs(calls: int = 60) -> dict[str, list[float]]:
    async def progress(_structured: dict[str, Any], _text: str) -> None:
        return None

    samples: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="sessionflow-shell-bench-") as directory:
        context = ToolContext("ses_bench", Path(directory), "msg_bench", "call_bench", progress)
        tools = {mode: Bash(ToolSettings(sandbox=mode == "on")) for mode in samples}
        for tool in tools.values():  # warm-up: the sandbox's one start check
            await _call(tool, context)
        for _ in range(calls):
            for mode, tool in tools.items():
                samples[mode].append(await _call(tool, context))
    return samples


def policy_costs(checks: int = 2000) -> list[float]:
    rules = [*BUILD.permissions, Rule(tool="bash", pattern="rm *", action="deny")]
    samples = []
    for _ in range(checks):
        started = time.perf_counter()
        verdict = evaluate("bash", {"command": COMPOUND}, rules, "ask", "/")
        samples.append((time.perf_counter() - started) * 1e6)
    assert verdict.action == "deny"
    return samples


async def report(calls: int = 60) -> None:
    shell = await shell_costs(calls)
    print(f"\nshell call `true` through bash, {calls} calls each (ms):  median      p95")
    for mode in ("off", "on"):
        values = shell[mode]
        print(
            f"  sandbox {mode:<3}                                {statistics.median(values):>7.1f} "
            f"{p95(values):>8.1f}"
        )
    added = statistics.median(shell["on"]) - statistics.median(shell["off"])
    verdict = "ok" if added <= 15 else "ABOVE TARGET"
    print(f"  the sandbox adds {added:.1f} ms median (target <= 15 ms: {verdict})")
    policy = policy_costs()
    print(
        f"policy check of a compound command (6 simple commands): median "
        f"{statistics.median(policy):.0f} us, p95 {p95(policy):.0f} us"
    )


if __name__ == "__main__":
    asyncio.run(report())
