"""Network partitions for `make chaos`: cut chosen processes off from chosen local ports.

A partition is a real packet filter, not a process that stops answering: the processes to
cut are moved into a cgroup v2 group of their own (membership needs no controller, so it
works where only cgroup v1 controllers are writable and v2 is mounted beside them), and an
nftables table drops every packet their sockets send to the ports (``socket cgroupv2``,
matched in the output hook, so established connections stall as they would behind a broken
switch, and new ones time out). Everything else on the machine keeps talking to those ports.
Healing deletes the table and moves the processes back.

Needs root, nftables (``nft``; Debian's ``nftables`` package: ``make system-deps``) and a
cgroup v2 hierarchy (``/sys/fs/cgroup`` itself, or ``/sys/fs/cgroup/unified`` on a hybrid
machine). :func:`unavailable` says what is missing. On a machine with only cgroup v2 the
processes leave their own (pod or service) group while cut, and so its limits; on a hybrid
machine (v1 controllers, as here) their v1 groups and limits stay as they were.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
TABLE_PREFIX = "stride_chaos_"


def _v2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (the whole tree, or its hybrid mount)."""
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.procs").is_file() and (candidate / "cgroup.threads").exists():
            return candidate
    return None


def unavailable() -> str | None:
    """Why partitions cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("nft") is None:
        return "nft not found (install Debian's nftables: make system-deps)"
    if _v2_root() is None:
        return "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified"
    return None


@dataclass
class Partition:
    """``pids`` cut off from local TCP ``ports`` until :meth:`heal`."""

    name: str
    pids: tuple[int, ...]
    ports: tuple[int, ...]

    @property
    def _group(self) -> Path:
        root = _v2_root()
        assert root is not None
        return root / f"stride-chaos-{self.name}"

    @property
    def _table(self) -> str:
        return TABLE_PREFIX + self.name.replace("-", "_")

    def cut(self) -> None:
        """Move the processes into the partition's group and drop what they send."""
        group = self._group
        group.mkdir(exist_ok=True)
        for pid in self.pids:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue  # it ended meanwhile: nothing to cut
        # The path nft resolves is relative to /sys/fs/cgroup; the level is the group's
        # depth in the v2 hierarchy (1: a child of its root).
        path = group.relative_to(CGROUP_ROOT)
        ports = ", ".join(str(port) for port in self.ports)
        rules = (
            f"table inet {self._table} {{\n"
            "  chain output {\n"
            "    type filter hook output priority 0; policy accept;\n"
            f'    socket cgroupv2 level 1 "{path}" tcp dport {{ {ports} }} drop\n'
            "  }\n"
            "}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)

    def heal(self) -> None:
        """Delete the filter and move the processes back to the hierarchy's root."""
        subprocess.run(
            ["nft", "delete", "table", "inet", self._table], check=False, capture_output=True
        )
        group = self._group
        if not group.exists():
            return
        root = group.parent
        for line in (group / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(line)
            except ProcessLookupError:
                continue
        group.rmdir()


def port_of(address: str) -> int:
    """The port of ``host:port`` or a URL ``scheme://host:port``."""
    return int(address.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
