"""Ground models: ids, settings, the event catalogue, values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sessionflow import ids
from sessionflow.errors import InvalidIdError
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, Tokens
from sessionflow.models.events import SESSION_EVENT_ADAPTER
from sessionflow.settings import DEFAULT_DATABASE_URL, Settings, SettingsError


def test_generated_ids_are_valid_unique_and_time_sortable() -> None:
    generated = [ids.session_id() for _ in range(1000)]
    assert len(set(generated)) == 1000
    assert all(ids.validate_id(value) == value for value in generated)
    assert generated[0][:16] <= generated[-1][:16]
    assert ids.message_id().startswith("msg_") and ids.event_id().startswith("evt_")


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "ses\n", None, 12, "é"])
def test_validate_id_refuses_with_a_message_that_says_what_to_do(bad: object) -> None:
    with pytest.raises(InvalidIdError, match="ids are 1 to 128 characters"):
        ids.validate_id(bad, "session")


def test_settings_read_from_the_environment_once() -> None:
    assert Settings.from_env({}).database_url == DEFAULT_DATABASE_URL
    settings = Settings.from_env(
        {"SESSIONFLOW_DATABASE_URL": "postgresql+psycopg://db/x", "SESSIONFLOW_LEASE_MS": "5000"}
    )
    assert (settings.database_url, settings.lease_ms) == ("postgresql+psycopg://db/x", 5000)
    with pytest.raises(SettingsError, match=r"SESSIONFLOW_LEASE_MS='10': .*greater than or equal"):
        Settings.from_env({"SESSIONFLOW_LEASE_MS": "10"})
    with pytest.raises(ValidationError):
        settings.lease_ms = 1  # type: ignore[misc]


def test_a_workers_activity_slots_are_a_setting() -> None:
    assert Settings.from_env({}).max_concurrent_activities == 1000
    env = {"SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES": "64"}
    assert Settings.from_env(env).max_concurrent_activities == 64
    with pytest.raises(SettingsError, match="SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES='0'"):
        Settings.from_env({"SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES": "0"})


def test_the_workflow_sandbox_is_a_setting_off_by_default() -> None:
    assert Settings.from_env({}).workflow_sandbox is False
    assert Settings.from_env({"SESSIONFLOW_WORKFLOW_SANDBOX": "true"}).workflow_sandbox is True
    with pytest.raises(SettingsError, match="SESSIONFLOW_WORKFLOW_SANDBOX='sometimes'"):
        Settings.from_env({"SESSIONFLOW_WORKFLOW_SANDBOX": "sometimes"})


def test_stored_type_carries_the_version() -> None:
    assert ev.StepStarted.stored_type() == "session.step.started.1"
    assert ev.ToolSucceeded.stored_type() == "session.tool.success.1"


def test_the_catalogue_is_a_discriminated_union() -> None:
    event = SESSION_EVENT_ADAPTER.validate_python(
        {
            "type": "session.text.ended",
            "session_id": "ses_1",
            "assistant_message_id": "msg_1",
            "ordinal": 0,
            "text": "hi",
        }
    )
    assert isinstance(event, ev.TextEnded)
    with pytest.raises(ValidationError):
        SESSION_EVENT_ADAPTER.validate_python({"type": "session.nope", "session_id": "ses_1"})


def test_tokens_clamp_non_finite_and_negative_counts() -> None:
    tokens = Tokens(input=float("nan"), output=-3, reasoning=float("inf"))  # type: ignore[arg-type]
    assert (tokens.input, tokens.output, tokens.reasoning) == (0, 0, 0)


def test_model_refs_parse_and_explain_bad_input() -> None:
    assert str(ModelRef.parse("anthropic/claude-sonnet-4")) == "anthropic/claude-sonnet-4"
    assert ModelRef.parse("scripted/dir/demo.json").id == "dir/demo.json"
    with pytest.raises(ValueError, match="use <provider>/<model>"):
        ModelRef.parse("gpt-5")


def test_the_batch_interval_the_turn_bound_and_the_retry_backoff_are_settings() -> None:
    defaults = Settings.from_env({})
    assert (defaults.batch_ms, defaults.turn_timeout_s, defaults.retry_backoff_ms) == (
        30,
        3600,
        2000,
    )
    env = {
        "SESSIONFLOW_BATCH_MS": "5",
        "SESSIONFLOW_TURN_TIMEOUT_S": "7200",
        "SESSIONFLOW_RETRY_BACKOFF_MS": "250",
    }
    read = Settings.from_env(env)
    assert (read.batch_ms, read.turn_timeout_s, read.retry_backoff_ms) == (5, 7200, 250)
    with pytest.raises(SettingsError, match="SESSIONFLOW_RETRY_BACKOFF_MS"):
        Settings.from_env({"SESSIONFLOW_RETRY_BACKOFF_MS": "0"})
    with pytest.raises(SettingsError, match="SESSIONFLOW_BATCH_MS"):
        Settings.from_env({"SESSIONFLOW_BATCH_MS": "0"})


def test_the_sandbox_paths_are_path_lists() -> None:
    env = {"SESSIONFLOW_SANDBOX_MOUNT": "/opt/a:~/b:", "SESSIONFLOW_SANDBOX_HIDE": "~/.tool"}
    settings = Settings.from_env(env)
    assert settings.sandbox_mount == ("/opt/a", "~/b")
    assert settings.sandbox_hide == ("~/.tool",)
    assert Settings.from_env({}).sandbox_mount == ()
