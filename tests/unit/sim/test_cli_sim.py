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
        "--env",
        "deadline",
        "--trace",
        str(SHARED_TRACES / "itp-ef" / "195job.csv"),
        "--cluster",
        str(SHARED_TRACES / "cluster_specs" / "n16g8.csv"),
        "--curves",
        str(SHARED_TRACES / "throughputs_A100"),
        "--window",
        "first:20",
        "--policies",
        "stride,edf",
        "--seed",
        "3",
        "--out",
        str(out),
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
