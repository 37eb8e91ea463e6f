"""Local pods: process groups under kernel limits that outlive the podwatcher.

:class:`LocalPods` starts each pod through its shim (:mod:`.shim`), which supervises the
pod's processes and records how the pod ended in ``exit.json``. The runtime reads those
records and reports every end through :meth:`LocalPods.exits` until the caller
acknowledges it, so an end is never lost: one that happened while no podwatcher ran is
reported after the next one adopts the pods (:meth:`LocalPods.adopt`). A pod's state
lives in ``<state_dir>/pods/<pod>/``: ``launch.json`` (what to run, its limits and
labels), ``shim.pid`` (the shim's pid and start time, so a reused pid is never mistaken
for the shim), ``pids.json``, the processes' logs, and ``exit.json``.

Under memory pressure the runtime evicts, as the kubelet does: when the machine's
available memory falls below ``eviction_threshold_bytes`` it evicts the pod whose use most
exceeds its request (:func:`stride.podwatcher.domain.nodes.choose_eviction`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from stride.podwatcher.adapters.outbound.backends.localpods import shim
from stride.podwatcher.adapters.outbound.backends.localpods.cgroups import (
    CgroupError,
    Cgroups,
    Enforcement,
    PodGroup,
)
from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import SandboxPolicy
from stride.podwatcher.domain.nodes import PodUsage as PodMemory
from stride.podwatcher.domain.nodes import choose_eviction
from stride.runtime.processes import start_time

CLOSE_GROUPS_SECONDS = 2.0
"""How long :meth:`LocalPods.close` waits for the groups of pods that just ended to empty."""

log = structlog.get_logger(__name__)

MIB = 1024**2
SHIM_MODULE = "stride.podwatcher.adapters.outbound.backends.localpods.shim"
START_TIMEOUT_SECONDS = 10.0
EVICTION_CHECK_SECONDS = 1.0


class ExitReason(StrEnum):
    """How a pod ended (Kubernetes' words)."""

    SUCCEEDED = "Succeeded"
    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    ERROR = "Error"
    DELETED = "Deleted"


@dataclass(frozen=True)
class Limits:
    """A pod's CPU quota (cores) and memory limit (bytes)."""

    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a pod."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


@dataclass(frozen=True)
class PodLaunch:
    """What a pod runs, where, and how big."""

    pod: str
    job_id: str
    role: str
    index: int
    node: str
    plan_version: int
    limits: Limits
    processes: tuple[ProcessSpec, ...]
    main: str
    labels: Mapping[str, str] = field(default_factory=dict)
    sandbox: SandboxPolicy | None = None
    """What the pod's processes may touch (:mod:`.sandbox`); None: they are not confined."""
    groups: tuple[str, ...] = ()
    """Other cgroups' ``cgroup.procs`` the processes join (the job's, :mod:`.firewall`)."""


@dataclass(frozen=True)
class PodStatus:
    """A running pod."""

    launch: PodLaunch
    pids: Mapping[str, int]
    started_at: float


@dataclass(frozen=True)
class PodExit:
    """How a pod ended."""

    pod: str
    job_id: str
    reason: ExitReason
    exit_code: int | None
    message: str
    log_tail: tuple[str, ...]
    finished_at: float


@dataclass(frozen=True)
class Usage:
    """A pod's CPU (cores, since the previous sample) and memory use now."""

    cpu_cores: float
    memory_bytes: int
    sampled_at: float


class ResizeRefused(Exception):
    """The pod cannot be resized in place; the message says why."""


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def _launch_to_json(launch: PodLaunch) -> dict[str, Any]:
    return {
        "pod": launch.pod,
        "job_id": launch.job_id,
        "role": launch.role,
        "index": launch.index,
        "node": launch.node,
        "plan_version": launch.plan_version,
        "cpu": launch.limits.cpu,
        "memory_bytes": launch.limits.memory_bytes,
        "processes": [
            {"name": p.name, "argv": list(p.argv), "env": dict(p.env)} for p in launch.processes
        ],
        "main": launch.main,
        "labels": dict(launch.labels),
        "sandbox": launch.sandbox.to_json() if launch.sandbox is not None else None,
        "groups": list(launch.groups),
    }


def _launch_from_json(data: Mapping[str, Any]) -> PodLaunch:
    return PodLaunch(
        pod=data["pod"],
        job_id=data["job_id"],
        role=data["role"],
        index=int(data["index"]),
        node=data["node"],
        plan_version=int(data["plan_version"]),
        limits=Limits(float(data["cpu"]), int(data["memory_bytes"])),
        processes=tuple(
            ProcessSpec(p["name"], tuple(p["argv"]), dict(p["env"])) for p in data["processes"]
        ),
        main=data["main"],
        labels=dict(data.get("labels", {})),
        sandbox=SandboxPolicy.from_json(data["sandbox"]) if data.get("sandbox") else None,
        groups=tuple(data.get("groups", ())),
    )


class LocalPods:
    """Starts, limits, watches, resizes, evicts, deletes and re-adopts local pods."""

    def __init__(
        self,
        state_dir: Path,
        *,
        enforcement: Enforcement | None = None,
        eviction_threshold_bytes: int = 256 * MIB,
        poll_seconds: float = 0.2,
        available_memory: Callable[[], int] | None = None,
        grace_seconds: float = 10.0,
    ) -> None:
        try:
            self.cgroups = Cgroups(enforcement)
        except CgroupError as error:
            raise ValueError(str(error)) from error
        self.enforcement = self.cgroups.enforcement
        self.enforcement_note = self.cgroups.note
        self.dir = state_dir / "pods"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.eviction_threshold_bytes = eviction_threshold_bytes
        self.poll_seconds = poll_seconds
        self.available_memory = available_memory or _available_memory
        self.grace_seconds = grace_seconds
        self._shims: dict[str, subprocess.Popen[bytes]] = {}
        self._known: dict[str, PodStatus] = {}
        self._yielded: set[str] = set()
        self._groups_left: set[str] = set()
        """Ended pods whose cgroup could not be removed yet (a process was still exiting):
        tried again at every poll of :meth:`exits`. Before, they stayed for good (1,154
        empty groups were found on a machine after many test runs)."""
        self._cpu: dict[str, tuple[float, float]] = {}
        self._closed = False
        self._last_eviction_check = 0.0

    # --- paths and records ---------------------------------------------------------------

    def pod_dir(self, pod: str) -> Path:
        return self.dir / pod

    def _shim_alive(self, pod: str) -> bool:
        child = self._shims.get(pod)
        if child is not None:
            return child.poll() is None
        try:
            recorded = json.loads((self.pod_dir(pod) / "shim.pid").read_text())
        except (OSError, ValueError):
            return False
        return bool(start_time(int(recorded["pid"])) == recorded.get("start_time"))

    def _read_exit(self, pod: str) -> PodExit | None:
        pod_dir = self.pod_dir(pod)
        try:
            data = json.loads((pod_dir / "exit.json").read_text())
            launch = json.loads((pod_dir / "launch.json").read_text())
        except (OSError, ValueError):
            return None
        return PodExit(
            pod=pod,
            job_id=launch["job_id"],
            reason=ExitReason(data["reason"]),
            exit_code=data.get("exit_code"),
            message=data.get("message", ""),
            log_tail=tuple(data.get("log_tail", ())),
            finished_at=float(data.get("finished_at", time.time())),
        )

    # --- starting ------------------------------------------------------------------------

    async def start(self, launch: PodLaunch) -> PodStatus:
        """Start ``launch`` (a running pod of that name is returned as it is)."""
        known = self._known.get(launch.pod)
        if known is not None and self._shim_alive(launch.pod):
            return known
        pod_dir = self.pod_dir(launch.pod)
        pod_dir.mkdir(parents=True, exist_ok=True)
        self._groups_left.discard(launch.pod)  # its group is the new pod's again
        for stale in ("exit.json", "stop-reason", "pids.json", "shim.pid"):
            with contextlib.suppress(FileNotFoundError):
                (pod_dir / stale).unlink()
        try:
            group = self.cgroups.create(launch.pod, launch.limits.cpu, launch.limits.memory_bytes)
        except CgroupError as error:
            raise RuntimeError(f"pod {launch.pod}: cannot set its limits: {error}") from error
        record = _launch_to_json(launch)
        record["procs_files"] = group.procs_files() + list(launch.groups)
        record["oom_file"] = group.oom_file()
        record["sample_memory_limit"] = (
            launch.limits.memory_bytes if self.enforcement is Enforcement.RLIMIT else 0
        )
        record["grace_seconds"] = self.grace_seconds
        (pod_dir / "launch.json").write_text(json.dumps(record))
        with (pod_dir / "shim.log").open("ab") as shim_log:
            # Started without waiting for it: the shim's own end is read from exit.json.
            child = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", SHIM_MODULE, str(pod_dir)],
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._shims[launch.pod] = child
        (pod_dir / "shim.pid").write_text(
            json.dumps({"pid": child.pid, "start_time": start_time(child.pid)})
        )
        self._yielded.discard(launch.pod)
        pids = await self._wait_for_pids(launch.pod, child)
        status = PodStatus(launch, pids, time.time())
        self._known[launch.pod] = status
        log.info(
            "pod started",
            pod=launch.pod,
            enforcement=self.enforcement.value,
            cpu=launch.limits.cpu,
            memory_bytes=launch.limits.memory_bytes,
        )
        return status

    async def _wait_for_pids(self, pod: str, child: subprocess.Popen[bytes]) -> dict[str, int]:
        path = self.pod_dir(pod) / "pids.json"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return {k: int(v) for k, v in json.loads(path.read_text()).items()}
            if child.poll() is not None and not (self.pod_dir(pod) / "exit.json").exists():
                shim_log = (self.pod_dir(pod) / "shim.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"pod {pod}: its supervisor exited at start: {shim_log}")
            await asyncio.sleep(0.02)
        return {}

    # --- changing and stopping -------------------------------------------------------------

    async def resize(self, pod: str, limits: Limits) -> None:
        """Change the CPU quota and memory limit in place, or raise :class:`ResizeRefused`."""
        status = self._known.get(pod)
        if status is None or not self._shim_alive(pod):
            raise ResizeRefused(f"pod {pod} is not running")
        group = self.cgroups.group(pod)
        used = self._memory_used(pod, group)
        if used is not None and limits.memory_bytes < used:
            raise ResizeRefused(
                f"memory {limits.memory_bytes // MIB} MiB is below the pod's current usage "
                f"{used // MIB} MiB"
            )
        try:
            self.cgroups.limit(group, limits.cpu, limits.memory_bytes)
        except CgroupError as error:
            raise ResizeRefused(f"the kernel refused the new limits: {error}") from error
        launch = PodLaunch(**{**status.launch.__dict__, "limits": limits})
        self._known[pod] = PodStatus(launch, status.pids, status.started_at)
        path = self.pod_dir(pod) / "launch.json"
        record = json.loads(path.read_text())
        record.update(cpu=limits.cpu, memory_bytes=limits.memory_bytes)
        if self.enforcement is Enforcement.RLIMIT:
            record["sample_memory_limit"] = limits.memory_bytes  # read at the next start only
        path.write_text(json.dumps(record))

    async def _stop(self, pod: str, reason: ExitReason, why: str, grace_seconds: float) -> PodExit:
        pod_dir = self.pod_dir(pod)
        existing = self._read_exit(pod)
        if existing is not None:
            return existing
        (pod_dir / "stop-reason").write_text(f"{reason.value} {why}")
        pid = self._shim_pid(pod)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds + 5.0
        while time.monotonic() < deadline:
            found = self._read_exit(pod)
            if found is not None:
                return found
            if not self._shim_alive(pod):
                break
            await asyncio.sleep(0.05)
        # The shim is gone or stuck: kill what is left of the pod and record the end here.
        self._kill_leftovers(pod)
        record = {
            "reason": reason.value,
            "exit_code": None,
            "message": f"{why} (its supervisor did not answer; its processes were killed)",
            "log_tail": shim.tail(pod_dir, self._process_names(pod)),
            "finished_at": time.time(),
        }
        (pod_dir / "exit.json").write_text(json.dumps(record))
        found = self._read_exit(pod)
        assert found is not None
        return found

    async def delete(self, pod: str, grace_seconds: float | None = None) -> PodExit:
        """Stop the pod (SIGTERM, then SIGKILL after the grace period): Deleted."""
        end = await self._stop(
            pod,
            ExitReason.DELETED,
            "deleted",
            self.grace_seconds if grace_seconds is None else grace_seconds,
        )
        self._cleanup_after_end(pod)  # exits() still reports the end
        return end

    async def evict(self, pod: str, why: str) -> PodExit:
        """Stop the pod to relieve the machine's memory: Evicted."""
        log.warning("evicting pod", pod=pod, why=why)
        end = await self._stop(pod, ExitReason.EVICTED, why, 2.0)
        self._cleanup_after_end(pod)  # exits() still reports the end
        return end

    def _shim_pid(self, pod: str) -> int | None:
        child = self._shims.get(pod)
        if child is not None:
            return child.pid
        try:
            recorded = json.loads((self.pod_dir(pod) / "shim.pid").read_text())
        except (OSError, ValueError):
            return None
        pid = int(recorded["pid"])
        return pid if start_time(pid) == recorded.get("start_time") else None

    def _process_names(self, pod: str) -> list[str]:
        try:
            launch = json.loads((self.pod_dir(pod) / "launch.json").read_text())
        except (OSError, ValueError):
            return []
        return [p["name"] for p in launch.get("processes", [])]

    def _kill_leftovers(self, pod: str) -> None:
        try:
            pids = json.loads((self.pod_dir(pod) / "pids.json").read_text())
        except (OSError, ValueError):
            pids = {}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
        group = self.cgroups.group(pod)
        for procs in group.procs_files():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(procs).read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(line), signal.SIGKILL)

    # --- adoption and ends -------------------------------------------------------------------

    def adopt(self) -> list[PodStatus]:
        """Pods an earlier runtime started: running ones are adopted, ended ones reported."""
        adopted: list[PodStatus] = []
        for pod_dir in sorted(self.dir.iterdir()):
            pod = pod_dir.name
            if not (pod_dir / "launch.json").exists() or pod in self._known:
                continue
            try:
                launch = _launch_from_json(json.loads((pod_dir / "launch.json").read_text()))
            except (OSError, ValueError, KeyError):
                continue
            if (pod_dir / "exit.json").exists():
                self._known[pod] = PodStatus(launch, {}, 0.0)  # its end is reported by exits()
                continue
            if not self._shim_alive(pod):
                # The shim vanished without recording an end (killed with the machine's
                # processes): whatever is left of the pod goes, and the end is an Error.
                self._kill_leftovers(pod)
                record = {
                    "reason": ExitReason.ERROR.value,
                    "exit_code": None,
                    "message": "the pod's supervisor vanished; the pod was lost",
                    "log_tail": shim.tail(pod_dir, [p.name for p in launch.processes]),
                    "finished_at": time.time(),
                }
                (pod_dir / "exit.json").write_text(json.dumps(record))
                self._known[pod] = PodStatus(launch, {}, 0.0)
                continue
            try:
                pids = {
                    k: int(v) for k, v in json.loads((pod_dir / "pids.json").read_text()).items()
                }
            except (OSError, ValueError):
                pids = {}
            status = PodStatus(launch, pids, (pod_dir / "launch.json").stat().st_mtime)
            self._known[pod] = status
            adopted.append(status)
        # The groups an earlier runtime of this folder could not remove (it stopped before
        # its pods' last processes had exited) go now; a running pod's stays.
        running = {status.launch.pod for status in adopted}
        for pod_dir in self.dir.iterdir():
            if pod_dir.name not in running and not self._shim_alive(pod_dir.name):
                self._groups_left.add(pod_dir.name)
        self._remove_groups_left()
        log.info("local pods adopted", count=len(adopted))
        return adopted

    def known(self) -> list[str]:
        """Every pod this runtime watches: running, or ended with the end not acknowledged."""
        return list(self._known)

    def pods(self) -> list[PodStatus]:
        """The pods running now."""
        return [
            status
            for pod, status in self._known.items()
            if not (self.pod_dir(pod) / "exit.json").exists() and self._shim_alive(pod)
        ]

    async def exits(self) -> AsyncIterator[PodExit]:
        """Every end not yet acknowledged, once per runtime (again after a restart)."""
        while not self._closed:
            for pod in list(self._known):
                if pod in self._yielded:
                    continue
                end = self._read_exit(pod)
                if end is None and pod in self._known and not self._shim_alive(pod):
                    await asyncio.sleep(0.05)  # the shim writes exit.json just before it exits
                    end = self._read_exit(pod)
                    if end is None:
                        self._kill_leftovers(pod)
                        record: dict[str, Any] = {
                            "reason": ExitReason.ERROR.value,
                            "exit_code": None,
                            "message": "the pod's supervisor died; the pod was lost",
                            "log_tail": [],
                            "finished_at": time.time(),
                        }
                        (self.pod_dir(pod) / "exit.json").write_text(json.dumps(record))
                        end = self._read_exit(pod)
                if end is None:
                    continue
                self._yielded.add(pod)
                self._cleanup_after_end(pod)
                yield end
            await self._check_memory_pressure()
            self._remove_groups_left()
            await asyncio.sleep(self.poll_seconds)

    def _cleanup_after_end(self, pod: str) -> None:
        child = self._shims.pop(pod, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        self._groups_left.add(pod)
        self._remove_groups_left()

    def _remove_groups_left(self) -> None:
        for pod in list(self._groups_left):
            if self.cgroups.remove(self.cgroups.group(pod)):
                self._groups_left.discard(pod)

    async def acknowledge(self, pod: str) -> None:
        """The end of ``pod`` is recorded: forget it (its logs stay)."""
        pod_dir = self.pod_dir(pod)
        if (pod_dir / "exit.json").exists():
            for name in ("launch.json", "exit.json", "pids.json", "shim.pid", "stop-reason"):
                with contextlib.suppress(FileNotFoundError):
                    (pod_dir / name).unlink()
        self._known.pop(pod, None)
        self._yielded.discard(pod)
        self._cpu.pop(pod, None)

    async def _check_memory_pressure(self) -> None:
        if self.eviction_threshold_bytes <= 0:
            return
        now = time.monotonic()
        if now - self._last_eviction_check < EVICTION_CHECK_SECONDS:
            return
        self._last_eviction_check = now
        available = self.available_memory()
        if available >= self.eviction_threshold_bytes:
            return
        candidates = []
        for status in self.pods():
            used = self._memory_used(status.launch.pod, self.cgroups.group(status.launch.pod))
            candidates.append(
                PodMemory(status.launch.pod, status.launch.limits.memory_bytes, used or 0)
            )
        victim = choose_eviction(candidates)
        if victim is not None:
            await self.evict(
                victim,
                f"the machine's available memory {available // MIB} MiB fell below "
                f"{self.eviction_threshold_bytes // MIB} MiB",
            )

    # --- usage and logs ------------------------------------------------------------------------

    def _memory_used(self, pod: str, group: PodGroup) -> int | None:
        used = self.cgroups.memory_usage(group)
        if used is not None:
            return used
        status = self._known.get(pod)
        if status is None or not status.pids:
            return None
        return shim.tree_rss(list(status.pids.values()))

    def _cpu_seconds(self, pod: str, group: PodGroup) -> float | None:
        seconds = self.cgroups.cpu_seconds(group)
        if seconds is not None:
            return seconds
        status = self._known.get(pod)
        if status is None:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in status.pids.values():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (
                    int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
                ) / ticks
        return total

    def usage(self, pod: str) -> Usage | None:
        """CPU cores used since the previous sample, and memory used now."""
        if pod not in self._known or (self.pod_dir(pod) / "exit.json").exists():
            return None
        group = self.cgroups.group(pod)
        memory = self._memory_used(pod, group)
        seconds = self._cpu_seconds(pod, group)
        now = time.monotonic()
        cores = 0.0
        if seconds is not None:
            previous = self._cpu.get(pod)
            if previous is not None and now > previous[0]:
                cores = max(seconds - previous[1], 0.0) / (now - previous[0])
            self._cpu[pod] = (now, seconds)
        return Usage(cores, memory or 0, time.time())

    def log_tail(self, pod: str, lines: int = 100) -> list[str]:
        """The last ``lines`` lines of the pod's processes' logs."""
        pod_dir = self.pod_dir(pod)
        names = self._process_names(pod) or sorted(
            p.stem for p in pod_dir.glob("*.log") if p.stem != "shim"
        )
        return shim.tail(pod_dir, names, lines)

    async def follow_logs(self, pod: str) -> AsyncIterator[list[str]]:
        """New log lines as they are written, until the pod has ended."""
        pod_dir = self.pod_dir(pod)
        names = self._process_names(pod) or sorted(
            p.stem for p in pod_dir.glob("*.log") if p.stem != "shim"
        )
        offsets = {}
        for name in names:
            with contextlib.suppress(OSError):
                offsets[name] = (pod_dir / f"{name}.log").stat().st_size
        partial: dict[str, str] = {}
        while True:
            ended = (pod_dir / "exit.json").exists() or not (pod_dir / "launch.json").exists()
            batch: list[str] = []
            for name in names:
                path = pod_dir / f"{name}.log"
                try:
                    with path.open("rb") as log_file:
                        log_file.seek(offsets.get(name, 0))
                        chunk = log_file.read(1 << 20)
                except OSError:
                    continue
                offsets[name] = offsets.get(name, 0) + len(chunk)
                text = partial.pop(name, "") + chunk.decode("utf-8", "replace")
                *complete, rest = text.split("\n")
                if rest:
                    partial[name] = rest
                batch.extend(f"{name}| {line}" for line in complete)
            if batch:
                yield batch
            if ended and not batch:
                return
            await asyncio.sleep(self.poll_seconds)

    async def close(self) -> None:
        """Stop watching; the pods keep running. The groups of ended ones go, waited for a
        moment: a pod deleted just before (a test's or a bench's teardown) still has
        processes exiting."""
        self._closed = True
        deadline = time.monotonic() + CLOSE_GROUPS_SECONDS
        self._remove_groups_left()
        while self._groups_left and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            self._remove_groups_left()
