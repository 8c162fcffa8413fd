"""The model table: context window, output limit and whether a model reasons (prices come from
``genai-prices``, ``prices.py``).

A Python table rather than a data file so it ships with the package without packaging rules.
Keys are model ids shared by every provider that serves them (``openai/gpt-4o`` and
``openai-chat/gpt-4o`` share a window); a ``<provider>/<id>`` key overrides one provider. A dated
snapshot (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) falls back to its undated key.
An unknown model still works: ``lookup`` returns ``None``.
"""

from __future__ import annotations

import re

from sessionflow.models.common import Model, ModelRef

DEFAULT_OUTPUT_LIMIT = 8192


class ModelInfo(Model):
    context: int
    output: int
    reasoning: bool = False


def _claude(*, out: int) -> ModelInfo:
    return ModelInfo(context=200_000, output=out, reasoning=True)


def _openai(context: int, out: int, *, reasoning: bool = False) -> ModelInfo:
    return ModelInfo(context=context, output=out, reasoning=reasoning)


MODELS: dict[str, ModelInfo] = {
    "gpt-4o": _openai(128_000, 16_384),
    "gpt-4o-mini": _openai(128_000, 16_384),
    "gpt-4.1": _openai(1_047_576, 32_768),
    "gpt-4.1-mini": _openai(1_047_576, 32_768),
    "o3": _openai(200_000, 100_000, reasoning=True),
    "o4-mini": _openai(200_000, 100_000, reasoning=True),
    "gpt-5": _openai(400_000, 128_000, reasoning=True),
    "gpt-5-mini": _openai(400_000, 128_000, reasoning=True),
    "claude-sonnet-4-5": _claude(out=64_000),
    "claude-sonnet-4-0": _claude(out=64_000),
    "claude-opus-4-1": _claude(out=32_000),
    "claude-haiku-4-5": _claude(out=64_000),
    "claude-3-5-haiku-latest": ModelInfo(context=200_000, output=8_192),
}

_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
# Families that reason even when they are not in the table (o1, o3-pro, gpt-5-nano, codex...).
_REASONING_FAMILIES = re.compile(r"^(o\d|gpt-5|codex)")


def lookup(model: ModelRef) -> ModelInfo | None:
    for key in (f"{model.provider_id}/{model.id}", model.id, _DATE_SUFFIX.sub("", model.id)):
        info = MODELS.get(key)
        if info is not None:
            return info
    return None


def is_reasoning(model: ModelRef) -> bool:
    info = lookup(model)
    return info.reasoning if info is not None else bool(_REASONING_FAMILIES.match(model.id))


def output_limit(model: ModelRef) -> int:
    info = lookup(model)
    return info.output if info is not None else DEFAULT_OUTPUT_LIMIT
