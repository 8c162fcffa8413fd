"""MCP servers' tools as sessionflow tools, through the official ``mcp`` SDK's client.

Each configured server's tools appear to the model as ``<server>_<tool>``, with the server's
description and JSON schema, and pass the path every tool passes: the policy, the eager start
under the cap, one activity per attempt, the fenced settlement. The protocol's own hints say
what a retry may do: a tool annotated ``readOnlyHint`` or ``idempotentHint`` is retry-safe; any
other is not, so a retried attempt that may already have reached the server settles as
outcome-unknown instead of calling it twice. A call no rule matches is allowed for a read-only
tool and asked for any other.

Connections live in a per-worker pool keyed by server and, for a server whose command names
``{workspace}``, by workspace. A connection runs in a task of its own (the SDK's streams belong
to the task that opened them); calls from activities reach it through the client. A server that
dies, hangs past its ``timeout`` or cannot start fails the call it was in with an error naming
the server and what happened (its exit, its last stderr lines); the pool drops it and the next
call starts it again, never the call it died in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import httpx2
from mcp import Client, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED
from pydantic import BaseModel, ConfigDict

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.mcp_config import WORKSPACE, LocalServer, McpConfig, RemoteServer
from activities.tools.output import clip, normalize
from activities.tools.settings import ToolSettings
from sessionflow.locate import process_alive
from sessionflow.models.common import ContentPart, FileContent, TextContent

log = logging.getLogger("sessionflow.mcp")
_STDERR_LINES = 10
_SHUTDOWN_S = 10.0  # the SDK's own shutdown of a stdio server takes at most about 6.5 s
# A start gets at least this long, whatever the call bound (a first ``npx`` downloads, an
# interpreter imports its SDK on a loaded machine); each call is bounded by ``timeout``.
_START_S = 30.0
START_RETRY_S = 10.0  # how long a failed start answers for the server before it is tried again
_MAX_EVENT_BYTES = 64 * 1024 * 1024  # a streamable HTTP event; tool output is capped after


class McpArguments(BaseModel):
    """Whatever the model passed: the server validates its own arguments."""

    model_config = ConfigDict(extra="allow")


class McpServerError(ToolFailure):
    """A server that could not start, died, or did not answer in time."""


@dataclass
class _Connection:
    """One running server and the task that holds its client open."""

    name: str
    config: LocalServer | RemoteServer
    workspace: str | None  # the server's working directory (None: the worker's)
    client: Client | None = None
    tools: list[mcp_types.Tool] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _close: asyncio.Event = field(default_factory=asyncio.Event)
    _failure: BaseException | None = None
    _status: Path | None = None
    _stderr: Any = None
    _ended: str = ""  # how the server ended, once known (its status file, read and removed)
    _stderr_lines: str = ""  # its last stderr lines, kept once the file is closed
    _reaper: asyncio.Task[None] | None = None  # waits for a stopped server to be gone
    _pid_pair: tuple[int, int] | None = None

    @property
    def timeout_s(self) -> float:
        return self.config.timeout / 1000

    @property
    def start_s(self) -> float:
        return max(self.timeout_s, _START_S)

    @property
    def alive(self) -> bool:
        running = self._task is not None and not self._task.done()
        return running and self._failure is None and not self._exit() and self._processes_up()

    def _processes_up(self) -> bool:
        """Whether the launcher and the server still run (a server can die between calls,
        before the client notices): a call then starts it again instead of failing as if it
        had died during the call."""
        pids = self._pids()
        if pids is None:
            return True  # a remote server, or not started yet
        return all(process_alive(pid) for pid in pids)
        return True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name=f"mcp {self.name}")
        try:
            async with asyncio.timeout(self.start_s):
                await self._ready.wait()
        except TimeoutError:
            self.stop()
            raise McpServerError(
                f"MCP server {self.name} did not start within {self.start_s:g} s "
                f"({self._describe()}){self._stderr_tail()}"
            ) from None
        except BaseException:  # the caller cancelled: the server must not live on
            self.stop()
            raise
        if self._failure is not None:
            raise McpServerError(self._failed("could not start", self._failure)) from None

    async def _serve(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._client(stack))
                tools = await _all_tools(client)
                self.client, self.tools = client, tools
                self._ready.set()
                await self._close.wait()
        except BaseException as error:  # a cancellation included: the caller is told
            self._failure = error
            if not isinstance(error, asyncio.CancelledError) and self._ready.is_set():
                log.warning("%s", self._failed("stopped", error))
        finally:
            self.client = None
            self._ready.set()
            self._keep_last_words()

    def _client(self, stack: contextlib.AsyncExitStack) -> Client:
        # The SDK's bound on each answer covers the start's handshake too; a call's own bound
        # is ``timeout_s`` (``call``).
        timeout = self.start_s
        if isinstance(self.config, RemoteServer):
            http = httpx2.AsyncClient(headers=self.config.headers, timeout=timeout)
            stack.push_async_callback(http.aclose)  # the SDK leaves a given client open
            transport = streamable_http_client(
                self.config.url, http_client=http, max_sse_event_size=_MAX_EVENT_BYTES
            )
            return Client(transport, read_timeout_seconds=timeout, cache=None)
        fd, status = tempfile.mkstemp(prefix=f"mcp-{self.name}-", suffix=".status")
        os.close(fd)
        Path(status).unlink()  # the launcher writes it when the server ends
        self._status = Path(status)
        # Kept past this call, for the error of a call the server dies in; closed with it.
        self._stderr = tempfile.TemporaryFile("w+", prefix=f"mcp-{self.name}-")  # noqa: SIM115
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "activities.tools.mcp_launch", status, *self._command()],
            env={key: self._resolved(value) for key, value in self.config.environment.items()},
            cwd=self.workspace,
        )
        return Client(
            stdio_client(params, errlog=self._stderr), read_timeout_seconds=timeout, cache=None
        )

    def _command(self) -> list[str]:
        assert isinstance(self.config, LocalServer)
        return [self._resolved(part) for part in self.config.command]

    def _resolved(self, value: str) -> str:
        return value.replace(WORKSPACE, self.workspace or ".")

    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        client = self.client
        if client is None or not self.alive:
            raise McpServerError(self._failed("is not running", self._failure))
        try:
            async with asyncio.timeout(self.timeout_s):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            self.stop()
            raise McpServerError(
                f"MCP server {self.name} did not answer {tool} within {self.timeout_s:g} s; "
                f"it was stopped and starts again for the next call"
            ) from None
        except MCPError as error:
            if error.code != CONNECTION_CLOSED and self.alive:
                raise ToolFailure(f"MCP server {self.name}: {error.message}") from None
            await self._settle_death(error)
            raise McpServerError(self._failed("failed during the call", self._failure)) from None
        except Exception as error:
            await self._settle_death(error)
            raise McpServerError(self._failed("failed during the call", self._failure)) from None

    async def _settle_death(self, error: BaseException) -> None:
        """Mark the connection dead, giving the launcher the moment it needs to say how the
        server ended (its status file)."""
        self._failure = self._failure or error
        try:
            for _ in range(20):
                if self._exit() or self._close.is_set() or isinstance(self.config, RemoteServer):
                    break
                await asyncio.sleep(0.05)
        finally:
            self.stop()

    def stop(self) -> None:
        """Close in the background: the call that found the server hung or dead is answered
        now, not after the server's shutdown. The SDK's own shutdown (stdin closed, then
        SIGTERM, then SIGKILL) is left to finish: cancelling it midway leaves the server
        running. Should it not finish in time, the server's process group is killed."""
        self._failure = self._failure or ConnectionError("stopped")
        self._close.set()
        task = self._task
        if task is not None and not task.done() and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(task))

    async def _reap(self, task: asyncio.Task[None]) -> None:
        """Wait for the SDK's shutdown, then kill whatever of the server is left: a server
        that ignores its closed stdin and SIGTERM (a tool stuck in a thread) must not outlive
        its connection."""
        pids = self._pids()
        with contextlib.suppress(TimeoutError, Exception):
            async with asyncio.timeout(max(self.timeout_s, _SHUTDOWN_S)):
                await asyncio.shield(task)
        _kill(pids)
        if not task.done():
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(_SHUTDOWN_S):
                    await asyncio.shield(task)

    def _pids(self) -> tuple[int, int] | None:
        """(launcher pid, server group) from the launcher's pid file, read once."""
        if self._pid_pair is None and self._status is not None:
            with contextlib.suppress(OSError, ValueError):
                launcher, group = Path(f"{self._status}.pid").read_text().split()
                self._pid_pair = int(launcher), int(group)
        return self._pid_pair

    async def close(self) -> None:
        self.stop()
        if self._reaper is not None:
            await asyncio.shield(self._reaper)

    def _describe(self) -> str:
        if isinstance(self.config, RemoteServer):
            return self.config.url
        return "command " + " ".join(self._command())

    def _failed(self, what: str, error: BaseException | None) -> str:
        """``MCP server NAME WHAT (command ...)``, then how it ended (its exit, or why the
        command could not run), else the client's error, then its last stderr lines."""
        ended = self._exit()
        if ended.startswith("could not start: "):
            detail = ": " + ended.removeprefix("could not start: ")
        elif ended:
            detail = f"; {ended}"
        else:
            detail = f": {_reason(error)}" if error is not None else ""
        return f"MCP server {self.name} {what} ({self._describe()}){detail}{self._stderr_tail()}"

    def _exit(self) -> str:
        if self._ended or self._status is None:
            return self._ended
        with contextlib.suppress(OSError):
            return self._status.read_text().strip()
        return ""

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return self._stderr_lines
        with contextlib.suppress(ValueError, OSError):
            self._stderr.seek(0)
            lines = [line.rstrip() for line in self._stderr.read().splitlines() if line.strip()]
            if lines:
                return "; stderr: " + " | ".join(lines[-_STDERR_LINES:])
        return ""

    def _keep_last_words(self) -> None:
        """Once the server is gone: keep its exit and stderr tail, drop its files."""
        self._ended = self._exit()
        self._stderr_lines = self._stderr_tail()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._status is not None:
            for path in (self._status, Path(f"{self._status}.pid")):
                path.unlink(missing_ok=True)


