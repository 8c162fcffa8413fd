"""Provider adapter fixtures: one local replay server for the session, reset for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.activities.providers.server import ReplayServer


@pytest.fixture(scope="session")
def replay_server() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


@pytest.fixture
def server(replay_server: ReplayServer) -> ReplayServer:
    replay_server.reset()
    return replay_server
