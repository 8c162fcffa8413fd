"""Provider settings from the environment, and which adapter serves which reference."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.providers.anthropic_messages import AnthropicProvider
from activities.providers.openai_chat import OpenAIChatProvider
from activities.providers.openai_responses import OpenAIResponsesProvider
from activities.providers.registry import environment_settings, make_provider
from activities.providers.scripted import ScriptedProvider
from activities.providers.settings import PLACEHOLDER_KEY, ProviderSettings
from activities.runtime import default_providers
from sessionflow.models.common import ModelRef


def test_reads_every_variable() -> None:
    env = {
        "OPENAI_API_KEY": "sk-1",
        "OPENAI_BASE_URL": "https://gateway/v1",
        "SESSIONFLOW_OPENAI_CHAT_BASE_URL": "http://localhost:11434/v1",
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_BASE_URL": "https://anthropic.proxy",
        "SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT": "3",
        "SESSIONFLOW_PROVIDER_READ_TIMEOUT": "120.5",
        "SESSIONFLOW_MAX_OUTPUT_TOKENS": "4096",
        "SESSIONFLOW_ANTHROPIC_THINKING_BUDGET": "2048",
        "SESSIONFLOW_REASONING_EFFORT": "high",
        "SESSIONFLOW_WEB_SEARCH": "1",
    }
    assert ProviderSettings.from_env(env) == ProviderSettings(
        openai_api_key="sk-1",
        openai_base_url="https://gateway/v1",
        chat_base_url="http://localhost:11434/v1",
        anthropic_api_key="sk-ant",
        anthropic_base_url="https://anthropic.proxy",
        connect_timeout_s=3.0,
        read_timeout_s=120.5,
        max_output_tokens=4096,
        anthropic_thinking_budget=2048,
        reasoning_effort="high",
        web_search=True,
    )
    assert ProviderSettings.from_env({}) == ProviderSettings()


def test_chat_endpoint_falls_back_to_openai_and_needs_no_key_for_a_local_server() -> None:
    assert ProviderSettings(openai_api_key="k").chat_endpoint() == (None, "k")
    local = ProviderSettings(chat_base_url="http://localhost:8000/v1")
    assert local.chat_endpoint() == ("http://localhost:8000/v1", PLACEHOLDER_KEY)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SESSIONFLOW_PROVIDER_READ_TIMEOUT", "soon"),
        ("SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT", "0"),
        ("SESSIONFLOW_MAX_OUTPUT_TOKENS", "-5"),
        ("SESSIONFLOW_WEB_SEARCH", "maybe"),
    ],
)
def test_an_unusable_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        ProviderSettings.from_env({name: value})


def test_each_reference_gets_its_adapter() -> None:
    settings = ProviderSettings()
    expected = {
        "openai/gpt-5": OpenAIResponsesProvider,
        "openai-chat/llama3.1": OpenAIChatProvider,
        "anthropic/claude-haiku-4-5": AnthropicProvider,
        "scripted/demo.json": ScriptedProvider,
    }
    for reference, adapter in expected.items():
        assert isinstance(make_provider(ModelRef.parse(reference), settings), adapter)
    assert make_provider(ModelRef.parse("gemini/flash"), settings) is None


def test_default_providers_rejects_an_unknown_provider_for_good() -> None:
    assert isinstance(default_providers(ModelRef.parse("openai/gpt-5")), OpenAIResponsesProvider)
    with pytest.raises(ApplicationError) as raised:
        default_providers(ModelRef.parse("gemini/flash"))
    assert raised.value.non_retryable
    assert "openai-chat/<model>" in str(raised.value)


def test_default_providers_reports_a_bad_setting_without_retrying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SESSIONFLOW_PROVIDER_READ_TIMEOUT", "never")
    environment_settings.cache_clear()
    try:
        with pytest.raises(ApplicationError) as raised:
            default_providers(ModelRef.parse("openai/gpt-5"))
    finally:
        environment_settings.cache_clear()
    assert raised.value.non_retryable
    assert "SESSIONFLOW_PROVIDER_READ_TIMEOUT" in str(raised.value)
