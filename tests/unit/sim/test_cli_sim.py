"""`stride sim` as a user runs it: a report on success, one error line naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stride.testing import SHARED_TRACES


def stride_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_deadline_run_writes_a_report_with_context(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = stride_sim(
        *_deadline_args(out, "--window", "first:20", "--policies", "stride,edf", "--seed", "3")
    )
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "seed: 3" in text and "first:20 (20 jobs)" in text and "128 GPUs" in text
    assert "| stride |" in text and "| edf |" in text and "| gandiva |" not in text
    assert list(out.glob("*.png")), "metrics that differ between policies are plotted"
    document = json.loads((out / "results.json").read_text())
    assert document["context"]["seed"] == 3
    assert set(document["results"]) == {"stride", "edf"}
    assert document["results"]["stride"]["jobs"] == 20
    assert document["results"]["stride"]["placement"] == "buddy"


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report"
    missing = stride_sim("--env", "deadline", "--out", str(out))
    assert (
        missing.returncode == 2 and "--trace, --cluster and --curves are required" in missing.stderr
    )
    unknown = stride_sim("--env", "dataworkers", "--policies", "magic", "--out", str(out))
    assert unknown.returncode == 2 and "--policies: unknown magic" in unknown.stderr
    bad_trace = tmp_path / "bad.csv"
    bad_trace.write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
        "1,0,100,resnet50,x,64,1,100\n"
    )
    broken = stride_sim(
        "--env",
        "deadline",
        "--trace",
        str(bad_trace),
        "--cluster",
        str(SHARED_TRACES / "cluster_specs" / "n16g8.csv"),
        "--curves",
        str(SHARED_TRACES / "throughputs_A100"),
        "--out",
        str(out),
    )
    assert broken.returncode == 2
    assert "bad.csv:2" in broken.stderr and "deadline" in broken.stderr
    assert "Traceback" not in broken.stderr
    assert not out.exists()


def _deadline_args(out: Path, *extra: str) -> list[str]:
    return [
        "--env",
        "deadline",
        "--trace",
        str(SHARED_TRACES / "itp-ef" / "195job.csv"),
        "--cluster",
        str(SHARED_TRACES / "cluster_specs" / "n16g8.csv"),
        "--curves",
        str(SHARED_TRACES / "throughputs_A100"),
        "--out",
        str(out),
        *extra,
    ]


def test_elasticflow_model_report_shows_guarantees_bound_and_usage(tmp_path: Path) -> None:
    out = tmp_path / "ef"
    result = stride_sim(
        *_deadline_args(
            out,
            "--model",
            "elasticflow",
            "--slot",
            "240",
            "--window",
            "first:30",
            "--policies",
            "stride,elasticflow,elasticflow-noac,edf",
            "--curve-error",
            "0.1",
            "--best-effort-fraction",
            "0.2",
            "--seed",
            "4",
        )
    )
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "cost model: elasticflow" in text and "rounds at least 240 s apart" in text
    assert "curve error +-0.1" in text and "best-effort fraction 0.2" in text
    assert "## Guarantees and the physical bound" in text
    assert "| physical bound |" in text and "admitted hard deadlines met" in text
    assert "gpu_utilization.png" in text and (out / "gpu_utilization.png").is_file()
    document = json.loads((out / "results.json").read_text())
    assert set(document["physical_bound"]) == {"all", "lambda_ge_1", "lambda_lt_1"}
    for name, row in document["results"].items():
        assert row["model"] == "elasticflow"
        assert row["admitted"] + row["declined"] == 30, name
        assert row["best_effort"] > 0 and row["curve_error"] == 0.1
    assert document["results"]["elasticflow-noac"]["declined"] == 0


def test_model_options_are_checked_and_named(tmp_path: Path) -> None:
    out = tmp_path / "bad"
    for options, message in (
        (("--model", "pollux"), "--model: 'pollux' is not one of stride, elasticflow"),
        (("--model", "elasticflow", "--slot", "0"), "--slot: must be a finite number"),
        (("--pause", "-1"), "--pause: must be a finite number of seconds >= 0"),
        (("--curve-error", "1.5"), "--curve-error: must be in [0, 1)"),
        (("--best-effort-fraction", "2"), "--best-effort-fraction: must be in [0, 1]"),
        (("--model", "elasticflow", "--policies", "pollux"), "--policies: unknown pollux"),
    ):
        result = stride_sim(*_deadline_args(out, *options))
        assert result.returncode == 2, options
        assert message in result.stderr, (options, result.stderr)
        assert "Traceback" not in result.stderr
        assert not out.exists()
    wrong_env = stride_sim("--env", "dataworkers", "--model", "elasticflow", "--out", str(out))
    assert wrong_env.returncode == 2 and "apply to --env deadline only" in wrong_env.stderr


ITP_RAW_01 = SHARED_TRACES / "itp-raw" / "cluster01.csv"


def test_dataworkers_trace_window_report(tmp_path: Path) -> None:
    # Cluster01's jobs submitted in hours 672-688: five, two of them on 64 GPUs.
    out = tmp_path / "dw"
    result = stride_sim(
        "--env",
        "dataworkers",
        "--trace",
        str(ITP_RAW_01),
        "--window",
        "2419200:2476800",
        "--policies",
        "no-dw-tuned,goldminer-srtf",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    text = (out / "report.md").read_text()
    assert "cluster01.csv (arrivals, GPUs and durations)" in text
    assert "2419200:2476800 (5 jobs, arrivals from the first at 0 s)" in text
    assert "per-job CPU demands are synthetic" in text and "elasticflow-traces (MIT)" in text
    document = json.loads((out / "results.json").read_text())
    srtf, tuned = document["results"]["goldminer-srtf"], document["results"]["no-dw-tuned"]
    assert srtf["num_jobs"] == tuned["num_jobs"] == 5
    # Both 64-GPU jobs are too large for data workers on the 64-GPU testbed.
    assert srtf["fallback_jobs"] >= 2 and tuned["fallback_jobs"] == 0
    # The last job arrives 41,430 s after the first and runs at least 40,379 s.
    assert srtf["makespan_s"] >= 41_430 + 40_379 and tuned["makespan_s"] >= 41_430 + 40_379


def test_dataworkers_trace_errors_name_the_option(tmp_path: Path) -> None:
    out = tmp_path / "dw"
    malformed = tmp_path / "bad.csv"
    malformed.write_text("job_id,submission_time,duration,num_gpu\na,0,600,two\n")
    missing = SHARED_TRACES / "itp-raw" / "cluster11.csv"
    for options, message in (
        (("--trace", str(missing)), f"--trace: no file {missing}"),
        (("--trace", str(malformed)), "--trace: " + str(malformed) + ":2 num_gpu: is not a number"),
        (("--trace", str(ITP_RAW_01), "--window", "0:28800"), "--window: '0:28800' lies outside"),
        (("--trace", str(ITP_RAW_01), "--window", "1940000:1990000"), "holds no job"),
        (("--trace", str(ITP_RAW_01), "--window", "1990000:1990000"), "END must be after START"),
        (("--trace", str(ITP_RAW_01), "--window", "8h"), "--window: '8h' is not START:END"),
        (("--window", "first:5"), "--window: applies to --env dataworkers only with --trace"),
    ):
        result = stride_sim("--env", "dataworkers", *options, "--out", str(out))
        assert result.returncode == 2, options
        assert message in result.stderr, (options, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not out.exists()
