"""SDK clients as the adapters use them: retries off (the drain owns retries), our timeouts.

A client is made per stream and closed with it: activities may run on different event loops
(tests, worker restarts), and an async HTTP pool must not outlive its loop.
"""

from __future__ import annotations

import anthropic
import openai

from activities.providers.settings import ProviderSettings


def openai_client(
    settings: ProviderSettings, *, api_key: str, base_url: str | None
) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,
        timeout=openai.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
    )


def anthropic_client(settings: ProviderSettings, *, api_key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        api_key=api_key,
        base_url=settings.anthropic_base_url,
        max_retries=0,
        timeout=anthropic.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
    )
