"""Which provider key a model's requests draw on, and its limits (``store/governor.py``).

A key is the provider's family and endpoint with a digest of the API key: every session using
the same key shares one capacity, and neither the store nor a status ever shows the key itself.
``openai/`` and ``openai-chat/`` on the same endpoint and key share one key, as OpenAI counts
them. Scripted models have no provider and no key.

``SESSIONFLOW_RATE_LIMITS`` sets the limits, JSON by provider id, e.g.
``{"openai": {"rpm": 500, "tpm": 200000, "streams": 20}, "anthropic": {"streams": 8}}``
(``openai-chat`` falls back to ``openai``'s). A key without limits is still closed for everyone
by a rate-limit answer until its ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from activities.providers.settings import ProviderSettings
from sessionflow.models.common import ModelRef
from store.governor import RateLimits

_ENDPOINTS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
_LIMIT_NAMES = ("rpm", "tpm", "streams")


@dataclass(frozen=True)
class Capacity:
    limits: Mapping[str, RateLimits] = field(default_factory=dict)
    settings: ProviderSettings = field(default_factory=ProviderSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Capacity:
        source = os.environ if env is None else env
        settings = ProviderSettings.from_env(source)
        return cls(parse_limits(source.get("SESSIONFLOW_RATE_LIMITS", "")), settings)

    def key(self, model: ModelRef) -> str | None:
        """``openai@api.openai.com:1a2b3c4d5e6f``; None for a model no provider serves."""
        s = self.settings
        if model.provider_id == "openai":
            family, endpoint, secret = "openai", s.openai_base_url, s.openai_api_key
        elif model.provider_id == "openai-chat":
            (endpoint, secret), family = s.chat_endpoint(), "openai"
        elif model.provider_id == "anthropic":
            family, endpoint, secret = "anthropic", s.anthropic_base_url, s.anthropic_api_key
        else:
            return None
        endpoint = (endpoint or _ENDPOINTS[family]).rstrip("/")
        digest = hashlib.sha256(f"{endpoint}\n{secret or ''}".encode()).hexdigest()[:12]
        return f"{family}@{urlsplit(endpoint).netloc or endpoint}:{digest}"

    def limits_for(self, model: ModelRef) -> RateLimits:
        found = self.limits.get(model.provider_id)
        if found is None and model.provider_id == "openai-chat":
            found = self.limits.get("openai")
        return found or RateLimits()


def parse_limits(text: str) -> dict[str, RateLimits]:
    """``SESSIONFLOW_RATE_LIMITS``; a bad value is an error naming the variable and the part."""
    if not text.strip():
        return {}
    example = '{"openai": {"rpm": 500, "tpm": 200000, "streams": 20}}'
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"SESSIONFLOW_RATE_LIMITS is not JSON ({error}); e.g. {example}") from None
    if not isinstance(value, dict):
        raise ValueError(f"SESSIONFLOW_RATE_LIMITS must be an object by provider; e.g. {example}")
    limits: dict[str, RateLimits] = {}
    for provider, given in value.items():
        if not isinstance(given, dict) or set(given) - set(_LIMIT_NAMES):
            raise ValueError(
                f"SESSIONFLOW_RATE_LIMITS[{provider!r}] takes rpm, tpm and streams; got {given!r}"
            )
        for name, number in given.items():
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                raise ValueError(
                    f"SESSIONFLOW_RATE_LIMITS[{provider!r}].{name} must be a whole number above "
                    f"0, got {number!r}"
                )
        limits[provider] = RateLimits(**given)
    return limits