def _kill(pids: tuple[int, int] | None) -> None:
    """SIGKILL a launcher and its server's process group, whatever of them is left."""
    if pids is None:
        return
    launcher, group = pids
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(launcher, signal.SIGKILL)


async def _all_tools(client: Client) -> list[mcp_types.Tool]:
    """Every page of the server's tool list."""
    listed = await client.list_tools()
    tools = list(listed.tools)
    while listed.next_cursor:
        listed = await client.list_tools(cursor=listed.next_cursor)
        tools += listed.tools
    return tools


def _reason(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class McpPool:
    """The worker's MCP connections, by (server, workspace or None)."""

    def __init__(self, config: McpConfig, settings: ToolSettings) -> None:
        self.config, self.settings = config, settings
        self._connections: dict[tuple[str, str | None], _Connection] = {}
        self._starting: dict[tuple[str, str | None], asyncio.Lock] = {}
        # A start that failed, remembered for a while: every turn of every session would
        # otherwise wait for the same failing start again.
        self._failed: dict[tuple[str, str | None], tuple[float, McpServerError]] = {}
        self._stopped: list[_Connection] = []  # replaced, maybe still shutting down

    def enabled(self, choices: Mapping[str, bool] | None) -> list[str]:
        """The servers a session uses: each server's ``enabled``, unless the session says."""
        choices = choices or {}
        return [
            name for name, server in self.config.mcp.items() if choices.get(name, server.enabled)
        ]

    async def connection(self, name: str, workspace: str) -> _Connection:
        server = self.config.mcp[name]
        key = (name, workspace if server.per_workspace else None)
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            current = self._connections.get(key)
            if current is not None and current.alive:
                return current
            failed = self._failed.get(key)
            if failed is not None and time.monotonic() < failed[0]:
                raise McpServerError(str(failed[1]))
            if current is not None:
                current.stop()
                self._stopped.append(current)
            fresh = _Connection(name, server, key[1])
            try:
                await fresh.start()
            except McpServerError as error:
                self._failed[key] = (time.monotonic() + START_RETRY_S, error)
                self._stopped.append(fresh)
                raise
            self._failed.pop(key, None)
            self._connections[key] = fresh
            return fresh

    async def tools(self, name: str, workspace: str) -> list[McpTool]:
        connection = await self.connection(name, workspace)
        return [McpTool(self, name, tool, self.settings) for tool in connection.tools]

    async def close(self) -> None:
        """Stop every server and wait until each is gone."""
        connections = [*self._connections.values(), *self._stopped]
        self._connections.clear()
        self._stopped.clear()
        await asyncio.gather(*(connection.close() for connection in connections))


class McpTool(Tool[McpArguments]):
    """One tool of one MCP server."""

    input_model: ClassVar[type[BaseModel]] = McpArguments

    def __init__(
        self, pool: McpPool, server: str, tool: mcp_types.Tool, settings: ToolSettings
    ) -> None:
        self.pool, self.server, self.tool, self.settings = pool, server, tool, settings
        self.name = tool_name(server, tool.name)  # type: ignore[misc]
        self.description = tool.description or f"{tool.name} (MCP server {server})"
        hints = tool.annotations
        self.read_only = bool(hints and hints.read_only_hint)
        retry_safe = self.read_only or bool(hints and hints.idempotent_hint)
        self.retry_safe = retry_safe  # type: ignore[misc]
        self.permission = "allow" if self.read_only else "ask"  # type: ignore[misc]

    def may_change_files(self) -> bool:
        """Any tool not annotated read-only: an idempotent one (a file server's ``write_file``)
        may write the workspace as well."""
        return not self.read_only

    def touches(self, input: McpArguments) -> tuple[str, ...]:
        """The paths a call names in its arguments, by the names file servers give them
        (``path``, ``source``, ``destination``, ...): the journal reads them first (it leaves
        out what is outside the workspace), so a revert can put them back."""
        found: list[str] = []
        for key, value in (input.model_extra or {}).items():
            if key.lower() in _PATH_ARGUMENTS:
                found += [
                    v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)
                ]
        return tuple(found)

    def input_schema(self) -> dict[str, Any]:
        schema = dict(self.tool.input_schema or {})
        schema.setdefault("type", "object")
        return schema

    async def execute(self, input: McpArguments, context: ToolContext) -> ToolOutput:
        connection = await self.pool.connection(self.server, str(context.workspace))
        result = await connection.call(self.tool.name, dict(input.model_extra or {}))
        output = to_output(result, self.settings)
        if result.is_error:
            text = " ".join(p.text for p in output.content if isinstance(p, TextContent))
            raise ToolFailure(text or f"{self.name} failed")
        reported = workspace_paths(result, str(context.workspace))
        return replace(output, output_paths=reported) if reported else output


