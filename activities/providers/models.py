"""The model table: context window, output limit, reasoning, and prices per million tokens.

A Python table rather than a data file so it ships with the package without packaging rules.
Keys are model ids shared by every provider that serves them (``openai/gpt-4o`` and
``openai-chat/gpt-4o`` cost the same); a ``<provider>/<id>`` key overrides one provider. A dated
snapshot (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) falls back to its undated key.
An unknown model still works: ``lookup`` returns ``None`` and ``cost`` returns 0.
"""

from __future__ import annotations

import re

from sessionflow.models.common import Model, ModelRef, Tokens

DEFAULT_OUTPUT_LIMIT = 8192


class Prices(Model):
    """USD per million tokens; reasoning tokens are billed at the output price."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


class Tier(Prices):
    """Prices that apply once the prompt (input plus cache tokens) exceeds ``above`` tokens."""

    above: int


class ModelInfo(Model):
    context: int
    output: int
    reasoning: bool = False
    cost: Prices
    tiers: tuple[Tier, ...] = ()


def _claude(input: float, output: float, *, out: int, long: bool = False) -> ModelInfo:
    # Anthropic bills cache reads at 0.1x and 5-minute cache writes at 1.25x the input price.
    prices = Prices(input=input, output=output, cache_read=input / 10, cache_write=input * 1.25)
    tiers: tuple[Tier, ...] = ()
    if long:
        tiers = (
            Tier(
                above=200_000,
                input=input * 2,
                output=output * 1.5,
                cache_read=input / 5,
                cache_write=input * 2.5,
            ),
        )
    return ModelInfo(context=200_000, output=out, reasoning=True, cost=prices, tiers=tiers)


def _openai(
    context: int, out: int, input: float, output: float, cached: float, *, reasoning: bool = False
) -> ModelInfo:
    prices = Prices(input=input, output=output, cache_read=cached)
    return ModelInfo(context=context, output=out, reasoning=reasoning, cost=prices)


MODELS: dict[str, ModelInfo] = {
    "gpt-4o": _openai(128_000, 16_384, 2.5, 10.0, 1.25),
    "gpt-4o-mini": _openai(128_000, 16_384, 0.15, 0.6, 0.075),
    "gpt-4.1": _openai(1_047_576, 32_768, 2.0, 8.0, 0.5),
    "gpt-4.1-mini": _openai(1_047_576, 32_768, 0.4, 1.6, 0.1),
    "o3": _openai(200_000, 100_000, 2.0, 8.0, 0.5, reasoning=True),
    "o4-mini": _openai(200_000, 100_000, 1.1, 4.4, 0.275, reasoning=True),
    "gpt-5": _openai(400_000, 128_000, 1.25, 10.0, 0.125, reasoning=True),
    "gpt-5-mini": _openai(400_000, 128_000, 0.25, 2.0, 0.025, reasoning=True),
    "claude-sonnet-4-5": _claude(3.0, 15.0, out=64_000, long=True),
    "claude-sonnet-4-0": _claude(3.0, 15.0, out=64_000, long=True),
    "claude-opus-4-1": _claude(15.0, 75.0, out=32_000),
    "claude-haiku-4-5": _claude(1.0, 5.0, out=64_000),
    "claude-3-5-haiku-latest": ModelInfo(
        context=200_000,
        output=8_192,
        cost=Prices(input=0.8, output=4.0, cache_read=0.08, cache_write=1.0),
    ),
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


def cost(model: ModelRef, tokens: Tokens) -> float:
    """USD for one step's normalized tokens (reference §4.6); 0 for an unknown model."""
    info = lookup(model)
    if info is None:
        return 0.0
    prices = _tier(info, tokens.input + tokens.cache.read + tokens.cache.write)
    total = (
        tokens.input * prices.input
        + (tokens.output + tokens.reasoning) * prices.output
        + tokens.cache.read * prices.cache_read
        + tokens.cache.write * prices.cache_write
    )
    return total / 1_000_000


def _tier(info: ModelInfo, prompt_tokens: int) -> Prices:
    """The tier with the largest threshold below the prompt size, else the untiered prices."""
    below = [tier for tier in info.tiers if tier.above < prompt_tokens]
    return max(below, key=lambda tier: tier.above) if below else info.cost
