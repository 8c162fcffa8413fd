"""The adapter registry loads an SDK only for the provider a session asks for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from activities.providers.anthropic_messages import AnthropicProvider
from activities.providers.openai_chat import OpenAIChatProvider
from activities.providers.openai_responses import OpenAIResponsesProvider
from activities.providers.registry import environment_settings, make_provider
from activities.providers.scripted import ScriptedProvider
from sessionflow.models.common import ModelRef

ROOT = Path(__file__).parents[3]


def test_a_worker_starts_without_importing_the_provider_sdks() -> None:
    """A worker (re)started by a deploy or a crash polls sooner: ``openai`` and ``anthropic``
    took about 4 s of its 7 s of imports here, for sessions that may never use them."""
    probe = (
        "import sys, worker, activities.runtime, activities.providers.errors;"
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_each_provider_id_gets_its_adapter() -> None:
    settings = environment_settings()
    expected = {
        "scripted/x.json": ScriptedProvider,
        "openai/gpt-5": OpenAIResponsesProvider,
        "openai-chat/gpt-4o": OpenAIChatProvider,
        "anthropic/claude-sonnet-4": AnthropicProvider,
    }
    for ref, adapter in expected.items():
        assert type(make_provider(ModelRef.parse(ref), settings)) is adapter
    assert make_provider(ModelRef(provider_id="nobody", id="m"), settings) is None
