"""Compaction (reference §4.9): when to compact, what to summarize, and the summary request.

Sizes are estimates in tokens: the last step's reported usage (input, cache and output: what
the provider itself counted for the request before) plus the text added since at four
characters a token. Four is the usual rule of thumb for English and code with BPE tokenizers;
it errs large for code-heavy text, which is the safe side for a window check.
"""

from __future__ import annotations

import math

from activities.history import to_request_messages
from activities.providers import base as p
from sessionflow.models.common import CompactionSettings, Limits, ModelRef
from sessionflow.models.messages import AssistantMessage, CompactionMessage, Message

CHARS_PER_TOKEN = 4
SUMMARY_CAP = 4096  # output tokens a summary may take at most
SUMMARY_SYSTEM = (
    "You summarize a coding session so that it can continue from the summary alone. "
    "Answer with the summary only."
)
SECTIONS = (
    "Use these sections: ## Objective, ## Progress (what was done, with file paths), "
    "## Decisions, ## Open questions, ## Next steps. Keep exact names, paths, commands and "
    "error texts; drop chatter."
)
FIRST_PROMPT = "Create a new anchored summary of the conversation below. " + SECTIONS
UPDATE_PROMPT = (
    "Update the anchored summary below with the conversation that followed it: keep what "
    "still holds, replace what changed, add what is new. " + SECTIONS
)


def tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def render(messages: list[Message], model: ModelRef) -> str:
    """History as plain text, one ``[Role]: text`` block per provider message."""
    blocks = []
    for message in to_request_messages(messages, model):
        role = {"user": "User", "assistant": "Assistant", "tool": "Tool", "system": "System"}
        parts = [_part_text(part) for part in message.content]
        blocks.append(f"[{role.get(message.role, message.role)}]: " + "\n".join(parts))
    return "\n\n".join(blocks)


def _part_text(part: object) -> str:
    if isinstance(part, p.TextPartIn | p.ReasoningPartIn):
        return part.text
    if isinstance(part, p.ToolCallPartIn):
        return f"(calls {part.name} with {part.input})"
    if isinstance(part, p.ToolResultPartIn):
        return f"({part.name} returned {'an error: ' if part.is_error else ''}{part.output})"
    return "(an attachment)"


def estimate(history: list[Message], model: ModelRef, added: str = "", overhead: int = 0) -> int:
    """The next request's size: the last reported usage plus what came after it. Without a
    reported usage, the whole history plus ``overhead`` (the system prompt and the tool
    definitions, which a reported input count already includes)."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, AssistantMessage) and message.tokens is not None:
            t = message.tokens
            used = t.input + t.cache.read + t.cache.write + t.output + t.reasoning
            if used:
                since = render(history[index + 1 :], model)
                return used + tokens(since) + tokens(added)
    return tokens(render(history, model)) + tokens(added) + overhead


def free_buffer(limits: Limits, settings: CompactionSettings) -> int:
    """Tokens kept free: the setting, clamped to a quarter of a small window."""
    return min(settings.buffer, limits.context // 4)


def over_limit(size: int, limits: Limits, settings: CompactionSettings) -> bool:
    return size > limits.context - max(limits.output, free_buffer(limits, settings))


def keep_tokens(limits: Limits | None, settings: CompactionSettings) -> int:
    if settings.keep_tokens is not None:
        return settings.keep_tokens
    return limits.context // 4 if limits is not None else 8000


def split(
    history: list[Message], model: ModelRef, keep: int
) -> tuple[CompactionMessage | None, list[Message], list[Message]]:
    """(previous checkpoint, head to summarize, recent tail kept verbatim).

    A message is the unit: an assistant message holds its tool calls and their results, so a
    call is never split from its result.
    """
    first = history[0] if history else None
    previous = (
        first if isinstance(first, CompactionMessage) and first.status == "completed" else None
    )
    rest: list[Message] = [m for m in history if not isinstance(m, CompactionMessage)]
    while rest and isinstance(rest[-1], AssistantMessage) and rest[-1].time_completed is None:
        rest.pop()  # the step being retried (after an overflow) is not history yet
    cut, kept = len(rest), 0
    while cut > 1:  # at least the oldest message is summarized
        size = tokens(render([rest[cut - 1]], model))
        if kept + size > keep:
            break
        kept, cut = kept + size, cut - 1
    return previous, rest[:cut], rest[cut:]


def summary_prompt(previous: CompactionMessage | None, head: str) -> str:
    if previous is None:
        return f"{FIRST_PROMPT}\n\n<conversation>\n{head}\n</conversation>"
    earlier = f"{previous.recent}\n\n{head}" if previous.recent else head
    return (
        f"{UPDATE_PROMPT}\n\n<previous-summary>\n{previous.summary}\n</previous-summary>\n\n"
        f"<conversation>\n{earlier}\n</conversation>"
    )


def summary_limit(limits: Limits | None) -> int:
    """Half the output limit (capped): the other half leaves room for the summary prompt's own
    words, since the history it summarizes is already about as large as the window allows."""
    return min(limits.output // 2, SUMMARY_CAP) if limits is not None else SUMMARY_CAP


def fits(prompt: str, limits: Limits | None) -> bool:
    """Whether the summary request itself fits the window (unknown limits: assume it does)."""
    if limits is None:
        return True
    return tokens(SUMMARY_SYSTEM) + tokens(prompt) + summary_limit(limits) <= limits.context
