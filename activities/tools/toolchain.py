"""What of the worker's home the shell sandbox shows: the toolchains, never the secrets.

The sandbox hides every home directory (``sandbox.py``), but that is where toolchains live:
pyenv, a virtualenv, ``~/.local``, cargo, nvm, rustup. A command that cannot find the project's
interpreter or its test runner is no use to a coding agent, so the *roots* of the toolchains the
worker can run are bound back, read-only:

- each entry of the worker's ``PATH`` that lies in a hidden directory, as the directory directly
  under the home (or ``/tmp``) that holds it: ``~/.pyenv/versions/3.12/bin`` shows ``~/.pyenv``,
  ``~/.local/bin`` shows ``~/.local``;
- a virtualenv's base interpreter (``home`` in its ``pyvenv.cfg``), for a virtualenv on the
  ``PATH`` and for the workspace's own (``.venv``, ``venv``), wherever that interpreter is;
- the paths of ``SESSIONFLOW_SANDBOX_MOUNT``.

Inside what is shown, the secrets stay hidden (``SECRETS``, relative to each home: keys,
cloud and registry credentials, keyrings, sessionflow's own records) together with the paths of
``SESSIONFLOW_SANDBOX_HIDE``; a root that is itself a secret, or that would show a whole home,
is never shown. The worker logs what it shows at start (``describe``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Relative to a home directory: never shown, even inside a toolchain root that is.
SECRETS: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".yarnrc",
    ".password-store",
    ".terraform.d",
    ".config/gh",
    ".config/hub",
    ".config/gcloud",
    ".config/sessionflow",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".local/state/sessionflow",
)
# The workspace's own virtualenvs, whose base interpreter may live in a hidden home.
PROJECT_VENVS = (".venv", "venv")


def homes() -> tuple[str, ...]:
    """Every home directory the sandbox hides, as real paths: the worker's, root's, /home/*."""
    found = [os.path.expanduser("~"), "/root"]
    if os.path.isdir("/home"):
        found += [entry.path for entry in os.scandir("/home") if entry.is_dir()]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if os.path.isdir(p)))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _root(path: str, hidden: Sequence[str]) -> str | None:
    """The directory directly under the most specific hidden directory that holds ``path``,
    or None when nothing hides it (the sandbox shows it already) or it *is* a hidden one."""
    holders = [h for h in hidden if _inside(path, h)]
    if not holders:
        return None
    holder = max(holders, key=len)
    rest = path[len(holder) :].strip("/")
    return os.path.join(holder, rest.split("/")[0]) if rest else None


def venv_home(directory: str) -> str | None:
    """The real directory of a virtualenv's base interpreter (``pyvenv.cfg``'s ``home``)."""
    try:
        lines = Path(directory, "pyvenv.cfg").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return os.path.realpath(value.strip())
    return None


def _candidates(path_variable: str, workspace: str | None) -> Iterable[str]:
    """The real directories whose toolchain a command may run: the ``PATH``'s entries, the
    base interpreters of the virtualenvs among them and of the workspace's own."""
    for entry in path_variable.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        real = os.path.realpath(entry)
        if os.path.isdir(real):
            yield real
            home = venv_home(os.path.dirname(real))
            if home:
                yield home
    for name in PROJECT_VENVS if workspace else ():
        home = venv_home(os.path.join(str(workspace), name))
        if home:
            yield home


@dataclass(frozen=True)
class Shown:
    """What of the hidden directories one command sees: roots bound read-only, and inside
    them the secrets masked (files as empty, directories as empty and read-only)."""

    roots: tuple[str, ...] = ()
    masked_files: tuple[str, ...] = ()
    masked_dirs: tuple[str, ...] = ()


def shown(
    hidden: Sequence[str],
    *,
    path_variable: str | None = None,
    workspace: str | None = None,
    mount: Sequence[str] = (),
    hide: Sequence[str] = (),
) -> Shown:
    """The toolchain roots a command under ``hidden`` (tmpfs) directories sees, and the
    secrets masked in them. ``mount`` adds roots, ``hide`` removes roots or masks paths."""
    path_variable = os.environ.get("PATH", "") if path_variable is None else path_variable
    all_homes = homes()
    secrets = [os.path.realpath(os.path.join(h, s)) for h in all_homes for s in SECRETS]
    hidden_paths = [os.path.realpath(os.path.expanduser(p)) for p in hide]
    never = [*secrets, *hidden_paths]
    roots: list[str] = []
    for candidate in _candidates(path_variable, workspace):
        root = _root(candidate, [*hidden, *all_homes])
        if root and root not in roots and not any(_inside(root, n) for n in never):
            roots.append(root)
    for path in mount:
        real = os.path.realpath(os.path.expanduser(path))
        whole = real in all_homes or real in hidden or real == "/"
        if os.path.exists(real) and real not in roots and not whole:
            roots.append(real)
    files: list[str] = []
    dirs: list[str] = []
    for path in never:
        if not any(_inside(path, root) and path != root for root in roots):
            continue
        if os.path.isdir(path):
            dirs.append(path)
        elif os.path.exists(path):
            files.append(path)
    return Shown(tuple(roots), tuple(files), tuple(dirs))
