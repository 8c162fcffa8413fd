"""Which event classes this process can publish and decode, by stored type name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from pydantic import ValidationError

from sessionflow.errors import InvalidDurableEventError
from sessionflow.models.events import Event, SessionEvent


class EventRegistry:
    def __init__(self, classes: Iterable[type[Event]] = ()) -> None:
        self._by_stored: dict[str, type[Event]] = {}
        for cls in classes:
            self.register(cls)

    @classmethod
    def sessions(cls) -> EventRegistry:
        """Every session event of the catalogue."""
        return cls(_catalogue())

    def register(self, cls: type[Event]) -> None:
        self._by_stored[cls.stored_type()] = cls

    def knows(self, stored_type: str) -> bool:
        return stored_type in self._by_stored

    def decode(self, stored_type: str, data: dict[str, Any]) -> Event:
        cls = self._by_stored.get(stored_type)
        if cls is None:
            raise InvalidDurableEventError(
                f"Unknown durable event type {stored_type}", event_type=stored_type
            )
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise InvalidDurableEventError(
                f"Invalid {stored_type} payload: {error}", event_type=stored_type
            ) from error


def _catalogue() -> list[type[Event]]:
    union = get_args(SessionEvent)[0]
    return [cls for cls in get_args(union) if issubclass(cls, Event)]
