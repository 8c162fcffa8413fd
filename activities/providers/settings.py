"""Provider settings: read once from the environment, at the edge, into one frozen object.

``OPENAI_API_KEY``
    Key for ``openai/<model>`` (Responses) and, by default, ``openai-chat/<model>``.
``OPENAI_BASE_URL``
    Endpoint of both OpenAI adapters; default the SDK's (``https://api.openai.com/v1``).
``SESSIONFLOW_OPENAI_CHAT_BASE_URL``
    ``openai-chat/`` only: an OpenAI-compatible server (vLLM, Ollama, LM Studio, a gateway);
    default ``OPENAI_BASE_URL``.
``SESSIONFLOW_OPENAI_CHAT_API_KEY``
    ``openai-chat/`` only; default ``OPENAI_API_KEY``, else a placeholder for a custom base URL.
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``
    Key and endpoint for ``anthropic/<model>``; default endpoint ``https://api.anthropic.com``.
``SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT``
    Seconds to connect to a provider; default 10.
``SESSIONFLOW_PROVIDER_READ_TIMEOUT``
    Longest silence in seconds between two chunks of a stream; default 600.
``SESSIONFLOW_MAX_OUTPUT_TOKENS``
    Output cap. Anthropic requires one (default: the model table's output limit, 8192 for an
    unknown model); OpenAI adapters send one only when this is set.
``SESSIONFLOW_ANTHROPIC_THINKING_BUDGET``
    Extended thinking budget in tokens for ``anthropic/``; default 0 (off).
``SESSIONFLOW_REASONING_EFFORT``
    ``low``, ``medium`` or ``high`` for reasoning models on ``openai/``; default the provider's.
``SESSIONFLOW_WEB_SEARCH``
    ``1`` offers the provider's hosted web search (``openai/``, ``anthropic/``); default 0.

The SDKs' own retries are always off: the drain owns retries (reference §4.7).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# A compatible server (Ollama, vLLM, LM Studio) usually ignores the key, but the OpenAI SDK
# refuses to build a client without one.
PLACEHOLDER_KEY = "sessionflow-no-key"


@dataclass(frozen=True)
class ProviderSettings:
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    chat_base_url: str | None = None
    chat_api_key: str | None = None
    anthropic_api_key: str | None = None
    anthropic_base_url: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    max_output_tokens: int | None = None
    anthropic_thinking_budget: int = 0
    reasoning_effort: str | None = None
    web_search: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProviderSettings:
        source = os.environ if env is None else env
        read = _Reader(source)
        return cls(
            openai_api_key=read.text("OPENAI_API_KEY"),
            openai_base_url=read.text("OPENAI_BASE_URL"),
            chat_base_url=read.text("SESSIONFLOW_OPENAI_CHAT_BASE_URL"),
            chat_api_key=read.text("SESSIONFLOW_OPENAI_CHAT_API_KEY"),
            anthropic_api_key=read.text("ANTHROPIC_API_KEY"),
            anthropic_base_url=read.text("ANTHROPIC_BASE_URL"),
            connect_timeout_s=read.number("SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT", 10.0),
            read_timeout_s=read.number("SESSIONFLOW_PROVIDER_READ_TIMEOUT", 600.0),
            max_output_tokens=read.count("SESSIONFLOW_MAX_OUTPUT_TOKENS"),
            anthropic_thinking_budget=read.count("SESSIONFLOW_ANTHROPIC_THINKING_BUDGET") or 0,
            reasoning_effort=read.text("SESSIONFLOW_REASONING_EFFORT"),
            web_search=read.flag("SESSIONFLOW_WEB_SEARCH"),
        )

    def chat_endpoint(self) -> tuple[str | None, str | None]:
        """Base URL and key for ``openai-chat/``: its own settings first, then OpenAI's."""
        base_url = self.chat_base_url or self.openai_base_url
        key = self.chat_api_key or self.openai_api_key
        if key is None and self.chat_base_url is not None:
            key = PLACEHOLDER_KEY
        return base_url, key


def missing_key(provider_id: str, settings: ProviderSettings) -> str | None:
    """The variable to set when ``provider_id``'s models have no API key in ``settings``;
    None when they have one (or need none: the scripted model, a local compatible server)."""
    if provider_id == "openai" and settings.openai_api_key is None:
        return "OPENAI_API_KEY"
    if provider_id == "anthropic" and settings.anthropic_api_key is None:
        return "ANTHROPIC_API_KEY"
    if provider_id == "openai-chat" and settings.chat_endpoint()[1] is None:
        return (
            "SESSIONFLOW_OPENAI_CHAT_API_KEY or OPENAI_API_KEY (a local OpenAI-compatible "
            "server that needs no key: set SESSIONFLOW_OPENAI_CHAT_BASE_URL instead)"
        )
    return None


class _Reader:
    """Typed reads that name the variable when its value is unusable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str) -> str | None:
        value = self.env.get(name, "").strip()
        return value or None

    def number(self, name: str, default: float) -> float:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not number > 0:
            raise ValueError(f"{name}={value!r} must be a positive number of seconds")
        return number

    def count(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        if not value.isdigit():
            raise ValueError(f"{name}={value!r} must be a whole number of tokens")
        return int(value)

    def flag(self, name: str) -> bool:
        value = (self.text(name) or "0").lower()
        if value not in {"0", "1", "true", "false", "yes", "no"}:
            raise ValueError(f"{name}={value!r} must be 1 or 0")
        return value in {"1", "true", "yes"}
