"""The SSE response: sse-starlette's, with a send deadline that costs a timer, not a scope.

sse-starlette bounds every send with an anyio cancel scope (``move_on_after``), whose entry and
exit look up the running async library and the current task several times over. With 200
subscribers on one session that was the largest share of the Python work of every batch, more
than framing the chunk and writing it (profiled, uvloop and httptools). Here a send arms one
loop timer instead; a client that has not taken the bytes when it fires has its sending task
cancelled, and the send raises ``SendTimeoutError`` as sse-starlette's does.
"""

from __future__ import annotations

import asyncio

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Send


class EventStream(EventSourceResponse):
    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
            return
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        # The timer can fire only while the send waits: one that returns at once (the
        # transport took the bytes) is disarmed before the loop runs anything else.
        timer = asyncio.get_running_loop().call_later(self.send_timeout, expire)
        try:
            await send(message)
        except asyncio.CancelledError:
            if expired and task.uncancel() == 0:  # ours alone, not the stream's own ending
                raise SendTimeoutError from None
            raise
        finally:
            timer.cancel()
