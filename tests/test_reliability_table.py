"""``docs/reliability.md``, the table users read, stays true to the catalogue and to the suite.

Every case of the reliability catalogue (``../shared/reference/reliability-catalogue.md``, outside
this repository, so its IDs are listed here) has exactly one row; a row's status is covered,
partial or missing; a covered or partial row names tests and a missing one names none; every
named test (``path::function``) exists, async or not, and carries the case ID in its docstring.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
TABLE = ROOT / "docs" / "reliability.md"

CATALOGUE = (
    *("F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F10"),
    *("C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "C10", "C11", "C12"),
    *("S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9", "S10", "S11", "S12"),
    *("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9"),
    *("D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8"),
)
STATUS = re.compile(r"(covered|partial|missing)\b")
NAMED = re.compile(r"`([^`]+?\.py)::(\w+)`")
NO_TEST = "—"


@dataclass(frozen=True)
class Row:
    line: int
    case: str
    tests: tuple[tuple[str, str], ...]
    leftover: str  # what the test cell holds besides named tests and separators
    status: str | None


def table_rows(text: str) -> list[Row]:
    """The rows of every table whose first column is ``ID``, header and rule lines skipped."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] in ("ID", "") or set(cells[0]) <= {"-", ":"}:
            continue
        tests_cell = cells[1] if len(cells) > 1 else ""
        status = STATUS.match(cells[4]) if len(cells) == 5 else None
        leftover = NAMED.sub("", tests_cell).replace("<br>", "").strip()
        found.append(
            Row(
                line=number,
                case=cells[0],
                tests=tuple(NAMED.findall(tests_cell)),
                leftover="" if leftover == NO_TEST else leftover,
                status=status.group(1) if status else None,
            )
        )
    return found


def docstrings(path: Path) -> dict[str, str]:
    """Every function of ``path``, at module level or in a class, async or not: its docstring."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name: ast.get_docstring(node) or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def problems(text: str, root: Path, catalogue: tuple[str, ...] = CATALOGUE) -> list[str]:
    """What is wrong with the table ``text``, whose named tests live under ``root``."""
    found: list[str] = []
    rows = table_rows(text)
    seen: dict[str, int] = {}
    parsed: dict[str, dict[str, str] | None] = {}
    for row in rows:
        where = f"line {row.line} ({row.case})"
        if row.case not in catalogue:
            found.append(f"{where}: {row.case} is not a catalogue ID")
        if row.case in seen:
            found.append(f"{where}: a second row for {row.case} (first at line {seen[row.case]})")
        seen.setdefault(row.case, row.line)
        if row.status is None:
            found.append(f"{where}: five cells, the last starting covered, partial or missing")
        elif row.status == "missing" and row.tests:
            found.append(f"{where}: a missing case names tests")
        elif row.status != "missing" and not row.tests:
            found.append(f"{where}: a {row.status} case names no test")
        if row.leftover:
            found.append(f"{where}: not a `path::function` in the test column: {row.leftover!r}")
        for path, function in row.tests:
            if path not in parsed:
                file = root / path
                parsed[path] = docstrings(file) if file.is_file() else None
            functions = parsed[path]
            if functions is None:
                found.append(f"{where}: {path} does not exist")
            elif function not in functions:
                found.append(f"{where}: {path} has no test {function}")
            elif not re.search(rf"\b{row.case}\b", functions[function]):
                found.append(f"{where}: the docstring of {path}::{function} lacks {row.case}")
    found += [f"{case} has no row" for case in catalogue if case not in seen]
    return found


def test_the_catalogue_has_its_51_cases() -> None:
    assert len(CATALOGUE) == len(set(CATALOGUE)) == 51
    families = {family: sum(c[0] == family for c in CATALOGUE) for family in "FCSPD"}
    assert families == {"F": 10, "C": 12, "S": 12, "P": 9, "D": 8}


def test_every_case_has_one_row_naming_tests_that_exist() -> None:
    assert problems(TABLE.read_text(), ROOT) == []


def test_a_broken_table_is_reported(tmp_path: Path) -> None:
    """Negative control: a hand-made table with each kind of mistake, over a hand-made suite."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'async def test_async():\n    """F1: an async test."""\n\n\n'
        'def test_sync():\n    """Catalogue F2."""\n\n\n'
        "def test_untagged():\n    pass\n"
    )
    good = {
        "F1": "`tests/test_x.py::test_async`",
        "F2": "`tests/test_x.py::test_sync`",
    }
    lines = ["| ID | Test(s) | Injects | Asserts | Status |", "|---|---|---|---|---|"]
    for case in ("F1", "F2", "F3"):
        status = "missing" if case not in good else "covered"
        lines.append(f"| {case} | {good.get(case, NO_TEST)} | x | y | {status} |")
    clean = "\n".join(lines)
    catalogue = ("F1", "F2", "F3")
    assert problems(clean, tmp_path, catalogue) == []

    broken = "\n".join(
        [
            *lines[:2],
            lines[2],  # F1 is fine; F2 and F3 have no row
            "| F1 | `tests/test_x.py::test_sync` | x | y | partial: the same case again |",
            "| F9 | `tests/test_x.py::test_no_such_test` | x | y | covered |",
            "| F1 | `tests/test_gone.py::test_async` | x | y | covered |",
            "| F1 | `tests/test_x.py::test_untagged` | x | y | covered |",
            "| F1 | tests/test_x.py::test_async | x | y | covered |",
            "| F1 | `tests/test_x.py::test_async` | x | y | missing |",
            "| F1 | — | x | y | unknown |",
        ]
    )
    found = problems(broken, tmp_path, catalogue)
    expected = [
        "F2 has no row",
        "F3 has no row",
        "F9 is not a catalogue ID",
        "tests/test_x.py has no test test_no_such_test",
        "tests/test_gone.py does not exist",
        "the docstring of tests/test_x.py::test_untagged lacks F1",
        "the docstring of tests/test_x.py::test_sync lacks F1",
        "a second row for F1",
        "a covered case names no test",
        "not a `path::function` in the test column",
        "a missing case names tests",
        "the last starting covered, partial or missing",
    ]
    for problem in expected:
        assert any(problem in line for line in found), (problem, found)
