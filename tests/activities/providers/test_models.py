"""The model table and step cost (reference §4.6)."""

from __future__ import annotations

import pytest

from activities.providers.models import cost, is_reasoning, lookup, output_limit
from sessionflow.models.common import CacheTokens, ModelRef, Tokens


def ref(text: str) -> ModelRef:
    return ModelRef.parse(text)


def test_dated_snapshots_and_every_openai_adapter_share_an_entry() -> None:
    assert lookup(ref("openai/gpt-4o-2024-08-06")) == lookup(ref("openai-chat/gpt-4o"))
    assert lookup(ref("anthropic/claude-sonnet-4-5-20250929")) == lookup(
        ref("anthropic/claude-sonnet-4-5")
    )


def test_cost_bills_each_kind_of_token_at_its_price() -> None:
    tokens = Tokens(
        input=1_000_000, output=100_000, reasoning=50_000, cache=CacheTokens(read=200_000)
    )
    # gpt-5: 1.25 input, 10 output (reasoning too), 0.125 cache read, per million.
    assert cost(ref("openai/gpt-5"), tokens) == pytest.approx(1.25 + 1.5 + 0.025)


def test_cost_uses_the_long_context_tier_above_its_threshold() -> None:
    short = Tokens(input=100_000, output=1_000_000, cache=CacheTokens(write=100_000))
    long = Tokens(input=150_000, output=1_000_000, cache=CacheTokens(read=60_000))
    sonnet = ref("anthropic/claude-sonnet-4-5")
    assert cost(sonnet, short) == pytest.approx(0.3 + 15 + 0.375)
    assert cost(sonnet, long) == pytest.approx(0.9 + 22.5 + 0.036)


def test_an_unknown_model_works_with_unknown_cost() -> None:
    local = ref("openai-chat/llama3.1:8b")
    assert lookup(local) is None
    assert cost(local, Tokens(input=10, output=10)) == 0.0
    assert output_limit(local) == 8192
    assert not is_reasoning(local)
    assert is_reasoning(ref("openai/o3-pro")) and is_reasoning(ref("openai/gpt-5-nano"))
