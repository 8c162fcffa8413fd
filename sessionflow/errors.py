"""The one error taxonomy of sessionflow.

    SessionflowError
    ├── InvalidInputError (also ValueError)   bad input at an edge; nothing was written
    │   ├── InvalidIdError                    an id that does not match ^[A-Za-z0-9_-]{1,128}$
    │   ├── PayloadTooLargeError             an event or prompt above the configured cap
    │   ├── UnencodableTextError             text for a model holding a lone surrogate
    │   ├── UnsafeBindError                  the API asked to listen off loopback without a token
    │   ├── WrongRequestKindError            an approval for a question, an answer for an ask
    │   ├── InvalidHostError                 a host name outside ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$
    │   └── UnknownHostError                 a host no worker ever registered
    ├── NotFoundError
    │   ├── SessionNotFoundError
    │   └── RequestNotWaitingError           an answer for a request that is unknown or settled
    ├── ConflictError
    │   ├── InputConflictError               same input id, different content
    │   ├── LifecycleConflictError           an input projection contradicts stored state
    │   ├── StoreMismatchError               the workers of the queue write to another store
    │   └── SessionBusyError                 a change only allowed between busy periods (move)
    ├── StoreError
    │   ├── InvalidDurableEventError         a defect in the event store contract (reference §2.3)
    │   ├── SequenceConflictError            two writers raced for one (aggregate, seq)
    │   ├── TransactionConflictError         serialization failures or deadlocks, retried in vain
    │   └── StoreUnavailableError            the database cannot be reached, timed out, read-only
    │       └── AdmissionUnavailableError    an admission failed its retries; it may have committed
    ├── ClaimError
    │   ├── ClaimHeldError                   a live claim of another execution; retry at expires_at
    │   └── ClaimLostError                   the claim expired, was taken over or released: stop
    │       └── StaleAttemptError            a write from an older step or tool attempt
    ├── NoWorkerError                        no worker polls the session's task queue (client side)
    └── HostUnavailableError                 the host's workers are gone or did not answer

Every error says what was wrong and what to do. Activities translate these into Temporal
``ApplicationError``s whose ``type`` is the class name; ``ClaimLostError`` is non-retryable.
"""

from __future__ import annotations

import time


class SessionflowError(Exception):
    """Base of every error sessionflow raises on purpose."""


