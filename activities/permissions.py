"""The permission policy: what a tool call may do before anything runs (``run_tool``).

Rules (``sessionflow.models.permissions.Rule``) come from the agent, then the session's own,
then the ones ``always`` answers added; the last rule that matches wins, and a call no rule
matches gets its tool's default (``Tool.permission``). Patterns are wildcards: ``*`` is any
text, ``?`` one character; a pattern ending in `` *`` also matches without it (``ls *``
matches ``ls``). A file tool's pattern is matched against the workspace-relative path it
names; a bash pattern against each simple command.

A shell command is parsed with tree-sitter's bash grammar, never split as a string: every
simple command in it -- in a list, a pipeline, a subshell, a ``$(...)`` or backquotes, an
``if`` -- must be allowed for the whole to be. Any deny denies it; otherwise any ask asks.
A command that does not parse, or whose name is not a literal word (``$cmd``), asks.

A command that writes a file by redirection (``cat a > b``, also ``>b cat a``, ``(cat a) > b``,
``cat a | cat > b``) is matched with its redirections (``cat a > b``), and an ``allow`` counts
for it only from a rule that says it may write: one whose pattern names a redirection (has a
``>``: ``pytest *> out.txt``) or allows any command at all (``*``). A narrower allow
(``cat *``) leaves it asking, so a read-only allow list does not become a way to write; ``ask``
and ``deny`` rules apply to it with or without its redirections.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from sessionflow.models.permissions import Action, Rule

FILE_TOOLS = frozenset({"read", "write", "edit", "list", "glob", "grep"})
# Commands whose second word picks what they do: ``always`` allows ``git diff *``, not ``git *``.
SUBCOMMANDS = frozenset(
    {"git", "npm", "pnpm", "yarn", "cargo", "go", "pip", "uv", "docker", "kubectl", "make"}
)
_WRITES = frozenset({">", ">>", "&>", "&>>", ">|"})
_REDIRECTS = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
_SUBSTITUTIONS = frozenset({"command_substitution", "process_substitution"})
_SUMMARY = 200
_RANK: dict[Action, int] = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True)
class Verdict:
    action: Action
    # The allow patterns an ``always`` answer adds (the parts that asked).
    patterns: tuple[str, ...] = ()
    summary: str = ""
    # What was denied, for the model's error.
    denied: str = ""


@dataclass(frozen=True)
class Simple:
    """One simple command: its text, whether its name is a literal word, whether it writes a
    file by redirection."""

    text: str
    literal: bool = True
    writes: bool = False
    # The command with the redirections that apply to it (``cat a > b``), when it writes.
    redirected: str = ""


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    if pattern.endswith(" *"):
        body = body[: -len(re.escape(" ")) - 2] + "(?: .*)?"
    return re.compile(body, re.DOTALL)


def matches(pattern: str, text: str) -> bool:
    return _regex(pattern).fullmatch(text) is not None


def decide(rules: Iterable[Rule], tool: str, subject: str, default: Action) -> Action:
    """The last rule matching ``tool`` and ``subject`` wins; none: ``default``."""
    action = default
    for rule in rules:
        if matches(rule.tool, tool) and matches(rule.pattern, subject):
            action = rule.action
    return action


def denies_everything(rules: Iterable[Rule], tool: str) -> bool:
    """Whether the rules deny every call of ``tool`` (it is then not offered to the model)."""
    last: str | None = None
    for rule in rules:
        if not matches(rule.tool, tool):
            continue
        if rule.pattern == "*":
            last = rule.action
        elif rule.action != "deny":
            last = "some"  # some calls get through
    return last == "deny"


def evaluate(
    tool: str, tool_input: dict[str, Any], rules: list[Rule], default: Action, workspace: str
) -> Verdict:
    if tool == "bash":
        return _shell(str(tool_input.get("command", "")), rules, default)
    subject = _subject(tool, tool_input, workspace)
    action = decide(rules, tool, subject, default)
    return Verdict(action, (subject,) if subject else ("*",), _clip(f"{tool} {subject}"), subject)


def _subject(tool: str, tool_input: dict[str, Any], workspace: str) -> str:
    if tool not in FILE_TOOLS:
        return ""
    path = str(tool_input.get("path") or ".")
    if os.path.isabs(path):
        root = os.path.realpath(workspace)
        for base in (workspace, root):
            if path == base or path.startswith(base.rstrip("/") + "/"):
                path = os.path.relpath(path, base)
                break
    return posixpath.normpath(path).removeprefix("./")


def _shell(command: str, rules: list[Rule], default: Action) -> Verdict:
    summary = _clip(command)
    commands = shell_commands(command)
    if commands is None:
        return Verdict("ask" if default != "deny" else "deny", (), summary, command)
    if not commands:  # nothing but assignments or comments
        commands = [Simple(command.strip())]
    worst: Action = "allow"
    asked: list[str] = []
    denied = ""
    for simple in commands:
        if simple.writes:
            action = _decide_write(rules, simple, default)
        else:
            action = decide(rules, "bash", simple.text, default)
        if action == "allow" and not simple.literal:
            action = "ask"
        if action == "ask":
            asked.append(always_pattern(simple.text, simple.redirected))
        if action == "deny" and not denied:
            denied = simple.text
        worst = max(worst, action, key=_RANK.__getitem__)
    return Verdict(worst, tuple(dict.fromkeys(asked)), summary, denied)


def writes_anything(pattern: str) -> bool:
    """Whether an allow rule with ``pattern`` lets a command write by redirection: it names a
    redirection, or it allows every command anyway."""
    return ">" in pattern or set(pattern) <= {"*"}


def _decide_write(rules: Iterable[Rule], simple: Simple, default: Action) -> Action:
    """``decide`` for a command that writes by redirection: the last matching rule wins, but
    an allow that does not cover writing (``writes_anything``) asks unless a covering allow
    before it already allowed the command."""
    full = simple.redirected or simple.text
    action: Action = "ask" if default == "allow" else default
    for rule in rules:
        if not matches(rule.tool, "bash"):
            continue
        if rule.action == "allow" and writes_anything(rule.pattern):
            if matches(rule.pattern, full):
                action = "allow"
        elif matches(rule.pattern, simple.text) or matches(rule.pattern, full):
            action = rule.action if rule.action != "allow" or action == "allow" else "ask"
    return action


def always_pattern(command: str, redirected: str = "") -> str:
    """The allow rule an ``always`` answer adds for one simple command: its name (and its
    subcommand, for the tools in ``SUBCOMMANDS``) followed by anything, and the redirections
    of one that writes (``pytest *> out.txt``), so that the answer allows what it was asked."""
    words = command.split()
    if not words:
        return command
    head = (
        words[:2]
        if words[0] in SUBCOMMANDS and len(words) > 1 and words[1][:1] != "-"
        else words[:1]
    )
    suffix = redirected[len(command) :].strip() if redirected.startswith(command) else ""
    return " ".join(head) + (f" *{suffix}" if suffix else " *")


@functools.cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


def shell_commands(command: str) -> list[Simple] | None:
    """Every simple command in ``command``, in order; None when it does not parse."""
    tree = _parser().parse(command.encode())
    if tree.root_node.has_error:
        return None
    return list(_simple(tree.root_node))


def _simple(node: Node) -> Iterator[Simple]:
    if node.type == "command":
        name = node.child_by_field_name("name")
        literal = name is not None and all(c.type == "word" for c in name.children)
        redirects = _redirects(node)
        writes = any(_writes(redirect) for redirect in redirects)
        text = _text(node, skip=redirects)
        outer = " ".join(_text(r) for r in redirects)
        yield Simple(text, literal, writes, f"{text} {outer}" if writes else "")
    for child in node.children:
        yield from _simple(child)


def _redirects(command: Node) -> list[Node]:
    """The redirections that apply to ``command``: its own (``>b cat a``) and those of every
    statement around it (``(cat a) > b``, ``{ …; } > b``, ``a | b > c``), up to the
    ``$(…)`` or ``<(…)`` it is in, whose output goes elsewhere."""
    found: list[Node] = []
    node: Node | None = command
    while node is not None and node.type not in _SUBSTITUTIONS:
        found += [c for c in node.children if c.type in _REDIRECTS]
        node = node.parent
    return found


def _writes(redirect: Node) -> bool:
    if redirect.type != "file_redirect":
        return False
    operator = next((c for c in redirect.children if not c.is_named), None)
    target = redirect.child_by_field_name("destination") or redirect.children[-1]
    op = _text(operator) if operator is not None else ""
    where = _text(target)
    if where == "/dev/null":
        return False
    return op in _WRITES or (op == ">&" and not where.isdigit() and where != "-")


def _text(node: Node, skip: Iterable[Node] = ()) -> str:
    """The node's source with whitespace collapsed, without the child nodes in ``skip`` (a
    command's own redirections, which belong with the others in ``Simple.redirected``)."""
    raw = node.text or b""
    for child in sorted(skip, key=lambda c: c.start_byte, reverse=True):
        if child.parent == node:
            start, end = child.start_byte - node.start_byte, child.end_byte - node.start_byte
            raw = raw[:start] + raw[end:]
    return " ".join(raw.decode(errors="replace").split())


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY else text[: _SUMMARY - 1] + "…"
