"""Kernel limits for local pods: cgroup v2, cgroup v1, or the rlimit fallback.

The kubelet enforces a pod's limits through cgroups; the local backend does the same on
one machine (issue #12). Each pod gets its own group:

- **cgroup v2** (one unified hierarchy): ``memory.max``, ``cpu.max`` ("quota period"), the
  ``oom_kill`` line of ``memory.events``, ``memory.current`` and ``cpu.stat``'s
  ``usage_usec``. The parent must delegate ``+memory +cpu`` in ``cgroup.subtree_control``.
- **cgroup v1** (a hierarchy per controller): ``memory.limit_in_bytes``,
  ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, the ``oom_kill`` line of
  ``memory.oom_control``, ``memory.usage_in_bytes`` and ``cpuacct.usage`` (the cpuacct
  controller may be mounted apart from cpu; a group is made in each hierarchy).
- **rlimit**: no cgroup can be written (no root, no delegation). Memory is enforced by
  sampling the pod's resident memory (the shim kills a pod over its limit, reported as
  OOMKilled "by the sampler"); there is no CPU quota. ``note`` says so.

Groups are made under the podwatcher's own group in each hierarchy (``<own>/stride/
<pod>``), so limits nest inside whatever the machine gave Stride.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from stride.podwatcher.adapters.outbound.backends.localpods.shim import read_oom_kills

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
"""CFS period of a pod's CPU quota: the kernel's and the kubelet's 100 ms. A 10 ms period
was measured slower for sub-core TensorFlow pods (bench/dataworkers_live.py, 0.2-core
trainers: 3,470 and 8,067 samples/s without and with data workers, against 6,161 and 13,704
at 100 ms): their threads spend a short quota at once and wait out more periods."""
GROUP_DIR = "stride"


class Enforcement(StrEnum):
    """How a pod's limits are enforced."""

    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    RLIMIT = "rlimit"


class CgroupError(Exception):
    """A cgroup operation failed; the message names the file and the kernel's answer."""


def _own_groups(proc_cgroup: str) -> dict[str, str]:
    """Controller -> this process's group path, from ``/proc/self/cgroup``'s text."""
    groups: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@dataclass(frozen=True)
class PodGroup:
    """The cgroup directories of one pod (empty in rlimit mode)."""

    memory: Path | None
    cpu: Path | None
    cpuacct: Path | None
    v2: bool

    @property
    def dirs(self) -> tuple[Path, ...]:
        """Every directory of the group, without duplicates."""
        seen: list[Path] = []
        for path in (self.memory, self.cpu, self.cpuacct):
            if path is not None and path not in seen:
                seen.append(path)
        return tuple(seen)

    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join the group."""
        return [str(path / "cgroup.procs") for path in self.dirs]

    def oom_file(self) -> str:
        """The file whose ``oom_kill`` line counts the group's OOM kills ('' if none)."""
        if self.memory is None:
            return ""
        return str(self.memory / ("memory.events" if self.v2 else "memory.oom_control"))


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as error:
        raise CgroupError(f"{path}: {error.strerror or error}") from error