class InvalidInputError(SessionflowError, ValueError):
    """Input rejected at the edge; nothing was written. ``field``: the input that was wrong,
    when one is (the HTTP API names it)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ContextUnavailableError(SessionflowError):
    """The session's first request cannot be built: its system context cannot be read (the
    workspace is missing or unreadable). Nothing was promoted or sent (reference runner #4)."""

    def __init__(self, session_id: str, directory: str, why: str) -> None:
        super().__init__(
            f"The system context of session {session_id} is unavailable: {why} ({directory}). "
            f"Nothing was sent to the model and the prompt is still pending: resume the session "
            f"once the workspace is back."
        )


class WrongRequestKindError(InvalidInputError):
    """An approval or denial sent to a question, or an answer sent to a permission ask."""

    def __init__(self, session_id: str, request_id: str, kind: str, what: str) -> None:
        if kind == "question":
            how = (
                f"answer it with `sessionflow answer {session_id} TEXT --request {request_id}` "
                f"(HTTP: POST /sessions/{session_id}/requests/{request_id}/answer)"
            )
            wrong = "a question, not a permission ask"
        else:
            how = (
                f"approve it with `sessionflow approve {session_id} {request_id}` or deny it "
                f"with `sessionflow deny {session_id} {request_id}` "
                f"(HTTP: POST /sessions/{session_id}/requests/{request_id}/reply)"
            )
            wrong = "a permission ask, not a question"
        super().__init__(
            f"Request {request_id} in session {session_id} is {wrong} ({what}): {how}. "
            "Nothing was sent.",
            field="request_id",
        )
        self.session_id, self.request_id, self.kind = session_id, request_id, kind


class InvalidIdError(InvalidInputError):
    def __init__(self, kind: str, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(
            f"Invalid {kind} id {shown}: ids are 1 to 128 characters from A-Z, a-z, 0-9, '_' "
            f"and '-'. Use the id sessionflow returned, or generate one with that alphabet."
        )
        self.kind = kind
        self.value = value


class PayloadTooLargeError(InvalidInputError):
    def __init__(
        self, what: str, size: int, limit: int, setting: str = "SESSIONFLOW_MAX_EVENT_BYTES"
    ) -> None:
        super().__init__(
            f"{what} is {size} bytes, above the limit of {limit} bytes; nothing was stored. "
            f"Split it, put the text in a file in the workspace and ask the model to read it, "
            f"or raise {setting} (where the store is written: the client and the workers)."
        )
        self.what = what
        self.size = size
        self.limit = limit


class UnencodableTextError(InvalidInputError):
    def __init__(self, what: str, index: int, code_point: int) -> None:
        super().__init__(
            f"{what} holds a lone surrogate U+{code_point:04X} at character {index}, which is "
            f"not valid Unicode: no model request can carry it, so nothing was stored. Send "
            f"valid UTF-8 text (an emoji is one code point, not a surrogate pair; re-decode "
            f"bytes read with errors='surrogateescape' using errors='replace')."
        )
        self.what = what
        self.index = index
        self.code_point = code_point


class UnsafeBindError(InvalidInputError):
    def __init__(self, host: str) -> None:
        super().__init__(
            f"Refusing to serve the API on {host}: off loopback every request must carry a "
            f"token. Set SESSIONFLOW_API_TOKEN to a long random secret (clients send it as "
            f"'Authorization: Bearer <token>'), or bind 127.0.0.1."
        )
        self.host = host


class InvalidHostError(InvalidInputError):
    def __init__(self, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(
            f"Invalid host name {shown}: a host is 1 to 64 characters from A-Z, a-z, 0-9, "
            f"'_', '.' and '-', starting with a letter or digit (e.g. ci-3, devbox.local)."
        )
        self.value = value


class UnknownHostError(InvalidInputError):
    def __init__(self, host: str, known: list[str]) -> None:
        hosts = ", ".join(known) if known else "none"
        super().__init__(
            f"host `{host}` has never registered: no worker of it ever ran against this "
            f"store (hosts known: {hosts}). Start one with `sessionflow worker --host {host}` "
            f"(or SESSIONFLOW_HOST={host}), or choose a known host. Nothing was created."
        )
        self.host = host
        self.known = known


class NotFoundError(SessionflowError, LookupError):
    """Something named by id does not exist."""


class SessionNotFoundError(NotFoundError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"Session not found: {session_id}. List sessions to find its id, or create it first."
        )
        self.session_id = session_id


class RequestNotWaitingError(NotFoundError):
    def __init__(self, session_id: str, request_id: str, waiting: list[str]) -> None:
        listed = ", ".join(waiting) if waiting else "none"
        super().__init__(
            f"No request {request_id} waits for an answer in session {session_id}: it is "
            f"unknown or already answered. Waiting now: {listed}"
        )
        self.session_id, self.request_id, self.waiting = session_id, request_id, waiting


class ConflictError(SessionflowError):
    """The request contradicts durable state."""


class InputConflictError(ConflictError):
    def __init__(self, input_id: str) -> None:
        super().__init__(
            f"Input {input_id} was already admitted with different content; input ids are "
            f"idempotency keys. Retry with the original content or use a new id."
        )
        self.input_id = input_id


class LifecycleConflictError(ConflictError):
    def __init__(self, input_id: str, detail: str = "") -> None:
        suffix = f": {detail}" if detail else ""
        super().__init__(f"Session input lifecycle conflict for {input_id}{suffix}")
        self.input_id = input_id


class StoreMismatchError(ConflictError):
    """The workers polling a task queue serve another store than the caller's: a session
    created here would never run. Nothing was written."""

    def __init__(self, task_queue: str, ours: str, theirs: list[str]) -> None:
        super().__init__(
            f"the workers polling task queue {task_queue} write to {' and '.join(theirs)}, not "
            f"to this store ({ours}): a session created here would never run. Pass --database "
            f"(or SESSIONFLOW_DATABASE_URL) naming their store, or start a worker on this one."
        )
        self.task_queue = task_queue
        self.ours = ours
        self.theirs = theirs


class SessionBusyError(ConflictError):
    def __init__(self, session_id: str, what: str) -> None:
        super().__init__(
            f"session {session_id} is busy: {what} only between busy periods. Wait for it to "
            f"finish (or interrupt it), then try again. Nothing was changed."
        )
        self.session_id = session_id


class StoreError(SessionflowError):
    """The event store refused or failed a write."""


class InvalidDurableEventError(StoreError):
    """A violation of the event store contract (reference §2.3); the transaction rolled back."""

    def __init__(self, message: str, *, event_type: str | None = None) -> None:
        super().__init__(message)
        self.event_type = event_type


class SequenceConflictError(StoreError):
    def __init__(self, aggregate_id: str, seq: int) -> None:
        super().__init__(
            f"Sequence conflict for aggregate {aggregate_id} at sequence {seq}: another writer "
            f"committed it first. Re-read the aggregate and retry."
        )
        self.aggregate_id = aggregate_id
        self.seq = seq


class TransactionConflictError(StoreError):
    def __init__(self, sqlstate: str, attempts: int) -> None:
        what = "a deadlock" if sqlstate == "40P01" else "a serialization failure"
        super().__init__(
            f"The database aborted the transaction as {what} (SQLSTATE {sqlstate}) "
            f"{attempts} time(s) in a row; nothing was committed. Retry the operation. If it "
            f"keeps failing, look for long transactions holding the same rows."
        )
        self.sqlstate = sqlstate
        self.attempts = attempts


class StoreUnavailableError(StoreError):
    """The database is unreachable, timed out or refuses writes; nothing partial was committed.

    A write cut off this way (its connection dropped while it committed) may or may not have
    committed: a retry must be idempotent, or read back first.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"The database is unavailable: {reason}. Nothing partial was committed, but a "
            f"write cut off mid-commit may have committed whole. Retry once the database is "
            f"back (the store reconnects by itself)."
        )
        self.reason = reason


class StoreOpenError(StoreUnavailableError):
    """The store could not be brought to its current schema (its migrations were refused)."""

    def __init__(self, reason: str) -> None:
        StoreError.__init__(
            self,
            f"The store cannot be opened: {reason}. Nothing was changed. Open it again once "
            f"the database accepts writes (a store already at the current schema opens on a "
            f"read-only database, and only its writes fail).",
        )
        self.reason = reason


class AdmissionUnavailableError(StoreUnavailableError):
    def __init__(self, session_id: str, input_id: str, attempts: int, cause: str) -> None:
        super().__init__(
            f"Could not admit input {input_id} to session {session_id}: the database failed "
            f"{attempts} times (last: {cause}). It may have been admitted all the same: retry "
            f"with input_id={input_id!r}, which admits it at most once."
        )
        self.session_id = session_id
        self.input_id = input_id
        self.attempts = attempts


class ClaimError(SessionflowError):
    """Base of the session claim (lease) errors."""


class ClaimHeldError(ClaimError):
    def __init__(
        self, session_id: str, execution_id: str, expires_at_ms: int, now_ms: int | None = None
    ) -> None:
        super().__init__(
            f"Session {session_id} is claimed by execution {execution_id} until "
            f"{expires_at_ms} (epoch ms, database clock); retry after that time."
        )
        self.session_id = session_id
        self.execution_id = execution_id
        self.expires_at_ms = expires_at_ms
        self.now_ms = now_ms  # the database clock when it was seen held, if read

    def remaining_ms(self) -> int:
        """How long the claim stays live, by the database clock when it was read (a worker's
        own clock may be off by more than the lease), else by this process's clock."""
        now = self.now_ms if self.now_ms is not None else int(time.time() * 1000)
        return max(0, self.expires_at_ms - now)


# The reason of a ``ClaimLostError`` whose claim is gone (released), not taken over: the drain
# tells the two apart (``workflows/session.py: _released``).
CLAIM_RELEASED = "the claim was released"


class ClaimLostError(ClaimError):
    def __init__(self, session_id: str, execution_id: str, reason: str) -> None:
        super().__init__(
            f"Claim on session {session_id} lost by execution {execution_id}: {reason}. "
            f"Stop writing; only a new acquisition (a new epoch) may continue the session."
        )
        self.session_id = session_id
        self.execution_id = execution_id
        self.reason = reason


class StaleAttemptError(ClaimLostError):
    def __init__(
        self, session_id: str, execution_id: str, attempt: int, current: int, *, what: str = "step"
    ) -> None:
        super().__init__(
            session_id,
            execution_id,
            f"write from {what} attempt {attempt} after attempt {current} began",
        )
        self.attempt = attempt
        self.current = current
        self.what = what


class NoWorkerError(SessionflowError):
    """No worker polls the task queue, so a request that needs one cannot be answered now."""

    def __init__(self, task_queue: str, pending_inputs: int, *, sent: bool = False) -> None:
        waiting = "input waits" if pending_inputs == 1 else "inputs wait"
        done = "The request is recorded and runs when one polls. " if sent else ""
        super().__init__(
            f"no worker is polling task queue {task_queue} ({pending_inputs} pending {waiting} "
            f"for one). {done}Start one with `sessionflow worker` or `sessionflow dev` on the "
            f"same --temporal, --database and --task-queue."
        )
        self.task_queue = task_queue
        self.pending_inputs = pending_inputs
        self.sent = sent


class HostUnavailableError(SessionflowError):
    """The host's workers are gone (no live lease), or none of them answered in time."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(
            f"host `{host}` is not running: {detail}. Start a worker with "
            f"`sessionflow worker --host {host}`, or choose another host."
        )
        self.host = host
        self.detail = detail
