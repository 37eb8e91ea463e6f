"""The agent's identity, step validation, settings and control channel."""

from __future__ import annotations

import asyncio
import math

import pytest

from stride.agent.app import build
from stride.agent.domain.control import ControlAction, ControlCommand
from stride.agent.domain.identity import Role, parse_role
from stride.agent.domain.steps import StepWindow, validate
from stride.agent.settings import AgentSettings
from stride.agent.usecases import ControlChannel
from stride.runtime.errors import InvalidArgument, StartupError
from stride.runtime.lifecycle import EXIT_STARTUP_FAILED, run_service
from stride.runtime.settings import load_settings


@pytest.mark.parametrize(
    ("text", "role"),
    [
        ("worker", Role.WORKER),
        ("PS", Role.PS),
        ("data_worker", Role.DATA_WORKER),
        ("data-worker", Role.DATA_WORKER),
        ("ROLE_CHIEF", Role.CHIEF),
    ],
)
def test_roles_parse_in_either_spelling(text: str, role: Role) -> None:
    assert parse_role(text) is role


def test_unknown_role_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="ps, worker, data_worker, chief"):
        parse_role("boss")


def test_a_valid_window_passes() -> None:
    validate(StepWindow(global_step=100, steps=10, step_seconds=0.05, samples_per_second=1e4))
    validate(StepWindow(global_step=0, steps=1, step_seconds=0.0, samples_per_second=0.0))


@pytest.mark.parametrize(
    ("window", "field"),
    [
        (StepWindow(-1, 1, 0.1, 1.0), "global_step"),
        (StepWindow(10, 0, 0.1, 1.0), "steps"),
        (StepWindow(10, 12, 0.1, 1.0), "steps"),
        (StepWindow(10, 1, -0.1, 1.0), "step_seconds"),
        (StepWindow(10, 1, math.inf, 1.0), "step_seconds"),
        (StepWindow(10, 1, 0.1, math.nan), "samples_per_second"),
        (StepWindow(10, 1, 0.1, -5.0), "samples_per_second"),
    ],
)
def test_bad_windows_name_the_field(window: StepWindow, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate(window)
    assert raised.value.field == field


def test_missing_identity_fails_startup_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("STRIDE_AGENT_JOB_ID", "STRIDE_AGENT_POD_NAME", "STRIDE_AGENT_ROLE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StartupError) as raised:
        load_settings(AgentSettings)
    message = str(raised.value)
    for name in ("STRIDE_AGENT_JOB_ID", "STRIDE_AGENT_POD_NAME", "STRIDE_AGENT_ROLE"):
        assert name in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STRIDE_AGENT_JOB_ID", "job.with.dots"),
        ("STRIDE_AGENT_ROLE", "boss"),
        ("STRIDE_AGENT_POD_NAME", "bad name"),
        ("STRIDE_AGENT_DISPATCHER_ADDRESS", "nohost"),
    ],
)
def test_malformed_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("STRIDE_AGENT_JOB_ID", "job-1")
    monkeypatch.setenv("STRIDE_AGENT_POD_NAME", "job-1-worker-0")
    monkeypatch.setenv("STRIDE_AGENT_ROLE", "worker")
    monkeypatch.setenv(name, value)
    with pytest.raises(StartupError, match=name):
        load_settings(AgentSettings)


def test_the_entry_point_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STRIDE_AGENT_JOB_ID", raising=False)
    assert run_service(AgentSettings, build, None, argv=[]) == EXIT_STARTUP_FAILED
    assert "STRIDE_AGENT_JOB_ID: Field required" in capsys.readouterr().err


def test_settings_defaults_listen_on_loopback() -> None:
    settings = AgentSettings(job_id="job-1", pod_name="p-0", role="worker")  # type: ignore[arg-type]
    assert settings.grpc_host == "127.0.0.1" and settings.grpc_port == 50058
    assert settings.role is Role.WORKER


async def test_control_channel_fans_out_and_stops_late_watchers() -> None:
    channel = ControlChannel()
    async with channel.subscribe() as first, channel.subscribe() as second:
        assert channel.watchers == 2
        channel.send(ControlCommand(ControlAction.PAUSE, "migration", plan_version=3))
        channel.close("bye")
        channel.close("again")
        for queue in (first, second):
            assert (await queue.get()).action is ControlAction.PAUSE
            stop = await queue.get()
            assert (stop.action, stop.reason) == (ControlAction.STOP, "bye")
            assert queue.empty()
    assert channel.watchers == 0
    async with channel.subscribe() as late:
        command = await asyncio.wait_for(late.get(), 1)
        assert command.action is ControlAction.STOP
