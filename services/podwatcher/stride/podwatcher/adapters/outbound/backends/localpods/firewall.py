"""Only a job's own pods reach its TensorFlow servers (#37 finding 1).

A TensorFlow server (``tf.distribute.Server``) listens on every interface, without
authentication, and runs whatever graph a client sends it: another job's pod that reaches a
PS reads the job's files and variables through it. The pod sandbox (:mod:`.sandbox`) keeps
such a read inside the pod's own files; this keeps other jobs out altogether.

Each job's pod processes join a cgroup v2 group of their own (membership only, no
controller: it works beside cgroup v1 limits, as on these machines), under one group for
all of this pod watcher's pods. An nftables table holds, for each pod's TensorFlow port:

- output: a connection to the port from a socket of *another* job's pod group is reset
  (``socket cgroupv2``; the pod watcher's own readiness probe, outside every pod group,
  passes);
- input: a connection to the port from anywhere but loopback is dropped (the local backend's
  pods all reach each other on loopback).

Rules are named by their pod (``comment``) and removed when its end is acknowledged; a pod
watcher restarted meanwhile finds them in the kernel with the pods it re-adopts. Needs root,
``nft`` and a cgroup v2 hierarchy (:func:`unavailable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
REGISTRY = Path("/run/stride-pod-firewalls")
"""Which state folder each table guards (a file per table, naming it): a table whose state
folder is gone (a removed test folder, a deleted suite) is swept by the next pod watcher.
In /run, like the tables themselves: both end with the machine's boot."""


def v2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (the whole tree, or its hybrid mount)."""
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.procs").is_file() and (candidate / "cgroup.threads").exists():
            return candidate
    return None


def unavailable() -> str | None:
    """Why the TensorFlow ports cannot be guarded here, or None."""
    if os.geteuid() != 0:
        return "not root: nftables rules cannot be written"
    if shutil.which("nft") is None:
        return "nft not found (Debian's nftables package)"
    if v2_root() is None:
        return "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified"
    return None


class TfFirewall:
    """The nftables table and pod groups of one pod watcher's state folder."""

    def __init__(self, state_dir: Path) -> None:
        root = v2_root()
        if root is None:
            raise RuntimeError("no cgroup v2 hierarchy")
        digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
        self.pods_group = root / f"stride-pods-{digest}"
        self.table = f"stride_pods_{digest}"
        sweep_stale()
        REGISTRY.mkdir(mode=0o700, exist_ok=True)
        (REGISTRY / digest).write_text(str(state_dir.resolve()))
        self.pods_group.mkdir(exist_ok=True)
        self._nft(
            f"add table inet {self.table}\n"
            f"add chain inet {self.table} output "
            "{ type filter hook output priority 0; policy accept; }\n"
            f"add chain inet {self.table} input "
            "{ type filter hook input priority 0; policy accept; }\n"
        )

    def remove(self) -> None:
        """Remove the table and the groups (when no pod of this state folder runs)."""
        _remove(self.table, self.pods_group)
        (REGISTRY / self.table.removeprefix("stride_pods_")).unlink(missing_ok=True)

    def prune(self, known: list[str]) -> None:
        """Remove the rules of pods that are not ``known`` (ended while no pod watcher
        ran), and the groups of jobs left without any."""
        stale = {(chain, handle) for chain, handle, pod, _job in self._rules() if pod not in known}
        if stale:
            self._nft(
                "".join(
                    f"delete rule inet {self.table} {chain} handle {handle}\n"
                    for chain, handle in sorted(stale)
                )
            )
        self.forget_idle_jobs()

    def job_group(self, job_id: str) -> Path:
        """The job's pod group (made if missing): its pods' processes join it."""
        group = self.pods_group / job_id
        group.mkdir(exist_ok=True)
        return group

    def procs_file(self, job_id: str) -> str:
        """Where a process of the job's pods writes its pid to join the job's group."""
        return str(self.job_group(job_id) / "cgroup.procs")

    def guard(self, pod: str, job_id: str, port: int) -> None:
        """Let only ``job_id``'s pods (and this machine's suite) reach ``pod``'s ``port``."""
        self.release(pod)
        pods = self.pods_group.relative_to(CGROUP_ROOT)
        job = self.job_group(job_id).relative_to(CGROUP_ROOT)
        comment = f'comment "pod={pod} job={job_id}"'
        self._nft(
            f"add rule inet {self.table} output tcp dport {port} "
            f'socket cgroupv2 level 1 "{pods}" socket cgroupv2 level 2 != "{job}" '
            f"reject with tcp reset {comment}\n"
            f'add rule inet {self.table} input iifname != "lo" tcp dport {port} drop {comment}\n'
        )

    def release(self, pod: str) -> None:
        """Remove ``pod``'s rules (none: nothing to do)."""
        commands = [
            f"delete rule inet {self.table} {chain} handle {handle}"
            for chain, handle in self._handles(pod)
        ]
        if commands:
            self._nft("\n".join(commands) + "\n")

    def forget_idle_jobs(self) -> None:
        """Remove the groups of jobs none of whose pods has rules (a group with a process
        in it stays: the kernel refuses to remove it)."""
        guarded = {job for _chain, _handle, _pod, job in self._rules()}
        for group in self.pods_group.iterdir():
            if group.is_dir() and group.name not in guarded:
                with contextlib.suppress(OSError):
                    group.rmdir()

    def _handles(self, pod: str) -> list[tuple[str, int]]:
        return [(chain, handle) for chain, handle, _pod, _job in self._rules(pod)]

    def _rules(self, pod: str | None = None) -> list[tuple[str, int, str, str]]:
        """(chain, handle, pod, job) of the rules of ``pod`` (None: of every pod)."""
        listed = subprocess.run(
            ["nft", "-j", "-a", "list", "table", "inet", self.table],
            capture_output=True,
            text=True,
            check=True,
        )
        found = []
        for item in json.loads(listed.stdout).get("nftables", []):
            rule = item.get("rule") or {}
            named = dict(
                word.split("=", 1) for word in str(rule.get("comment", "")).split() if "=" in word
            )
            if "pod" in named and (pod is None or named["pod"] == pod):
                chain, handle = str(rule["chain"]), int(rule["handle"])
                found.append((chain, handle, named["pod"], named.get("job", "")))
        return found

    def _nft(self, commands: str) -> None:
        done = subprocess.run(
            ["nft", "-f", "-"], input=commands, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"nft refused the TensorFlow port rules: {done.stderr.strip()}")


def _remove(table: str, pods_group: Path) -> None:
    subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)
    if pods_group.exists():
        for group in pods_group.iterdir():
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            pods_group.rmdir()


def sweep_stale(under: Path | None = None) -> int:
    """Remove the tables and groups of state folders that are gone, and with ``under``, of
    every state folder below it (a test session's folder at its end); how many."""
    root = v2_root()
    if root is None or not REGISTRY.is_dir():
        return 0
    swept = 0
    for entry in REGISTRY.iterdir():
        with contextlib.suppress(OSError):
            state = Path(entry.read_text().strip())
            below = under is not None and state.is_relative_to(under)
            if state.exists() and not below:
                continue
            _remove(f"stride_pods_{entry.name}", root / f"stride-pods-{entry.name}")
            entry.unlink()
            swept += 1
    return swept
