"""Agents: a name, a system prompt, an optional model, a step limit, tools and permission rules.

Built in:

- ``build`` (the default): every tool. The file tools are allowed (they never leave the
  workspace); ``bash`` asks, except for the read-only commands of ``READ_ONLY_COMMANDS``.
- ``plan``: read-only. ``write`` and ``edit`` are denied (and not offered to the model); ``bash``
  asks for everything.
- ``general`` (a subagent): every tool, for the ``task`` tool to delegate a multi-step job to.
- ``explore`` (a subagent): read-only, for searching a codebase; ``bash`` runs only the
  read-only commands and refuses the rest (a subagent has nobody at hand to ask).

``mode`` says where an agent may run: ``primary`` (a session's own agent), ``subagent`` (only
as a ``task`` call's child session) or ``all`` (either; the default of a custom agent).

Custom agents come from a TOML or JSON file named by ``SESSIONFLOW_AGENTS`` (or passed to the
worker and the client)::

    default = "reviewer"          # optional: the agent of a session that names none

    [agents.reviewer]
    system = "You review code. Never change it."
    model = "anthropic/claude-sonnet-4"   # optional override of the session's model
    max_steps = 20
    mode = "subagent"                      # optional: primary | subagent | all (the default)
    tools = ["read", "grep", "glob", "list", "bash"]   # optional: all when missing
    permissions = [{ tool = "bash", pattern = "git *", action = "allow" }]

A custom agent named like a built-in one replaces it. Rules of an agent come first; the
session's own and those ``always`` answers add go after them, so they win (last match).
"""

from __future__ import annotations

import json
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from sessionflow.errors import InvalidInputError
from sessionflow.models.common import Model
from sessionflow.models.permissions import Rule

DEFAULT_AGENT = "build"
# Reading commands: the build agent runs them without asking. ``find`` (``-exec``), ``sort``
# (``-o``) and ``tree`` (``-o``) can write or run things and are not here; a command writing a
# file by redirection asks whatever it is (``activities/permissions.py``).
READ_ONLY_COMMANDS = (
    "ls *",
    "cat *",
    "head *",
    "tail *",
    "wc *",
    "grep *",
    "rg *",
    "pwd",
    "true",
    "false",
    "echo *",
    "which *",
    "file *",
    "stat *",
    "du *",
    "git status *",
    "git diff *",
    "git log *",
    "git show *",
    "git branch",
    "git rev-parse *",
)
# Options of the allowed git commands that write a file.
_WRITING = ("git * --output*", "git * -o *")


class Agent(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    mode: Literal["primary", "subagent", "all"] = "all"
    system: str | None = None
    model: str | None = None
    max_steps: int | None = Field(default=None, ge=1)
    tools: tuple[str, ...] | None = None
    permissions: tuple[Rule, ...] = ()

    def offers(self, tool: str) -> bool:
        """Whether the agent offers ``tool``: its ``tools`` are names or wildcards (``git_*``)."""
        return self.tools is None or any(fnmatchcase(tool, entry) for entry in self.tools)

    @property
    def subagent(self) -> bool:
        """Whether a ``task`` call may run it as a child session."""
        return self.mode in ("subagent", "all")


BUILD = Agent(
    name="build",
    mode="primary",
    description="The default: every tool; bash asks except for read-only commands.",
    permissions=(
        Rule(tool="bash", pattern="*", action="ask"),
        *(Rule(tool="bash", pattern=p, action="allow") for p in READ_ONLY_COMMANDS),
        *(Rule(tool="bash", pattern=p, action="ask") for p in _WRITING),
    ),
)
PLAN = Agent(
    name="plan",
    mode="primary",
    description="Read-only: write, edit and apply_patch are denied, bash asks.",
    permissions=(
        Rule(tool="write", action="deny"),
        Rule(tool="edit", action="deny"),
        Rule(tool="apply_patch", action="deny"),
        Rule(tool="bash", action="ask"),
    ),
)

GENERAL = Agent(
    name="general",
    mode="subagent",
    description=(
        "A general-purpose agent for researching complex questions and running multi-step "
        "jobs; it has every tool."
    ),
    permissions=BUILD.permissions,
)
EXPLORE = Agent(
    name="explore",
    mode="subagent",
    description=(
        "A fast read-only agent for exploring a codebase: finding files by pattern, searching "
        "code for keywords, answering questions about it. It changes nothing."
    ),
    tools=("read", "list", "glob", "grep", "bash", "todoread"),
    permissions=(
        Rule(tool="bash", pattern="*", action="deny"),
        *(Rule(tool="bash", pattern=p, action="allow") for p in READ_ONLY_COMMANDS),
        *(Rule(tool="bash", pattern=p, action="deny") for p in _WRITING),
    ),
)
BUILT_IN = (BUILD, PLAN, GENERAL, EXPLORE)


class UnknownAgentError(InvalidInputError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"Unknown agent {name!r}: the agents are {', '.join(known)}")
        self.name = name


class Agents:
    """The agents a worker (or a client) knows, and the default one."""

    def __init__(self, custom: dict[str, Agent] | None = None, default: str = DEFAULT_AGENT):
        self.agents = {**{a.name: a for a in BUILT_IN}, **(custom or {})}
        self.default = default
        self.get(default)  # a default that does not exist is a configuration error

    def get(self, name: str | None) -> Agent:
        agent = self.agents.get(name or self.default)
        if agent is None:
            raise UnknownAgentError(name or self.default, sorted(self.agents))
        return agent

    def names(self) -> list[str]:
        return sorted(self.agents)

    def subagents(self) -> list[Agent]:
        """The agents a ``task`` call may start, by name."""
        return [self.agents[name] for name in self.names() if self.agents[name].subagent]


def load_agents(path: str | Path | None) -> Agents:
    """The built-ins plus the agents of a TOML or JSON file (none: the built-ins)."""
    if not path:
        return Agents()
    file = Path(path)
    try:
        text = file.read_text()
        data: dict[str, Any] = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as error:
        raise ValueError(f"Cannot read the agents file {file}: {error}") from None
    try:
        custom = {
            name: Agent.model_validate({**spec, "name": name})
            for name, spec in (data.get("agents") or {}).items()
        }
        return Agents(custom, default=data.get("default") or DEFAULT_AGENT)
    except (ValidationError, UnknownAgentError, TypeError) as error:
        raise ValueError(f"Invalid agents file {file}: {error}") from None