class Cgroups:
    """Creates, limits, measures and removes pods' groups in the detected mode."""

    def __init__(self, enforcement: Enforcement | None = None, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        try:
            own = _own_groups(Path("/proc/self/cgroup").read_text())
        except OSError:
            own = {}
        v2_base = root / own.get("", "/").lstrip("/") / GROUP_DIR
        v1_bases = {
            c: root / c / own.get(c, "/").lstrip("/") / GROUP_DIR
            for c in ("memory", "cpu", "cpuacct")
        }
        detected, why = self._detect(own)
        if enforcement is None:
            enforcement = detected
        elif enforcement is not Enforcement.RLIMIT and enforcement is not detected:
            works = why or f"{detected.value} is what works"
            raise CgroupError(f"{enforcement.value} was asked for but cannot be used here: {works}")
        self.enforcement = enforcement
        self.v2_base = v2_base
        self.v1_bases = v1_bases
        if enforcement is Enforcement.CGROUP_V2:
            self.note = "cgroup-v2: memory and CPU limits enforced by the kernel"
        elif enforcement is Enforcement.CGROUP_V1:
            self.note = "cgroup-v1: memory and CPU limits enforced by the kernel"
        else:
            reason = why or "asked for"
            self.note = (
                f"rlimit: no cgroup is used ({reason}); memory is enforced by sampling each "
                "pod's resident memory, and there is no CPU quota"
            )

    def _detect(self, own: dict[str, str]) -> tuple[Enforcement, str]:
        root = self.root
        if (root / "cgroup.controllers").is_file():
            base = root / own.get("", "/").lstrip("/")
            controllers = (
                (base / "cgroup.controllers").read_text().split()
                if (base / "cgroup.controllers").is_file()
                else []
            )
            if _writable(base) and {"memory", "cpu"} <= set(controllers):
                return Enforcement.CGROUP_V2, ""
            return (
                Enforcement.RLIMIT,
                f"cgroup v2 at {base} is not writable or does not delegate memory and cpu",
            )
        memory = root / "memory" / own.get("memory", "/").lstrip("/")
        cpu = root / "cpu" / own.get("cpu", "/").lstrip("/")
        if _writable(memory) and _writable(cpu):
            return Enforcement.CGROUP_V1, ""
        return (
            Enforcement.RLIMIT,
            f"no writable cgroup v1 memory and cpu groups at {memory} and {cpu}",
        )

    def group(self, pod: str) -> PodGroup:
        """The (possibly not yet created) group of ``pod``."""
        if self.enforcement is Enforcement.CGROUP_V2:
            path = self.v2_base / pod
            return PodGroup(path, path, path, True)
        if self.enforcement is Enforcement.CGROUP_V1:
            cpuacct = self.v1_bases["cpuacct"]
            return PodGroup(
                self.v1_bases["memory"] / pod,
                self.v1_bases["cpu"] / pod,
                cpuacct / pod if cpuacct.parent.exists() else None,
                False,
            )
        return PodGroup(None, None, None, False)

    def create(self, pod: str, cpu: float, memory_bytes: int) -> PodGroup:
        """Make the pod's group with its limits (idempotent)."""
        group = self.group(pod)
        if self.enforcement is Enforcement.CGROUP_V2:
            parent = self.v2_base
            if not parent.exists():
                parent.mkdir(parents=True, exist_ok=True)
            for level in (parent.parent, parent):
                try:
                    (level / "cgroup.subtree_control").write_text("+memory +cpu")
                except OSError as error:
                    raise CgroupError(
                        f"{level}/cgroup.subtree_control: {error.strerror}"
                    ) from error
        for path in group.dirs:
            path.mkdir(parents=True, exist_ok=True)
        self.limit(group, cpu, memory_bytes)
        return group

    def limit(self, group: PodGroup, cpu: float, memory_bytes: int) -> None:
        """Set the group's CPU quota and memory limit (raises CgroupError with the file)."""
        quota = max(int(cpu * PERIOD_US), 1000)
        if self.enforcement is Enforcement.CGROUP_V2 and group.memory is not None:
            _write(group.memory / "cpu.max", f"{quota} {PERIOD_US}")
            _write(group.memory / "memory.max", str(memory_bytes))
        elif (
            self.enforcement is Enforcement.CGROUP_V1
            and group.memory is not None
            and group.cpu is not None
        ):
            _write(group.cpu / "cpu.cfs_period_us", str(PERIOD_US))
            _write(group.cpu / "cpu.cfs_quota_us", str(quota))
            _write(group.memory / "memory.limit_in_bytes", str(memory_bytes))

    def memory_limit(self, group: PodGroup) -> int | None:
        """The memory limit the kernel has for the group."""
        if group.memory is None:
            return None
        name = "memory.max" if group.v2 else "memory.limit_in_bytes"
        try:
            text = (group.memory / name).read_text().strip()
        except OSError:
            return None
        return None if text == "max" else int(text)

    def cpu_quota(self, group: PodGroup) -> float | None:
        """The group's CPU quota in cores (None: unlimited or no group)."""
        if group.cpu is None:
            return None
        try:
            if group.v2:
                quota, period = (group.cpu / "cpu.max").read_text().split()
            else:
                quota = (group.cpu / "cpu.cfs_quota_us").read_text().strip()
                period = (group.cpu / "cpu.cfs_period_us").read_text().strip()
        except (OSError, ValueError):
            return None
        return None if quota in ("max", "-1") else int(quota) / int(period)

    def memory_usage(self, group: PodGroup) -> int | None:
        """The group's memory use now."""
        if group.memory is None:
            return None
        name = "memory.current" if group.v2 else "memory.usage_in_bytes"
        try:
            return int((group.memory / name).read_text().strip())
        except (OSError, ValueError):
            return None

    def cpu_seconds(self, group: PodGroup) -> float | None:
        """CPU time the group has used, in seconds."""
        try:
            if group.v2 and group.cpu is not None:
                for line in (group.cpu / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
            elif group.cpuacct is not None:
                return int((group.cpuacct / "cpuacct.usage").read_text().strip()) / 1e9
        except (OSError, ValueError):
            return None
        return None

    def oom_kills(self, group: PodGroup) -> int:
        """How many processes of the group the kernel OOM-killed."""
        return read_oom_kills(group.oom_file())

    def remove(self, group: PodGroup) -> bool:
        """Remove the group's directories (once empty; missing ones are fine); whether none
        is left. A group whose processes are still exiting (a moment after a kill) stays:
        the runtime tries it again (``LocalPods``'s groups left)."""
        left = False
        for path in group.dirs:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left = True
        return not left
