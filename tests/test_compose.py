"""The cluster path: docker-compose.yml is valid and wired to what the worker really reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]


def test_the_compose_file_validates() -> None:
    """Against the Compose Specification's schema (vendored in check-jsonschema): what
    ``docker compose config`` checks first, with nothing installed beyond the dev extra."""
    done = _validate(ROOT / "docker-compose.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_validation_rejects_a_broken_compose_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  worker:\n    image: x\n    restrat: always\n")
    done = _validate(broken)
    assert done.returncode != 0 and "restrat" in done.stdout


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_every_worker_variable_and_command_exists() -> None:
    config = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = config["services"]
    assert set(services) == {
        "postgres",
        "temporal",
        "temporal-ui",
        "worker",
        "host-a",
        "host-b",
        "api",
    }
    worker = services["worker"]
    read_by_worker = set(re.findall(r"SESSIONFLOW_[A-Z_]+", _sources()))
    read_by_worker |= set(re.findall(r'"([A-Z_]+_API_KEY)"', _sources()))
    assert set(worker["environment"]) <= read_by_worker, set(worker["environment"]) - read_by_worker
    assert worker["command"][0] == "python" and (ROOT / worker["command"][1]).is_file()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+)", dockerfile, flags=re.M):
        assert (ROOT / source).exists(), source
    url = worker["environment"]["SESSIONFLOW_DATABASE_URL"]
    postgres = services["postgres"]["environment"]
    assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/" in url
    assert worker["environment"]["SESSIONFLOW_TEMPORAL_ADDRESS"] == "temporal:7233"
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_turns_run_anywhere_and_each_hosts_tools_only_on_its_own_volume() -> None:
    """The cluster of issue 28: turn-only workers without workspaces, and two tool hosts, each
    with its own workspaces, serving only their host's queue; every service's environment is
    one the worker's settings accept."""
    from sessionflow.settings import Settings

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    worker = services["worker"]
    assert all(volume.endswith(":ro") for volume in worker["volumes"]), "no workspace here"
    assert Settings.from_env(_resolved(worker["environment"])).serve == "turns"
    mounts = set()
    for name in ("host-a", "host-b"):
        host = services[name]
        settings = Settings.from_env(_resolved(host["environment"]))
        assert (settings.host, settings.serve) == (name, "tools")
        [volume] = host["volumes"]
        source, target = volume.split(":")
        assert target == "/workspaces"
        mounts.add(source)
        assert "SYS_ADMIN" in host["cap_add"]  # the bash sandbox runs where the tools do
        shared = (
            "SESSIONFLOW_DATABASE_URL",
            "SESSIONFLOW_TEMPORAL_ADDRESS",
            "SESSIONFLOW_TASK_QUEUE",
        )
        assert all(host["environment"][key] == worker["environment"][key] for key in shared)
    assert len(mounts) == 2, "each host holds its own workspaces"


def _resolved(environment: dict[str, str]) -> dict[str, str]:
    """A compose environment as a container sees it with nothing exported: ``${X:-}`` empty."""
    return {key: re.sub(r"\$\{[^}]*\}", "", str(value)) for key, value in environment.items()}


def test_the_api_service_is_wired_like_the_worker() -> None:
    config = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api, worker = config["services"]["api"], config["services"]["worker"]
    assert set(api["environment"]) <= set(re.findall(r"SESSIONFLOW_[A-Z_]+", _sources()))
    shared = ("SESSIONFLOW_DATABASE_URL", "SESSIONFLOW_TEMPORAL_ADDRESS", "SESSIONFLOW_TASK_QUEUE")
    assert all(api["environment"][name] == worker["environment"][name] for name in shared)
    command = api["command"]
    assert command[:2] == ["sessionflow", "serve"] and "def serve(" in _cli()
    # Off loopback it must be given a token (the server refuses to start without one).
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert "SESSIONFLOW_API_TOKEN" in api["environment"]
    port = command[command.index("--port") + 1]
    assert api["ports"] == [f"{port}:{port}"]


def _cli() -> str:
    return (ROOT / "sessionflow" / "cli.py").read_text()


def _sources() -> str:
    files = [ROOT / "worker.py", *(ROOT / "sessionflow").glob("*.py")]
    files.append(ROOT / "activities" / "providers" / "settings.py")
    files += (ROOT / "sessionflow" / "api").glob("*.py")
    return "\n".join(path.read_text() for path in files)
