"""The sandbox shows the worker's toolchains, never its secrets (``activities/tools/toolchain.py``,
issue 32): run with the real bubblewrap, through the real ``bash`` tool."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from activities.tools.sandbox import describe
from activities.tools.toolchain import shown
from tests.activities.tools.conftest import Sandbox, text
from tests.activities.tools.test_sandbox import shell

SECRET = "NEVER-SEEN-SECRET"


async def test_python_in_the_sandbox_is_the_workers_interpreter_with_its_packages(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker runs from a virtualenv whose base interpreter lives in a hidden home (pyenv
    under /root here): ``python3 -m pytest`` in the sandbox runs it, with its packages."""
    monkeypatch.setenv("PATH", f"{sys.prefix}/bin{os.pathsep}{os.environ['PATH']}")
    output = await shell(
        sandbox,
        'python3 -c "import sys, pytest; print(sys.prefix, pytest.__version__)" && '
        "python3 -m pytest --version",
    )
    assert f"{sys.prefix} {pytest.__version__}" in text(output), text(output)
    assert f"pytest {pytest.__version__}" in text(output)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory with toolchains on the ``PATH`` and secrets beside and inside them."""
    home = tmp_path / "home"
    for tool in (".tool/bin", ".local/bin", ".cargo/bin"):
        (home / tool).mkdir(parents=True)
        script = home / tool / f"hello-{tool.split('/')[0].strip('.')}"
        script.write_text("#!/bin/sh\necho hello from $0\n")
        script.chmod(0o755)
    secrets = [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".config/gh/hosts.yml",
        ".netrc",
        ".docker/config.json",
        ".local/share/keyrings/login.keyring",
        ".local/state/sessionflow/stacks/x.json",
        ".cargo/credentials.toml",
        ".elsewhere/notes.txt",
    ]
    for secret in secrets:
        (home / secret).parent.mkdir(parents=True, exist_ok=True)
        (home / secret).write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    path = os.pathsep.join(str(home / t) for t in (".tool/bin", ".local/bin", ".cargo/bin"))
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return home


async def test_toolchains_in_the_home_run_and_the_secrets_stay_hidden(
    sandbox: Sandbox, home: Path
) -> None:
    output = await shell(
        sandbox,
        "hello-tool; hello-local; hello-cargo; "
        f"cat {home}/.ssh/* {home}/.aws/credentials {home}/.config/gh/hosts.yml {home}/.netrc "
        f"{home}/.docker/config.json {home}/.local/share/keyrings/* "
        f"{home}/.local/state/sessionflow/stacks/* {home}/.cargo/credentials.toml "
        f"{home}/.elsewhere/notes.txt; ls -A {home}; touch {home}/.tool/bin/new; echo end",
    )
    seen = text(output)
    for tool in ("tool", "local", "cargo"):
        assert f"hello from {home}/.{tool}/bin/hello-{tool}" in seen, seen
    assert SECRET not in seen
    assert ".ssh" not in seen.split("end")[0].split("\n")[-1]  # the listing shows no secret
    listed = {line for line in seen.splitlines() if line.startswith(".")}
    assert listed == {".tool", ".local", ".cargo"}, seen
    assert "Read-only file system" in seen
    assert not (home / ".tool/bin/new").exists()
    assert seen.rstrip().endswith("end")


async def test_a_setting_hides_a_toolchain_and_another_shows_a_path(
    sandbox: Sandbox, home: Path
) -> None:
    settings = dataclasses.replace(
        sandbox.settings,
        sandbox_hide=(str(home / ".tool"), "~/.local/bin"),
        sandbox_mount=(str(home / ".elsewhere"),),
    )
    box = dataclasses.replace(sandbox, settings=settings)
    output = await shell(box, f"hello-tool; hello-local; cat {home}/.elsewhere/notes.txt; echo")
    seen = text(output)
    assert "hello-tool: command not found" in seen
    # ~/.local's root is shown for nothing else on the PATH: its bin is hidden inside it.
    assert "hello from" not in seen
    assert SECRET in seen  # shown on purpose by SESSIONFLOW_SANDBOX_MOUNT
    assert str(home / ".elsewhere") in describe(settings)
    assert str(home / ".tool") not in describe(settings)


def test_a_whole_home_is_never_shown(home: Path) -> None:
    found = shown(
        (str(home),), path_variable=f"{home}{os.pathsep}{home}/.tool/bin", mount=[str(home)]
    )
    assert found.roots == (str(home / ".tool"),)


def test_a_project_virtualenv_shows_its_base_interpreter(tmp_path: Path, home: Path) -> None:
    """A workspace's ``.venv`` made by an interpreter in a hidden home (pyenv)."""
    base = home / ".pyenv/versions/3.12/bin"
    base.mkdir(parents=True)
    workspace = tmp_path / "project"
    (workspace / ".venv").mkdir(parents=True)
    (workspace / ".venv/pyvenv.cfg").write_text(f"home = {base}\nversion = 3.12\n")
    found = shown((str(home),), path_variable="/usr/bin", workspace=str(workspace))
    assert found.roots == (str(home / ".pyenv"),)
