"""What a step cost: ``genai-prices`` for the real providers' models, the script's ``price``
block for a scripted one, ``None`` when nobody knows.

Which provider's price list applies follows where the request went. ``openai/`` and
``anthropic/`` are priced as OpenAI and Anthropic even behind a base URL of their own (a
gateway or a proxy serves the same models at the same prices). ``openai-chat/`` pointed at a
compatible server of its own (``SESSIONFLOW_OPENAI_CHAT_BASE_URL``) is priced only if
``genai-prices`` knows that server's URL (OpenRouter, Groq, ...): a local vLLM or Ollama model
has no price, and a guess from another provider's list would be wrong.
"""

from __future__ import annotations

import logging
from pathlib import Path

import genai_prices

from activities.providers.registry import environment_settings
from activities.providers.scripted import ScriptError, load_script
from activities.providers.settings import ProviderSettings
from sessionflow.models.common import ModelRef, Tokens
from sessionflow.models.spend import Price

log = logging.getLogger(__name__)

# Our provider ids and the price list each is billed by (``genai-prices`` provider ids).
_PRICE_LISTS = {"openai": "openai", "openai-chat": "openai", "anthropic": "anthropic"}


def step_cost(
    model: ModelRef, tokens: Tokens | None, settings: ProviderSettings | None = None
) -> float | None:
    """USD for one step's normalized tokens; ``None`` without usage or without a price.
    ``settings``: where the request went (default: this process's environment)."""
    if tokens is None:
        return None
    if model.provider_id == "scripted":
        price = script_price(model)
        return None if price is None else price.cost(tokens)
    if model.provider_id not in _PRICE_LISTS:
        return None
    usage = genai_prices.Usage(
        # genai-prices counts cache tokens inside input and reasoning inside output.
        input_tokens=tokens.input + tokens.cache.read + tokens.cache.write,
        cache_read_tokens=tokens.cache.read,
        cache_write_tokens=tokens.cache.write,
        output_tokens=tokens.output + tokens.reasoning,
        output_reasoning_tokens=tokens.reasoning,
    )
    if settings is None:
        settings = _settings()
    try:
        if model.provider_id == "openai-chat" and settings.chat_base_url is not None:
            priced = genai_prices.calc_price(
                usage, model.id, provider_api_url=settings.chat_base_url
            )
        else:
            priced = genai_prices.calc_price(
                usage, model.id, provider_id=_PRICE_LISTS[model.provider_id]
            )
    except LookupError:
        return None
    return float(priced.total_price)


def script_price(model: ModelRef) -> Price | None:
    """The scripted model's declared price (the file is parsed once per version)."""
    try:
        return load_script(Path(model.id)).price
    except ScriptError:
        return None  # the turn itself reports a script that does not load


def _settings() -> ProviderSettings:
    try:
        return environment_settings()
    except ValueError:
        return ProviderSettings()  # the provider itself reports the bad setting
