"""Step costs (``activities/providers/prices.py``) against prices computed by hand from the
providers' published lists, a script's ``price`` block, and ``None`` for what has no price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.providers.prices import step_cost
from activities.providers.scripted import ScriptError, load_script
from activities.providers.settings import ProviderSettings
from sessionflow.models.common import CacheTokens, ModelRef, Tokens

ref = ModelRef.parse


def test_each_kind_of_token_is_billed_at_its_price() -> None:
    # gpt-5, per million: 1.25 input, 0.125 cached input, 10 output (reasoning too). Our
    # tokens keep cache reads out of input and reasoning out of output.
    tokens = Tokens(
        input=1_000_000, output=100_000, reasoning=50_000, cache=CacheTokens(read=200_000)
    )
    assert step_cost(ref("openai/gpt-5"), tokens) == pytest.approx(1.25 + 0.025 + 1.5)


def test_the_long_context_tier_applies_above_its_threshold() -> None:
    # claude-sonnet-4-5: 3 / 15 / 0.3 read / 3.75 write; above 200k prompt tokens
    # 6 / 22.5 / 0.6 read.
    sonnet = ref("anthropic/claude-sonnet-4-5")
    short = Tokens(input=100_000, output=1_000_000, cache=CacheTokens(write=100_000))
    long = Tokens(input=150_000, output=1_000_000, cache=CacheTokens(read=60_000))
    assert step_cost(sonnet, short) == pytest.approx(0.3 + 15 + 0.375)
    assert step_cost(sonnet, long) == pytest.approx(0.9 + 22.5 + 0.036)
    dated = ref("anthropic/claude-sonnet-4-5-20250929")
    assert step_cost(dated, short) == step_cost(sonnet, short)


def test_an_unknown_model_or_missing_usage_costs_null_never_zero() -> None:
    assert step_cost(ref("openai-chat/llama3.1:8b"), Tokens(input=10, output=10)) is None
    assert step_cost(ref("anthropic/claude-nonexistent-9"), Tokens(input=10)) is None
    assert step_cost(ref("openai/gpt-4o"), None) is None


def test_a_compatible_server_of_its_own_is_priced_only_by_its_url() -> None:
    tokens = Tokens(input=1_000_000)
    local = ProviderSettings(chat_base_url="http://127.0.0.1:11434/v1")
    assert step_cost(ref("openai-chat/gpt-4o"), tokens, local) is None
    # OpenAI's own adapters behind a gateway of theirs keep OpenAI's prices (2.5 / million).
    gateway = ProviderSettings(openai_base_url="http://127.0.0.1:9/v1")
    assert step_cost(ref("openai-chat/gpt-4o"), tokens, gateway) == pytest.approx(2.5)
    assert step_cost(ref("openai/gpt-4o"), tokens, gateway) == pytest.approx(2.5)


def _script(tmp_path: Path, **top: object) -> ModelRef:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**top, "turns": [{"events": [{"text": "hi"}]}]}))
    return ref(f"scripted/{path}")


def test_a_scripted_model_costs_what_its_script_declares(tmp_path: Path) -> None:
    price = {"input": 3.0, "output": 15.0, "cache_read": 0.3}
    model = _script(tmp_path, price=price)
    tokens = Tokens(input=1000, output=200, reasoning=100, cache=CacheTokens(read=4000))
    # Reasoning at the output price; no cache-write price declared: free.
    expected = (1000 * 3.0 + 300 * 15.0 + 4000 * 0.3) / 1_000_000
    assert step_cost(model, tokens) == pytest.approx(expected)
    assert step_cost(_script(tmp_path / "..", limits=None), tokens) is None


@pytest.mark.parametrize(
    ("price", "named"),
    [({"input": -1, "output": 1}, "input"), ({"input": 1, "ouput": 1}, "ouput")],
)
def test_a_bad_price_block_is_refused_naming_the_field(
    tmp_path: Path, price: dict[str, float], named: str
) -> None:
    model = _script(tmp_path, price=price)
    with pytest.raises(ScriptError) as raised:
        load_script(Path(model.id))
    assert "price" in str(raised.value) and named in str(raised.value)