# Argument names that name files, as MCP file servers call them.
_PATH_ARGUMENTS = frozenset(
    {"path", "paths", "file", "file_path", "filepath", "filename", "source", "destination"}
)


def workspace_paths(result: mcp_types.CallToolResult, workspace: str) -> tuple[str, ...]:
    """The workspace files a result links to or embeds (``file://`` URIs), relative to it:
    what the tool says it changed, for the journal."""
    root = os.path.realpath(workspace)
    found: list[str] = []
    for item in result.content:
        uri = None
        if isinstance(item, mcp_types.ResourceLink):
            uri = str(item.uri)
        elif isinstance(item, mcp_types.EmbeddedResource):
            uri = str(item.resource.uri)
        if uri is None or not uri.startswith("file://"):
            continue
        path = os.path.normpath(unquote(urlsplit(uri).path))
        for base in (workspace, root):
            if os.path.commonpath([path, base]) == base and path != base:
                found.append(os.path.relpath(path, base))
                break
    return tuple(dict.fromkeys(found))


def tool_name(server: str, tool: str) -> str:
    """``<server>_<tool>`` as providers accept tool names."""
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in f"{server}_{tool}")
    return name[:64]


def to_output(result: mcp_types.CallToolResult, settings: ToolSettings) -> ToolOutput:
    """MCP content as the tool's output: text capped as the built-ins' is, images and binary
    resources as attachments (a data URI, up to the store's cap), ``structuredContent`` kept
    structured when it fits the store."""
    texts: list[str] = []
    files: list[ContentPart] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            texts.append(item.text)
        elif isinstance(item, mcp_types.ImageContent | mcp_types.AudioContent):
            _attach(files, texts, item.data, item.mime_type, None, settings)
        elif isinstance(item, mcp_types.EmbeddedResource):
            resource = item.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                texts.append(f"[{resource.uri}]\n{resource.text}")
            else:
                mime = resource.mime_type or "application/octet-stream"
                _attach(files, texts, resource.blob, mime, str(resource.uri), settings)
        elif isinstance(item, mcp_types.ResourceLink):
            texts.append(f"[resource: {item.uri}]")
    body = "\n".join(texts)
    text, cut = clip(body, settings.output_cap)
    full_text = clip(body, settings.store_cap)[0] if cut else None
    structured: dict[str, Any] = {}
    if result.structured_content is not None:
        size = len(normalize(repr(result.structured_content)))
        if size <= settings.store_cap:
            structured["structured_content"] = result.structured_content
        else:
            structured["structured_content_omitted_bytes"] = size
    if cut:
        structured["truncated_bytes"] = cut
    content = (TextContent(text=text), *files) if text or not files else tuple(files)
    return ToolOutput(structured=structured, content=content, full_text=full_text)


def _attach(
    files: list[ContentPart],
    texts: list[str],
    data: str,
    mime: str,
    name: str | None,
    settings: ToolSettings,
) -> None:
    if len(data) > settings.store_cap:
        texts.append(f"[{mime} attachment of {len(data)} base64 bytes omitted: over the cap]")
        return
    files.append(FileContent(uri=f"data:{mime};base64,{data}", mime=mime, name=name))
