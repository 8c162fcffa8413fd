"""Provider keys and limits for the rate governor (``activities/capacity.py``)."""

from __future__ import annotations

import pytest

from activities.capacity import Capacity, parse_limits
from activities.providers.settings import ProviderSettings
from activities.turn import closes_key_for
from sessionflow.models.common import ModelRef, SessionError
from sessionflow.models.drain import TurnResult
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


def _answered(error: SessionError | None, retry_after_ms: int | None = None) -> TurnResult:
    return TurnResult(
        assistant_message_id="msg_a", step=1, raw_error=error, retry_after_ms=retry_after_ms
    )


def test_429_529_and_any_retry_after_close_the_key_for_every_session() -> None:
    limited = SessionError(type="provider.rate-limit", message="slow down", status=429)
    overloaded = SessionError(type="provider.internal", message="Overloaded", status=529)
    broken = SessionError(type="provider.internal", message="Bad gateway", status=502)
    assert closes_key_for(_answered(limited, 3000), 200) == 3000
    assert closes_key_for(_answered(limited), 200) == 200
    assert closes_key_for(_answered(overloaded), 200) == 200  # no Retry-After: the backoff
    assert closes_key_for(_answered(overloaded, 1500), 200) == 1500
    assert closes_key_for(_answered(broken, 700), 200) == 700
    assert closes_key_for(_answered(broken), 200) is None  # one session's bad luck
    assert closes_key_for(_answered(None), 200) is None
