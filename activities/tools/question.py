"""``question``: the model asks the user something and waits for the answer.

The call waits like a permission ask (``run_tool`` returns it to the workflow, which waits on
the answer without holding a worker); the answer is the tool's result. A cancelled question
(rejected without an answer) interrupts the step (reference #65).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput


class QuestionInput(BaseModel):
    question: str = Field(min_length=1, max_length=4000, description="What to ask the user")
    options: list[str] = Field(
        default_factory=list, max_length=20, description="Answers to choose from, if any"
    )


class Question(Tool[QuestionInput]):
    name = "question"
    description = (
        "Ask the user a question and wait for the answer, when you cannot go on without "
        "their decision. Offer options when the answer is one of a few."
    )
    input_model = QuestionInput
    retry_safe = True
    asks_user = True

    async def execute(self, input: QuestionInput, context: ToolContext) -> ToolOutput:
        if context.answer is None:
            raise ToolFailure("The question was never answered")
        return ToolOutput.text(context.answer, answer=context.answer)
