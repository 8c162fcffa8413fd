"""The scripted provider: a JSON script of turns, the embedded default and the test double.

Turn *n* answers the session's *n*-th provider request (retries count; a request whose script
did not load is not counted: it never opened). Each request is also
appended, as one JSON line, to ``<script>.requests.jsonl`` beside the script when that file can be
written, so a test (or a user debugging an agent) can see exactly what the model was sent.
The file format is documented in the README ("Scripted models").
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

from activities.providers import base as p
from sessionflow.models.common import Limits
from sessionflow.models.spend import Price


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedCall(_Strict):
    id: str
    name: str
    input: dict[str, Any] = {}


class ScriptedHosted(ScriptedCall):
    result: Any = None
    error: bool = False
    metadata: dict[str, Any] | None = None


class ScriptedError(_Strict):
    kind: p.ErrorKind
    message: str
    retry_after_ms: int | None = None
    status: int | None = None


class ScriptedFinish(_Strict):
    reason: str = "stop"
    usage: p.Usage = p.Usage()


class ScriptedStep(_Strict):
    text: str | None = None
    reasoning: str | None = None
    metadata: dict[str, Any] | None = None
    chunks: int = 1
    delay_ms: int = 0
    tool_call: ScriptedCall | None = None
    hosted_tool: ScriptedHosted | None = None
    wait_ms: int | None = None
    wait_for_file: str | None = None
    error: ScriptedError | None = None
    provider_error: str | None = None
    finish: ScriptedFinish | None = None
    event: dict[str, Any] | None = None
    eof: bool | None = None

    @model_validator(mode="after")
    def _one_action(self) -> ScriptedStep:
        actions = [
            name
            for name in (
                "text",
                "reasoning",
                "tool_call",
                "hosted_tool",
                "wait_ms",
                "wait_for_file",
                "error",
                "provider_error",
                "finish",
                "event",
                "eof",
            )
            if getattr(self, name) is not None
        ]
        if len(actions) != 1:
            raise ValueError(
                "each scripted event needs exactly one of text, reasoning, tool_call, "
                f"hosted_tool, wait_ms, wait_for_file, error, provider_error, finish, event, eof; "
                f"got {actions or 'none'}"
            )
        return self


class ScriptedTurn(_Strict):
    events: list[ScriptedStep]


class Script(_Strict):
    # Without limits the model has no known window: nothing compacts automatically.
    limits: Limits | None = None
    # Without a price the model's cost is unknown (``None``), never 0.
    price: Price | None = None
    turns: list[ScriptedTurn]


_EVENT: TypeAdapter[p.StreamEvent] = TypeAdapter(p.StreamEvent)


class ScriptError(ValueError):
    """The script file is missing or malformed; the message names the file and the problem."""


_LOADED: dict[Path, tuple[tuple[int, int], Script]] = {}


def load_script(path: Path) -> Script:
    """The script at ``path``, parsed again only when the file changed (mtime or size)."""
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        cached = _LOADED.get(path)
        if cached is not None and cached[0] == version:
            return cached[1]
        script = parse_script(path, path.read_bytes())
    except FileNotFoundError as error:
        raise ScriptError(f"Scripted model file not found: {path}") from error
    except IsADirectoryError as error:
        raise ScriptError(f"Scripted model {path} is a directory, not a script file") from error
    if len(_LOADED) >= 256:
        _LOADED.clear()
    _LOADED[path] = (version, script)
    return script


def check_script(path: Path, tool_inputs: Mapping[str, type[BaseModel]] | None = None) -> Script:
    """Load the script as a worker would, and check each ``tool_call`` of a tool named in
    ``tool_inputs`` against that tool's input fields (a misspelt input fails here, once,
    instead of as a tool error in the middle of a session)."""
    script = load_script(path)
    problems: list[tuple[Loc, str]] = []
    for t, turn in enumerate(script.turns):
        for e, step in enumerate(turn.events):
            model = tool_inputs.get(step.tool_call.name) if tool_inputs and step.tool_call else None
            if model is None or step.tool_call is None:
                continue
            known = set(model.model_fields)
            for key in step.tool_call.input:
                if key not in known:
                    takes = ", ".join(sorted(known)) or "no inputs"
                    where = ("turns", t, "events", e, "tool_call", "input", key)
                    problems.append(
                        (where, f"{step.tool_call.name} has no input {key!r} (it takes {takes})")
                    )
    if problems:
        raise ScriptError(_describe(path, path.read_text(errors="replace"), problems))
    return script


Loc = tuple[int | str, ...]


def parse_script(path: Path, raw: bytes) -> Script:
    """The script in ``raw``; a ``ScriptError`` names the line and field of each problem."""
    text = raw.decode("utf-8", errors="replace")
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        raise ScriptError(
            f"Invalid scripted model file {path}:{error.lineno}:{error.colno}: not JSON: "
            f"{error.msg}"
        ) from error
    try:
        return Script.model_validate_json(raw)
    except ValidationError as error:
        problems = [(tuple(e["loc"]), e["msg"]) for e in error.errors()]
        raise ScriptError(_describe(path, text, problems)) from error


def _describe(path: Path, text: str, problems: list[tuple[Loc, str]]) -> str:
    positions = _positions(text)
    lines = []
    for loc, message in problems[:5]:
        found = loc
        while found and found not in positions:
            found = found[:-1]
        line = text.count("\n", 0, positions.get(found, 0)) + 1
        lines.append(f"{path}:{line}: {_dotted(loc) or '(top)'}: {message}")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return "Invalid scripted model file: " + "; ".join(lines) + more


def _dotted(loc: Loc) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


_SPACE = re.compile(r"[ \t\n\r]*")


def _positions(text: str) -> dict[Loc, int]:
    """Where each value of a valid JSON document starts, by its path (for error lines)."""
    positions: dict[Loc, int] = {}
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        match = _SPACE.match(text, i)
        return match.end() if match else i

    def value(i: int, loc: Loc) -> int:
        i = skip(i)
        positions[loc] = i
        opener = text[i : i + 1]
        if opener not in ("{", "["):
            return int(decoder.raw_decode(text, i)[1])
        closer, i, index = ("}" if opener == "{" else "]"), skip(i + 1), 0
        while text[i : i + 1] != closer:
            if opener == "{":
                key, i = decoder.raw_decode(text, i)
                i = value(skip(i) + 1, (*loc, key))
            else:
                i = value(i, (*loc, index))
                index += 1
            i = skip(i)
            i = skip(i + 1) if text[i : i + 1] == "," else i
        return i + 1

    value(0, ())
    return positions


class ScriptedProvider:
    def __init__(self, path: str | Path, *, record: bool = True) -> None:
        self.path = Path(path)
        self.record = record
        self.script: Script | None = None

    def open(self) -> None:
        """Load the script before the request is counted (``base.Opening``): a script that
        does not load uses up no turn, so the next request after a fix plays the right one."""
        self.script = load_script(self.path)

    def stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        return self._stream(request)

    async def _stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        script = self.script or load_script(self.path)
        self._record(request)
        index = request.request_index
        if index >= len(script.turns):
            raise p.ProviderError(
                "invalid_request",
                f"Scripted model {self.path} has {len(script.turns)} turn(s); request "
                f"{index + 1} has no turn to answer it. Add a turn to the script.",
            )
        called_local = False
        finished = False
        for number, step in enumerate(script.turns[index].events):
            if step.eof:
                return  # the stream ends here, without a finish event
            async for event in _play(step, f"{index}-{number}"):
                called_local |= isinstance(event, p.ToolCall) and not event.provider_executed
                finished |= isinstance(event, p.StepFinish)
                yield event
        if not finished:
            yield p.StepFinish(reason="tool-calls" if called_local else "stop")

    def _record(self, request: p.ProviderRequest) -> None:
        if not self.record:
            return
        try:
            with self.path.with_name(self.path.name + ".requests.jsonl").open("a") as log:
                log.write(request.model_dump_json() + "\n")
        except OSError:
            pass  # recording is a convenience; a read-only script still plays


async def _play(step: ScriptedStep, key: str) -> AsyncIterator[p.StreamEvent]:
    if step.text is not None:
        yield p.TextStart(id=f"text-{key}")
        for chunk in await _chunks(step.text, step.chunks, step.delay_ms):
            yield p.TextDelta(id=f"text-{key}", delta=chunk)
            await asyncio.sleep(step.delay_ms / 1000)
        yield p.TextEnd(id=f"text-{key}")
    elif step.reasoning is not None:
        yield p.ReasoningStart(id=f"reasoning-{key}", metadata=step.metadata)
        for chunk in await _chunks(step.reasoning, step.chunks, step.delay_ms):
            yield p.ReasoningDelta(id=f"reasoning-{key}", delta=chunk)
            await asyncio.sleep(step.delay_ms / 1000)
        yield p.ReasoningEnd(id=f"reasoning-{key}", metadata=step.metadata)
    elif step.tool_call is not None:
        call = step.tool_call
        yield p.ToolInputStart(id=call.id, name=call.name)
        yield p.ToolInputDelta(id=call.id, delta=json.dumps(call.input))
        yield p.ToolInputEnd(id=call.id)
        yield p.ToolCall(call_id=call.id, name=call.name, input=call.input)
    elif step.hosted_tool is not None:
        hosted = step.hosted_tool
        yield p.ToolCall(
            call_id=hosted.id,
            name=hosted.name,
            input=hosted.input,
            provider_executed=True,
            metadata=hosted.metadata,
        )
        yield p.ToolResult(
            call_id=hosted.id,
            name=hosted.name,
            result=hosted.result,
            is_error=hosted.error,
            metadata=hosted.metadata,
        )
    else:
        async for event in _control(step):
            yield event


async def _control(step: ScriptedStep) -> AsyncIterator[p.StreamEvent]:
    if step.wait_ms is not None:
        await asyncio.sleep(step.wait_ms / 1000)
    elif step.wait_for_file is not None:
        while not Path(step.wait_for_file).exists():
            await asyncio.sleep(0.02)
    elif step.error is not None:
        error = step.error
        raise p.ProviderError(
            error.kind, error.message, status=error.status, retry_after_ms=error.retry_after_ms
        )
    elif step.provider_error is not None:
        yield p.ProviderErrorEvent(message=step.provider_error)
    elif step.finish is not None:
        yield p.StepFinish(reason=step.finish.reason, usage=step.finish.usage)
    elif step.event is not None:
        yield _EVENT.validate_python(step.event)


async def _chunks(text: str, chunks: int, _delay_ms: int) -> list[str]:
    count = max(1, min(chunks, len(text) or 1))
    size = math.ceil(len(text) / count) if text else 0
    return [text[i : i + size] for i in range(0, len(text), size)] if size else [""]


Kind = Literal["scripted"]
