"""Which adapter serves a model reference: ``<provider>/<model>``.

| reference | adapter |
| --- | --- |
| ``openai/<model>`` | OpenAI Responses |
| ``openai-chat/<model>`` | Chat Completions (OpenAI or a compatible server) |
| ``anthropic/<model>`` | Anthropic Messages |
| ``scripted/<path>`` | the scripted provider (a JSON script of turns) |
"""

from __future__ import annotations

from functools import lru_cache

from activities.providers.base import Provider
from activities.providers.scripted import ScriptedProvider
from activities.providers.settings import ProviderSettings
from sessionflow.models.common import PROVIDER_IDS, ModelRef

__all__ = ["PROVIDER_IDS", "environment_settings", "make_provider"]


def make_provider(model: ModelRef, settings: ProviderSettings) -> Provider | None:
    """The adapter for ``model``, or ``None`` when no adapter serves its provider.

    The SDK adapters are imported when first asked for: the ``openai`` and ``anthropic``
    packages take seconds to import, which a worker (re)starting in a deploy should not pay
    for providers its sessions never use."""
    if model.provider_id == "scripted":
        return ScriptedProvider(model.id)
    if model.provider_id == "openai":
        from activities.providers.openai_responses import OpenAIResponsesProvider

        return OpenAIResponsesProvider(settings)
    if model.provider_id == "openai-chat":
        from activities.providers.openai_chat import OpenAIChatProvider

        return OpenAIChatProvider(settings)
    if model.provider_id == "anthropic":
        from activities.providers.anthropic_messages import AnthropicProvider

        return AnthropicProvider(settings)
    return None


@lru_cache(maxsize=1)
def environment_settings() -> ProviderSettings:
    """The settings of this process's environment, read once (STYLE 16)."""
    return ProviderSettings.from_env()
