"""``list``, ``glob`` and ``grep``: behaviour, caps and errors."""

from __future__ import annotations

import dataclasses

import pytest

from activities.tools.base import ToolFailure
from activities.tools.patterns import Glob
from tests.activities.tools.conftest import Sandbox, text


@pytest.fixture
def tree(sandbox: Sandbox) -> Sandbox:
    ws = sandbox.workspace
    for rel, body in {
        "README.md": "# readme\nTODO: write\n",
        "src/app.py": "import os\n\ndef main():\n    return 'TODO later'\n",
        "src/util.ts": "export const todo = 1;\n",
        "src/deep/er/x.py": "x = 1\n",
        "docs/guide.md": "todo: nothing\n",
        "bin.dat": "\x00\x01TODO\x00",
    }.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(body)
    (ws / "src" / "link.py").symlink_to("app.py")
    return sandbox


async def test_list_one_level_then_deeper(tree: Sandbox) -> None:
    top = text(await tree.call("list"))
    assert top.splitlines() == ["README.md", "bin.dat", "docs/", "src/"]
    deep = text(await tree.call("list", path="src", depth=3))
    assert deep.splitlines() == [
        "src/app.py",
        "src/deep/",
        "src/deep/er/",
        "src/deep/er/x.py",
        "src/link.py@",
        "src/util.ts",
    ]


async def test_list_errors_and_caps(tree: Sandbox) -> None:
    with pytest.raises(ToolFailure, match=r"README\.md is not a directory"):
        await tree.call("list", path="README.md")
    with pytest.raises(ToolFailure, match="nope does not exist"):
        await tree.call("list", path="nope")
    (tree.workspace / "empty").mkdir()
    assert text(await tree.call("list", path="empty")) == "(empty directory)"
    tree.settings = dataclasses.replace(tree.settings, list_entries=2)
    capped = await tree.call("list")
    assert text(capped).splitlines()[:2] == ["README.md", "bin.dat"]
    assert "results capped at 2" in text(capped) and capped.structured["truncated"]


async def test_list_stops_at_the_scan_budget(tree: Sandbox) -> None:
    tree.settings = dataclasses.replace(tree.settings, scan_entries=3)
    output = await tree.call("list", depth=5)
    assert "scan stopped after 3 entries" in text(output)


async def test_glob_matches_like_a_shell(tree: Sandbox) -> None:
    assert text(await tree.call("glob", pattern="**/*.py")).splitlines() == [
        "src/app.py",
        "src/deep/er/x.py",
        "src/link.py",
    ]
    assert text(await tree.call("glob", pattern="*.md")).splitlines() == ["README.md"]
    assert text(await tree.call("glob", pattern="*.{py,ts}", path="src")).splitlines() == [
        "src/app.py",
        "src/link.py",
        "src/util.ts",
    ]
    assert "No files match" in text(await tree.call("glob", pattern="*.rs"))
    with pytest.raises(ToolFailure, match="must be relative"):
        await tree.call("glob", pattern="../*")
    with pytest.raises(ToolFailure, match="must be relative"):
        await tree.call("glob", pattern="/etc/*")


async def test_glob_caps_results(tree: Sandbox) -> None:
    tree.settings = dataclasses.replace(tree.settings, glob_results=1)
    output = await tree.call("glob", pattern="**/*")
    assert len(text(output).splitlines()) == 2 and output.structured["truncated"]


async def test_grep_finds_lines_by_regex(tree: Sandbox) -> None:
    output = await tree.call("grep", pattern=r"TODO\b")
    assert text(output).splitlines() == [
        "README.md:2: TODO: write",
        "src/app.py:4:     return 'TODO later'",
        "[1 binary, oversized or hard-linked files skipped]",
    ]
    insensitive = await tree.call("grep", pattern="todo", ignore_case=True, include=["*.md"])
    assert text(insensitive).splitlines() == [
        "README.md:2: TODO: write",
        "docs/guide.md:1: todo: nothing",
    ]
    only_src = await tree.call("grep", pattern="=", include=["src/**/*.py"], path=".")
    assert text(only_src).splitlines() == ["src/deep/er/x.py:1: x = 1"]


async def test_grep_a_single_file_and_errors(tree: Sandbox) -> None:
    assert text(await tree.call("grep", pattern="main", path="src/app.py")) == (
        "src/app.py:3: def main():"
    )
    with pytest.raises(ToolFailure, match="Invalid regular expression"):
        await tree.call("grep", pattern="(unclosed")
    assert "No matches" in text(await tree.call("grep", pattern="zzz"))


async def test_grep_caps_matches(tree: Sandbox) -> None:
    (tree.workspace / "many.txt").write_text("hit\n" * 50)
    tree.settings = dataclasses.replace(tree.settings, grep_matches=5)
    output = await tree.call("grep", pattern="hit")
    assert output.structured["matches"] == 5 and "matches capped at 5" in text(output)


@pytest.mark.parametrize(
    ("pattern", "anchored", "path", "expected"),
    [
        ("*.py", False, "a/b/c.py", True),
        ("*.py", True, "a/b/c.py", False),
        ("**/*.py", True, "c.py", True),
        ("src/**", True, "src/a/b", True),
        ("a/*/c", True, "a/b/x/c", False),
        ("[!a]x", True, "bx", True),
        ("[!a]x", True, "ax", False),
        ("file?.txt", True, "file1.txt", True),
        ("{a,b}.md", True, "b.md", True),
        ("odd[", True, "odd[", True),
        (".env*", False, "deep/.env.prod", True),
    ],
)
def test_glob_patterns(pattern: str, anchored: bool, path: str, expected: bool) -> None:
    assert Glob(pattern, anchored=anchored).matches(path) is expected
