"""``task``: delegate a job to a subagent, which runs it as a child session.

The call creates a child session (the same workspace, ``parent_id`` = the caller) running the
named subagent, admits the prompt there and waits for the child's busy period to end; its
final answer is the call's result, with the child's id to continue it later (``task_id``).
The work is not done here but by ``activities/children.py`` (the store and the child's
workflow); this module says what the model sees: the input, the description naming the
subagents, and how a child's answer reads.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from sessionflow.agents import Agents

DEFAULT_MAX_DEPTH = 3


class TaskInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str = Field(description="A short (3-5 words) description of the task")
    prompt: str = Field(description="The task for the agent to perform", min_length=1)
    subagent_type: str = Field(description="The type of specialized agent to use for this task")
    task_id: str | None = Field(
        default=None,
        description=(
            "Set only to continue an earlier task: the task_id it returned. The child session "
            "goes on from where it stopped, with this prompt."
        ),
    )
    background: bool = Field(
        default=False,
        description=(
            "Run the task in the background: the call returns at once with its task_id, and "
            "the result arrives later as a message."
        ),
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Interrupt the task if it has not finished after this many seconds.",
    )


class Task(Tool[TaskInput]):
    name = "task"
    input_model = TaskInput
    # Starting a child is idempotent (its id and its prompt's id come from the call), so a
    # retried attempt finds the child the first one made instead of making a second.
    retry_safe = True

    def __init__(self, agents: Agents, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.agents = agents
        self.max_depth = max_depth
        listed = "\n".join(
            f"- {agent.name}: {agent.description or 'no description'}"
            for agent in agents.subagents()
        )
        self.description = (
            "Launch a subagent to handle a complex, multi-step job on its own. It runs as a "
            "child session in the same workspace and answers once, with its final message; "
            "run several at once for independent jobs. The subagents:\n"
            f"{listed}\n"
            "Tell the subagent everything it needs: it sees only your prompt. Its answer is "
            "for you, not the user: pass on what matters."
        )

    async def execute(self, input: TaskInput, context: ToolContext) -> ToolOutput:
        raise ToolFailure("The task tool runs through its session's workflow, not on its own")


def child_session_id(parent_id: str, assistant_message_id: str, call_id: str) -> str:
    """The child of one call: the same id whichever attempt starts it."""
    return f"ses_{_digest(parent_id, assistant_message_id, call_id)}"


def prompt_input_id(child_id: str, assistant_message_id: str, call_id: str) -> str:
    """The id of the prompt one call admits to its child (a follow-up call admits another)."""
    return f"msg_{_digest(child_id, assistant_message_id, call_id)}"


def background_result_id(child_id: str, assistant_message_id: str, call_id: str) -> str:
    """The message a child's answer to one call becomes in its parent, when no call waits
    for it (a background call, or one a recovery closed): once per call."""
    return f"msg_{_digest('job', child_id, assistant_message_id, call_id)}"


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:26]


def answer_text(child_id: str, answer: str) -> str:
    """How a finished child's answer reads to the model that asked for it."""
    body = answer.strip() or "(the subagent ended without a final message)"
    return (
        f"task_id: {child_id} (pass it as task_id to continue this task)\n\n"
        f"<task_result>\n{body}\n</task_result>"
    )
