"""Simulation reports: complete or absent, and every table states where it comes from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from stride.sim import report
from stride.sim.report import RunContext, write_report


@dataclass(frozen=True)
class Result:
    deadline_ratio: float
    scaling_events: int
    label: str


CONTEXT = RunContext(
    environment="deadline",
    trace="itp-ef/cluster01.csv",
    window="jobs 0-99",
    cluster="n16g8",
    seed=7,
    stride_version="0.1.0",
    command="stride sim --env deadline",
)


def test_report_has_context_table_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = write_report(out, CONTEXT, {"stride": Result(0.9, 3, "a"), "edf": Result(0.5, 0, "b")})
    text = report.read_text()
    for fact in ("itp-ef/cluster01.csv", "jobs 0-99", "n16g8", "seed: 7", "0.1.0"):
        assert fact in text
    assert "| stride | 0.9 | 3 | a |" in text and "| edf | 0.5 | 0 | b |" in text
    assert sorted(p.name for p in out.glob("*.png")) == ["deadline_ratio.png", "scaling_events.png"]
    assert (out / "deadline_ratio.png").read_bytes()[:4] == b"\x89PNG"


def test_a_failed_report_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^results\.broken: expected a result dataclass"):
        write_report(out, CONTEXT, {"stride": Result(0.9, 3, "a"), "broken": object()})
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="results"):
        write_report(out, CONTEXT, {})


def test_a_failure_midway_removes_the_staging_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def plot_then_fail(path: Path, metric: str, *_: object) -> None:
        calls.append(metric)
        path.write_bytes(b"partial")
        if len(calls) == 2:
            raise OSError("disk full")

    monkeypatch.setattr(report, "_plot", plot_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(
            tmp_path / "run", CONTEXT, {"stride": Result(0.9, 3, "a"), "edf": Result(0.5, 0, "b")}
        )
    assert list(tmp_path.iterdir()) == []
