"""The streaming loop the SDK adapters share: open, decode, assemble, translate failures.

Only failures of the SDK and the network are translated (to ``ProviderError``); a failure of our
own parsing code is a bug and propagates as itself, so tests see it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from activities.providers import base as p
from activities.providers.assembly import Notes
from activities.providers.errors import Label, translate
from activities.providers.fields import plain

logger = logging.getLogger(__name__)


class Parser(Protocol):
    """One turn's stream state machine: decoded events in, normalized events out."""

    notes: Notes

    @property
    def complete(self) -> bool:
        """Whether the response is complete, so that only trailing bookkeeping can be missing."""
        ...

    def feed(self, event: dict[str, Any]) -> list[p.StreamEvent]: ...

    def end(self) -> list[p.StreamEvent]:
        """The closing events; raises ``ProviderError`` when the stream ended too early."""
        ...


class SdkStream(Protocol):
    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


class Closeable(Protocol):
    async def close(self) -> None: ...


async def relay(
    label: Label,
    client: Closeable,
    opener: Callable[[], Awaitable[SdkStream]],
    parser: Parser,
) -> AsyncIterator[p.StreamEvent]:
    try:
        try:
            stream = await opener()
        except Exception as error:
            raise _translated(error, label) from error
        try:
            async for event in _assembled(label, stream, parser):
                yield event
        finally:
            await _quietly(stream.close())
    finally:
        await _quietly(client.close())


async def _assembled(
    label: Label, stream: SdkStream, parser: Parser
) -> AsyncIterator[p.StreamEvent]:
    iterator = stream.__aiter__()
    while True:
        try:
            raw = await iterator.__anext__()
        except StopAsyncIteration:
            break
        except Exception as error:
            failure = _translated(error, label)
            if parser.complete and failure.kind == "transport":
                # Everything the model said arrived; only trailing usage or the end marker is
                # lost, which is no reason to fail a finished turn.
                logger.warning("%s: connection lost after the response completed", label)
                break
            raise failure from error
        event = plain(raw)
        if event is None:
            parser.notes("an event that is not a JSON object", type(raw).__name__)
            continue
        for normalized in parser.feed(event):
            yield normalized
    for normalized in parser.end():
        yield normalized


def _translated(error: Exception, label: Label) -> p.ProviderError:
    failure = translate(error, label)
    if failure is None:
        raise error
    return failure


async def _quietly(closing: Awaitable[object]) -> None:
    try:
        await closing
    except Exception:
        # Closing a broken connection can fail again; the failure that matters is already raised.
        logger.debug("closing a provider stream failed", exc_info=True)
