"""The registries, the tools' contracts and the step file helper."""

from __future__ import annotations

from activities.tools import testing
from activities.tools.builtin import builtin_registry, default_registry
from activities.tools.changes import changed, step_files
from sessionflow.models.common import SessionError
from sessionflow.models.messages import ToolCompleted, ToolError, ToolPart, ToolTimes

BUILTINS = [
    "read",
    "write",
    "edit",
    "apply_patch",
    "list",
    "glob",
    "grep",
    "bash",
    "question",
    "todowrite",
    "todoread",
]


def test_builtins_and_their_retry_safety() -> None:
    registry = builtin_registry()
    assert registry.names() == BUILTINS
    safe = {name for name in BUILTINS if registry.get(name).retry_safe}  # type: ignore[union-attr]
    assert safe == {"read", "list", "glob", "grep", "question", "todowrite", "todoread"}
    assert default_registry().names() == BUILTINS
    assert "echo" not in default_registry().names() and "echo" in testing.testing_registry().names()


def test_specs_show_the_model_a_schema() -> None:
    specs = {spec.name: spec for spec in builtin_registry().specs()}
    assert specs["edit"].input_schema["required"] == ["path", "old_string", "new_string"]
    assert set(specs["bash"].input_schema["properties"]) == {"command", "timeout", "description"}
    assert all(spec.description for spec in specs.values())


def _part(call_id: str, state: ToolCompleted | ToolError) -> ToolPart:
    return ToolPart(call_id=call_id, name="edit", time=ToolTimes(created=0), state=state)


def test_step_files_are_the_union_of_completed_output_paths() -> None:
    parts = [
        _part("a", ToolCompleted(output_paths=["src/b.py", "a.txt"])),
        _part("b", ToolCompleted(output_paths=["a.txt"])),
        _part("c", ToolError(error=SessionError(type="tool.execution", message="no"))),
    ]
    assert step_files(parts) == ("a.txt", "src/b.py")


def test_changed_sees_created_modified_and_deleted() -> None:
    before = {"same": (1, 1, 1, 1), "mod": (1, 1, 1, 1), "gone": (1, 1, 1, 1)}
    after = {"same": (1, 1, 1, 1), "mod": (1, 1, 2, 1), "new": (1, 1, 1, 1)}
    assert changed(before, after) == ("gone", "mod", "new")
