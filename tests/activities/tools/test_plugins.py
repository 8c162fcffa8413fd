"""Tool plugins: ``SESSIONFLOW_TOOLS`` ``module:attribute`` entries and the ``sessionflow.tools``
entry points, as a worker loads them at start, and each bad entry's one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.tools.base import ToolContext
from worker import tools_from_env

ROOT = Path(__file__).parents[3]
PLUGINS = "tests.activities.tools.plugin_tools"


def loaded(monkeypatch: pytest.MonkeyPatch, value: str) -> dict[str, tuple[str, bool]]:
    monkeypatch.setenv("SESSIONFLOW_TOOLS", value)
    registry = tools_from_env()
    return {
        name: (registry.origin(name) or "", registry.get(name).retry_safe)  # type: ignore[union-attr]
        for name in registry.names()
    }


@pytest.mark.parametrize(
    ("attribute", "names"),
    [
        ("run_tests", ["run_tests"]),  # a tool
        ("RunTests", ["run_tests"]),  # a Tool subclass
        ("both", ["run_tests", "lint"]),  # a list
        ("factory", ["lint"]),  # a factory
    ],
)
def test_an_entry_loads_beside_the_built_ins(
    monkeypatch: pytest.MonkeyPatch, attribute: str, names: list[str]
) -> None:
    tools = loaded(monkeypatch, f"builtin,{PLUGINS}:{attribute}")
    assert "bash" in tools and tools["bash"][0] == "built-in"
    for name in names:
        assert tools[name][0] == f"plugin {PLUGINS}:{attribute}"


def test_a_plugin_is_not_retry_safe_unless_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    tools = loaded(monkeypatch, f"{PLUGINS}:both")
    assert tools == {
        "run_tests": (f"plugin {PLUGINS}:both", False),
        "lint": (f"plugin {PLUGINS}:both", True),
    }


async def test_a_plugin_tool_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SESSIONFLOW_TOOLS", f"{PLUGINS}:run_tests")
    tool = tools_from_env().get("run_tests")
    assert tool is not None

    async def progress(_data: object, _title: str) -> None:
        return None

    output = await tool.execute(
        tool.input_model.model_validate({"target": "unit"}),
        ToolContext("ses_p", tmp_path, "msg_p", "call_p", progress),
    )
    assert output.content[0].text == f"ran unit in {tmp_path.name}"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no_such_module:tool", "tool entry 'no_such_module:tool': cannot import no_such_module"),
        (f"{PLUGINS}:missing", f"{PLUGINS} has no attribute missing"),
        (f"{PLUGINS}:not_a_tool", "is not a tool (subclass sessionflow.tools.Tool)"),
        (f"{PLUGINS}:broken_factory", "its factory failed: no config"),
        (f"builtin,{PLUGINS}:Clashing", "tool 'read' from plugin "),
        (f"{PLUGINS}:BadName", "name 'run tests' must match ^[A-Za-z0-9_-]{1,64}$"),
        (f"{PLUGINS}:NotAnObject", "tool 'weird''s input schema must describe an object"),
        (f"{PLUGINS}", "SESSIONFLOW_TOOLS='tests.activities.tools.plugin_tools': use builtin"),
        (f"{PLUGINS}:run_tests,{PLUGINS}:RunTests", "the name is taken by plugin"),
    ],
)
def test_a_bad_entry_stops_the_worker_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("SESSIONFLOW_TOOLS", value)
    with pytest.raises(SystemExit) as stopped:
        tools_from_env()
    line = str(stopped.value)
    assert message in line and "\n" not in line


def _entry_point_package(root: Path, value: str) -> Path:
    """An installed distribution (its metadata only) declaring a ``sessionflow.tools`` entry."""
    info = root / "acme_tools-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tools\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[sessionflow.tools]\nacme = {value}\n")
    return root


def _load_in_process(path: Path, tools: str) -> subprocess.CompletedProcess[str]:
    """``tools_from_env`` in a fresh interpreter that sees the distribution at ``path``."""
    code = "from worker import tools_from_env; r = tools_from_env(); print(r.origin('lint'))"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}", "SESSIONFLOW_TOOLS": tools}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_an_entry_point_loads_too(tmp_path: Path) -> None:
    path = _entry_point_package(tmp_path, f"{PLUGINS}:factory")
    done = _load_in_process(path, "builtin")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"entry point acme ({PLUGINS}:factory)"


def test_an_entry_point_clashing_with_an_entry_stops_the_worker(tmp_path: Path) -> None:
    path = _entry_point_package(tmp_path, f"{PLUGINS}:factory")
    done = _load_in_process(path, f"builtin,{PLUGINS}:both")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"SESSIONFLOW_TOOLS: tool 'lint' from entry point acme ({PLUGINS}:factory): "
        f"the name is taken by plugin {PLUGINS}:both"
    )


def test_the_worker_stops_before_it_connects(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SESSIONFLOW_TOOLS": "builtin,nowhere:tool"}
    env["SESSIONFLOW_TEMPORAL_ADDRESS"] = "127.0.0.1:1"  # nothing there: it must not get that far
    done = subprocess.run(
        [sys.executable, "-m", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "SESSIONFLOW_TOOLS: tool entry 'nowhere:tool': cannot import nowhere: "
        "No module named 'nowhere'"
    )
