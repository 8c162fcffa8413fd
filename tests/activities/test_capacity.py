"""Provider keys and limits for the rate governor (``activities/capacity.py``)."""

from __future__ import annotations

import pytest

from activities.capacity import Capacity, parse_limits
from activities.providers.settings import ProviderSettings
from sessionflow.models.common import ModelRef
from store.governor import RateLimits

ref = ModelRef.parse


def test_a_key_names_the_endpoint_never_the_api_key() -> None:
    capacity = Capacity(settings=ProviderSettings(openai_api_key="sk-secret-1"))
    key = capacity.key(ref("openai/gpt-4o"))
    assert key is not None and key.startswith("openai@api.openai.com:")
    assert "sk-secret" not in key
    # Both OpenAI adapters on one endpoint and key draw on one capacity.
    assert capacity.key(ref("openai-chat/gpt-4o")) == key
    other = Capacity(settings=ProviderSettings(openai_api_key="sk-secret-2"))
    assert other.key(ref("openai/gpt-4o")) != key
    assert capacity.key(ref("scripted/model.json")) is None


def test_limits_come_by_provider_and_openai_chat_falls_back() -> None:
    limits = parse_limits('{"openai": {"rpm": 500, "streams": 4}, "anthropic": {"tpm": 9}}')
    capacity = Capacity(limits=limits)
    assert capacity.limits_for(ref("openai-chat/x")) == RateLimits(rpm=500, streams=4)
    assert capacity.limits_for(ref("anthropic/claude")) == RateLimits(tpm=9)
    assert parse_limits("") == {}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "not JSON"),
        ("[1]", "an object by provider"),
        ('{"openai": {"rps": 3}}', "takes rpm, tpm and streams"),
        ('{"openai": {"rpm": 0}}', "whole number above 0"),
        ('{"openai": {"rpm": 2.5}}', "whole number above 0"),
    ],
)
def test_a_bad_setting_names_the_variable_and_the_part(text: str, named: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_limits(text)
    assert "SESSIONFLOW_RATE_LIMITS" in str(raised.value) and named in str(raised.value)
