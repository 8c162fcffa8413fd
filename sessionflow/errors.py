"""The one error taxonomy of sessionflow.

    SessionflowError
    ├── InvalidInputError (also ValueError)   bad input at an edge; nothing was written
    │   ├── InvalidIdError                    an id that does not match ^[A-Za-z0-9_-]{1,128}$
    │   ├── PayloadTooLargeError             an event or prompt above the configured cap
    │   └── UnencodableTextError             text for a model holding a lone surrogate
    ├── NotFoundError
    │   ├── SessionNotFoundError
    │   └── RequestNotWaitingError           an answer for a request that is unknown or settled
    ├── ConflictError
    │   ├── InputConflictError               same input id, different content
    │   └── LifecycleConflictError           an input projection contradicts stored state
    ├── StoreError
    │   ├── InvalidDurableEventError         a defect in the event store contract (reference §2.3)
    │   ├── SequenceConflictError            two writers raced for one (aggregate, seq)
    │   └── StoreUnavailableError            the database cannot be reached or is read-only
    │       └── AdmissionUnavailableError    an admission failed its retries; it may have committed
    └── ClaimError
        ├── ClaimHeldError                   a live claim of another execution; retry at expires_at
        └── ClaimLostError                   the claim expired, was taken over or released: stop
            └── StaleAttemptError            a write from an older step or tool attempt

Every error says what was wrong and what to do. Activities translate these into Temporal
``ApplicationError``s whose ``type`` is the class name; ``ClaimLostError`` is non-retryable.
"""

from __future__ import annotations


class SessionflowError(Exception):
    """Base of every error sessionflow raises on purpose."""


class InvalidInputError(SessionflowError, ValueError):
    """Input rejected at the edge; nothing was written."""


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
    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes, above the limit of {limit} bytes; nothing was stored. "
            f"Split it, attach it as a file, or raise the limit in settings."
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


class StoreUnavailableError(StoreError):
    """The database is unreachable or refuses writes; nothing partial was committed."""


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
    def __init__(self, session_id: str, execution_id: str, expires_at_ms: int) -> None:
        super().__init__(
            f"Session {session_id} is claimed by execution {execution_id} until "
            f"{expires_at_ms} (epoch ms, database clock); retry after that time."
        )
        self.session_id = session_id
        self.execution_id = execution_id
        self.expires_at_ms = expires_at_ms


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
