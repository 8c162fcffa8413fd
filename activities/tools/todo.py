"""``todowrite`` and ``todoread``: the session's todo list, kept as events of the session.

Each ``todowrite`` replaces the whole list and records it as one ``session.todo.updated``
event, written in the same fenced transaction as the call's result: the list is exactly what
the last settled call wrote, whatever crashed meanwhile. ``todoread`` answers from the store.
A compaction carries the list verbatim into its summary (``render``), so progress survives it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from sessionflow.models.events import Todo, TodoUpdated

MAX_TODOS = 200
_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}


class TodoWriteInput(BaseModel):
    todos: list[Todo] = Field(
        description="The whole updated list: every item, in order (it replaces the old one).",
        max_length=MAX_TODOS,
    )


class TodoReadInput(BaseModel):
    pass


def render(todos: tuple[Todo, ...] | list[Todo]) -> str:
    """The list as the model and people read it: one line per item."""
    if not todos:
        return "The todo list is empty."
    done = sum(todo.status == "completed" for todo in todos)
    lines = [f"Todo list ({done}/{len(todos)} completed):"]
    lines += [f"{_MARK[t.status]} {t.content} ({t.priority})" for t in todos]
    return "\n".join(lines)


class TodoWrite(Tool[TodoWriteInput]):
    name = "todowrite"
    description = (
        "Write the session's todo list for a task of several steps: pass every item with its "
        "status (pending, in_progress, completed, cancelled) and priority. Keep one item "
        "in_progress at a time and mark items completed as soon as they are done."
    )
    input_model = TodoWriteInput
    retry_safe = True  # it replaces the list: writing it twice leaves the same list

    async def execute(self, input: TodoWriteInput, context: ToolContext) -> ToolOutput:
        todos = tuple(input.todos)
        updated = TodoUpdated(
            session_id=context.session_id,
            todos=todos,
            assistant_message_id=context.assistant_message_id,
            call_id=context.call_id,
        )
        output = ToolOutput.text(render(todos), todos=[t.model_dump() for t in todos])
        return ToolOutput(structured=output.structured, content=output.content, events=(updated,))


class TodoRead(Tool[TodoReadInput]):
    name = "todoread"
    description = "Read the session's todo list as it stands."
    input_model = TodoReadInput
    retry_safe = True

    async def execute(self, input: TodoReadInput, context: ToolContext) -> ToolOutput:
        if context.todos is None:
            raise ToolFailure("todoread runs only inside a session")
        todos = await context.todos()
        return ToolOutput.text(render(todos), todos=[t.model_dump() for t in todos])
