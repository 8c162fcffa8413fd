"""The model table: windows, output limits, reasoning (prices: ``test_prices.py``)."""

from __future__ import annotations

from activities.providers.models import is_reasoning, lookup, output_limit
from sessionflow.models.common import ModelRef


def ref(text: str) -> ModelRef:
    return ModelRef.parse(text)


def test_dated_snapshots_and_every_openai_adapter_share_an_entry() -> None:
    assert lookup(ref("openai/gpt-4o-2024-08-06")) == lookup(ref("openai-chat/gpt-4o"))
    assert lookup(ref("anthropic/claude-sonnet-4-5-20250929")) == lookup(
        ref("anthropic/claude-sonnet-4-5")
    )


def test_an_unknown_model_works_with_default_limits() -> None:
    local = ref("openai-chat/llama3.1:8b")
    assert lookup(local) is None
    assert output_limit(local) == 8192
    assert not is_reasoning(local)
    assert is_reasoning(ref("openai/o3-pro")) and is_reasoning(ref("openai/gpt-5-nano"))
