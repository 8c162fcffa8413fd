"""The permission policy (``activities/permissions.py``) and agent files (``sessionflow/agents``):
last match wins, compound commands parsed with a real shell grammar, what cannot be parsed asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.permissions import always_pattern, denies_everything, evaluate, matches
from sessionflow.agents import BUILD, PLAN, Agents, load_agents
from sessionflow.models.permissions import Rule

BASH = [*BUILD.permissions, Rule(tool="bash", pattern="rm *", action="deny")]


def action(command: str, rules: list[Rule] = BASH) -> str:
    return evaluate("bash", {"command": command}, rules, "ask", "/ws").action


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("ls", "allow"),
        ("ls -la src", "allow"),
        ("git status && git diff | head -5", "allow"),
        ("cat a.txt 2>&1 | grep x > /dev/null", "allow"),
        ("if true; then ls; fi", "allow"),
        ("touch x", "ask"),
        ("ls; touch x", "ask"),
        ("ls && rm -rf x", "deny"),
        ("echo $(rm -rf x)", "deny"),
        ("cat `rm x`", "deny"),
        ("(cd sub && rm y)", "deny"),
        ("cat a > b", "ask"),  # allowed command, but it writes a file
        ("git diff --output=patch", "ask"),
        ("$cmd ls", "ask"),  # the command name is not a literal
        ("echo 'unterminated", "ask"),  # does not parse
        ("FOO=1 ls", "ask"),
        ("lsblk", "ask"),  # ``ls *`` is not ``ls*``
    ],
)
def test_compound_commands_need_every_part(command: str, expected: str) -> None:
    assert action(command) == expected


ALLOW_ALL = [Rule(tool="bash", pattern="*", action="allow")]
# Commands that write by redirection, each with what it runs (allowed by a narrow allow alone).
WRITERS = {
    "pytest > out.txt": "pytest",
    "pytest -q > out.txt 2>&1": "pytest -q",
    "cat a >> b": "cat a",
    ">b cat a": "cat a",
    "(cat a) > b": "(cat a)",
    "cat a | cat > b": "cat a | cat",
    "{ cat a; } > b": "{ cat a; }",
}


@pytest.mark.parametrize("command", [*WRITERS, "{ ls; } > b", "ls &> b"])
def test_a_catch_all_allow_lets_a_command_write_by_redirection(command: str) -> None:
    """Issue 32: ``allow *`` allowed everything but a redirect, which asked."""
    assert action(command, ALLOW_ALL) == "allow"


@pytest.mark.parametrize(("command", "runs"), WRITERS.items())
def test_a_narrow_allow_still_asks_before_a_redirect_writes(command: str, runs: str) -> None:
    """``cat *`` (the build agent's) or ``pytest *`` does not say the command may write: the
    README's rule. Redirections in front, on a subshell or a group count too."""
    rules = [*BASH, Rule(tool="bash", pattern="pytest *", action="allow")]
    assert action(command, rules) == "ask"
    assert action(runs, rules) == "allow"


def test_a_rule_naming_the_redirection_allows_it() -> None:
    rules = [*BASH, Rule(tool="bash", pattern="pytest *> out.txt", action="allow")]
    assert action("pytest -q > out.txt", rules) == "allow"
    assert action("pytest > out.txt", rules) == "allow"
    assert action("pytest > other.txt", rules) == "ask"


def test_ask_and_deny_rules_see_the_redirection() -> None:
    rules = [*ALLOW_ALL, Rule(tool="bash", pattern="*> .github/*", action="deny")]
    assert action("echo x > .github/ci.yml", rules) == "deny"
    assert action("echo x > ci.yml", rules) == "allow"
    assert action("rm -rf x > log", [*ALLOW_ALL, Rule(tool="bash", pattern="rm *", action="deny")])
    assert action("rm x > log", [*ALLOW_ALL, *BASH]) == "deny"
    # A narrow allow after the catch-all takes nothing away.
    narrow = Rule(tool="bash", pattern="cat *", action="allow")
    assert action("cat a > b", [*ALLOW_ALL, narrow]) == "allow"


def test_an_always_answer_to_a_redirect_allows_it_next_time() -> None:
    verdict = evaluate("bash", {"command": "pytest -q > out.txt 2>&1"}, BASH, "ask", "/ws")
    assert verdict.action == "ask" and verdict.patterns == ("pytest *> out.txt 2>&1",)
    rules = [*BASH, *(Rule(tool="bash", pattern=p, action="allow") for p in verdict.patterns)]
    assert action("pytest -x tests > out.txt 2>&1", rules) == "allow"
    assert action("pytest > elsewhere", rules) == "ask"


def test_the_last_matching_rule_wins() -> None:
    rules = [Rule(tool="bash", action="deny"), Rule(tool="bash", pattern="git *", action="allow")]
    assert action("git push", rules) == "allow" and action("make", rules) == "deny"
    assert action("git push", [*rules, Rule(tool="*", action="ask")]) == "ask"


def test_file_tools_match_the_workspace_relative_path() -> None:
    rules = [Rule(tool="write", pattern="src/*", action="deny")]
    for path in ("src/a.py", "/ws/src/a.py", "./src/deep/b.py"):
        assert evaluate("write", {"path": path}, rules, "allow", "/ws").action == "deny"
    assert evaluate("write", {"path": "docs/a.md"}, rules, "allow", "/ws").action == "allow"
    assert evaluate("read", {"path": "src/a.py"}, rules, "allow", "/ws").action == "allow"


def test_always_patterns() -> None:
    assert always_pattern("touch a b") == "touch *"
    assert always_pattern("git push origin main") == "git push *"
    assert always_pattern("git -C x status") == "git *"
    verdict = evaluate("bash", {"command": "ls && touch a; npm install x"}, BASH, "ask", "/")
    assert verdict.patterns == ("touch *", "npm install *")


def test_wildcards() -> None:
    assert matches("ls *", "ls") and matches("ls *", "ls -l") and not matches("ls *", "lsof")
    assert matches("git status*", "git status --short") and matches("*", "")


def test_plan_hides_write_and_edit() -> None:
    assert denies_everything(PLAN.permissions, "write")
    assert denies_everything(PLAN.permissions, "edit")
    assert not denies_everything(PLAN.permissions, "bash")
    partial = [Rule(tool="write", action="deny"), Rule(tool="write", pattern="a", action="allow")]
    assert not denies_everything(partial, "write")


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_agents_from_a_file(tmp_path: Path, suffix: str) -> None:
    file = tmp_path / f"agents{suffix}"
    if suffix == ".toml":
        file.write_text(
            'default = "reviewer"\n[agents.reviewer]\nsystem = "Review."\nmax_steps = 3\n'
            'permissions = [{ tool = "bash", pattern = "git *", action = "allow" }]\n'
        )
    else:
        file.write_text(
            '{"default": "reviewer", "agents": {"reviewer": {"system": "Review.", '
            '"max_steps": 3, "permissions": [{"tool": "bash", "pattern": "git *", '
            '"action": "allow"}]}}}'
        )
    agents = load_agents(file)
    assert agents.get(None).name == "reviewer" and agents.get(None).max_steps == 3
    assert agents.names() == ["build", "explore", "general", "plan", "reviewer"]


def test_a_bad_agents_file_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "agents.toml"
    file.write_text('default = "missing"\n')
    with pytest.raises(ValueError, match="Unknown agent 'missing'"):
        load_agents(file)
    file.write_text("[agents.x]\nmax_steps = 0\n")
    with pytest.raises(ValueError, match="Invalid agents file"):
        load_agents(file)
    assert Agents().get(None).name == "build"
