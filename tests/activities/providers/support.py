"""Helpers for adapter tests: recordings, requests, running a stream, checking it publishes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.providers import base as p
from activities.providers.registry import make_provider
from activities.providers.settings import ProviderSettings
from activities.publisher import StreamProtocolError, TurnPublisher
from sessionflow.models.common import ModelRef
from tests.activities.providers.server import ReplayServer

RECORDINGS = Path(__file__).parent / "recordings"
ECHO = p.ToolSpec(
    name="echo",
    description="Return the given text.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
)
SYSTEM = "You are a terse assistant."
CACHE_KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"


def recording(name: str) -> list[bytes]:
    """A recorded stream as its server-sent events, one chunk each."""
    text = (RECORDINGS / name).read_text()
    return [(block + "\n\n").encode() for block in text.split("\n\n") if block.strip()]


def settings(server: ReplayServer, **overrides: Any) -> ProviderSettings:
    values: dict[str, Any] = {
        "openai_api_key": "sk-test",
        "openai_base_url": f"{server.url}/v1",
        "anthropic_api_key": "sk-ant-test",
        "anthropic_base_url": server.url,
        "connect_timeout_s": 2.0,
        "read_timeout_s": 5.0,
    }
    return ProviderSettings(**{**values, **overrides})


def user(text: str, *parts: Any) -> p.RequestMessage:
    return p.RequestMessage(role="user", content=(p.TextPartIn(text=text), *parts))


def request(
    model: str,
    *messages: p.RequestMessage,
    tools: tuple[p.ToolSpec, ...] = (ECHO,),
    tool_choice: Any = None,
    system: tuple[str, ...] = (SYSTEM,),
) -> p.ProviderRequest:
    return p.ProviderRequest(
        session_id="ses_" + CACHE_KEY,
        request_index=0,
        model=ModelRef.parse(model),
        system=system,
        messages=messages or (user("Say hello."),),
        tools=tools,
        tool_choice=tool_choice,
        prompt_cache_key=CACHE_KEY,
    )


@dataclass
class Outcome:
    events: list[Any] = field(default_factory=list)
    error: p.ProviderError | None = None

    @property
    def finish(self) -> p.StepFinish:
        last = self.events[-1]
        assert isinstance(last, p.StepFinish), self.events
        return last

    def of(self, kind: type) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


async def run(provider_settings: ProviderSettings, provider_request: p.ProviderRequest) -> Outcome:
    """Stream one turn; a ``ProviderError`` ends it, anything else fails the test."""
    provider = make_provider(provider_request.model, provider_settings)
    assert provider is not None
    outcome = Outcome()
    try:
        async for event in provider.stream(provider_request):
            outcome.events.append(event)
    except p.ProviderError as error:
        outcome.error = error
    return outcome


def publish(events: list[Any], model: str = "openai/gpt-5") -> TurnPublisher:
    """Feed events to the real publisher: it raises ``StreamProtocolError`` on any illegal one."""
    publisher = TurnPublisher(
        session_id="ses_test",
        assistant_message_id="msg_test",
        agent="build",
        model=ModelRef.parse(model),
    )
    for event in events:
        publisher.handle(event)
    publisher.flush()
    return publisher


def publishable(events: list[Any]) -> bool:
    try:
        publish(events)
    except StreamProtocolError:
        return False
    return True
