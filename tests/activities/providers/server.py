"""A real HTTP server on 127.0.0.1 that replays recorded server-sent-event streams.

Each request takes the next queued ``Reply`` and is recorded (path, headers, body), so a test
asserts both what the adapter made of the stream and exactly what it sent. Replies can stream in
chunks, end without a terminating chunk, or reset the connection (RST) part way.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 402: "Payment Required"}


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already text."""
    body = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in body.split("\n")) + "\n").encode()


@dataclass
class Reply:
    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    reset: bool = False  # abort with a TCP reset after the chunks
    cut: bool = False  # close after the chunks without the terminating chunk
    stall: float = 0.0  # seconds of silence after the first chunk (read timeouts)

    @classmethod
    def events(cls, *events: bytes, **options: Any) -> Reply:
        return cls(chunks=list(events), **options)

    @classmethod
    def error(cls, status: int, body: Any, **headers: str) -> Reply:
        return cls(
            status=status,
            chunks=[json.dumps(body).encode()],
            headers=headers,
            content_type="application/json",
        )


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ReplayServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                owner._handle(self)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ReplayServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reset(self) -> None:
        with self._lock:
            self.replies.clear()
            self.requests.clear()

    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def last(self) -> Received:
        return self.requests[-1]

    def _handle(self, handler: socketserver.StreamRequestHandler) -> None:
        received = _read_request(handler)
        if received is None:
            return
        with self._lock:
            self.requests.append(received)
            reply = self.replies.popleft() if self.replies else None
        if reply is None:
            reply = Reply.error(500, {"error": {"message": "no reply queued", "type": "test"}})
        # The client may hang up first (a read timeout test): then nothing is left to serve.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            _write(handler, reply)


def _read_request(handler: socketserver.StreamRequestHandler) -> Received | None:
    line = handler.rfile.readline().decode("latin-1").strip()
    if not line:
        return None
    method, path, _version = line.split(" ", 2)
    headers: dict[str, str] = {}
    while (header := handler.rfile.readline().decode("latin-1").strip()) != "":
        name, _, value = header.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = handler.rfile.read(int(headers.get("content-length", "0")))
    return Received(method, path, headers, body)


def _write(handler: socketserver.StreamRequestHandler, reply: Reply) -> None:
    reason = REASONS.get(reply.status, "Status")
    head = [f"HTTP/1.1 {reply.status} {reason}", f"Content-Type: {reply.content_type}"]
    head += ["Transfer-Encoding: chunked", "Connection: close"]
    head += [f"{name}: {value}" for name, value in reply.headers.items()]
    out = handler.wfile
    out.write(("\r\n".join(head) + "\r\n\r\n").encode())
    for number, chunk in enumerate(reply.chunks):
        out.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        out.flush()
        if number == 0 and reply.stall:
            time.sleep(reply.stall)
    if reply.reset:
        # SO_LINGER with a zero timeout makes close() send RST: a connection reset mid-stream.
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return
    if not reply.cut:
        out.write(b"0\r\n\r\n")
    out.flush()
