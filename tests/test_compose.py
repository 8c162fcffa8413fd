"""The cluster path: docker-compose.yml is valid and wired to what the worker really reads."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]


def compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail(
            "docker-compose is not installed: apt-get install docker-compose (.ci/run does)"
        )
    return found


def test_the_compose_file_validates() -> None:
    done = subprocess.run(
        [compose(), "-f", "docker-compose.yml", "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_every_worker_variable_and_command_exists() -> None:
    config = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = config["services"]
    assert set(services) == {"postgres", "temporal", "temporal-ui", "worker"}
    worker = services["worker"]
    read_by_worker = set(re.findall(r"SESSIONFLOW_[A-Z_]+", _sources()))
    assert set(worker["environment"]) <= read_by_worker
    assert worker["command"][0] == "python" and (ROOT / worker["command"][1]).is_file()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+)", dockerfile, flags=re.M):
        assert (ROOT / source).exists(), source
    url = worker["environment"]["SESSIONFLOW_DATABASE_URL"]
    postgres = services["postgres"]["environment"]
    assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/" in url
    assert worker["environment"]["SESSIONFLOW_TEMPORAL_ADDRESS"] == "temporal:7233"
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def _sources() -> str:
    files = [ROOT / "worker.py", *(ROOT / "sessionflow").glob("*.py")]
    return "\n".join(path.read_text() for path in files)
