"""The pod sandbox's policy (localpods.sandbox): what a pod's processes are started with and
may touch. Its enforcement on real pods: tests/integration/test_podwatcher_pods.py."""

from __future__ import annotations

from pathlib import Path

from stride.podwatcher.adapters.outbound.backends.localpods import ProcessSpec
from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import (
    DROP_PRIVILEGES,
    PodSandboxes,
    SandboxPolicy,
    forbidden_overlap,
    policy,
)


def test_a_pod_is_started_without_privileges_in_its_own_folders(tmp_path: Path) -> None:
    code = (str(tmp_path / "venv"),)
    sandboxes = PodSandboxes(code, (tmp_path / "pod-tls",))
    pod_dir, job_dir, tokens = tmp_path / "pods" / "p", tmp_path / "jobs" / "j", tmp_path / "t"
    processes = (ProcessSpec("trainer", ("python", "-m", "x"), {"A": "1"}),)
    confined, sandbox = sandboxes.confine(processes, pod_dir, job_dir, tokens)
    (trainer,) = confined
    assert trainer.argv == (*DROP_PRIVILEGES, "python", "-m", "x")
    assert trainer.env == {"A": "1", "TMPDIR": str(pod_dir / "tmp"), "HOME": str(pod_dir)}
    assert (pod_dir / "tmp").is_dir()
    assert sandbox.read_write == (str(pod_dir), str(job_dir))
    assert {str(tmp_path / "venv"), str(tmp_path / "pod-tls"), str(tokens)} <= set(sandbox.read)
    assert "/tmp" not in sandbox.read and "/dev" not in sandbox.read  # shared: nobody's
    assert SandboxPolicy.from_json(sandbox.to_json()) == sandbox


def test_a_readable_folder_that_holds_the_suites_secrets_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    opened = policy(code=(str(tmp_path),), read=(), read_write=())
    assert forbidden_overlap(opened, (state / "tokens",)) == (
        f"{tmp_path} (readable by pods) holds {state / 'tokens'}"
    )
    closed = policy(code=(str(tmp_path / "venv"),), read=(), read_write=())
    assert forbidden_overlap(closed, (state / "tokens",)) is None
