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

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from stride.podwatcher.adapters.outbound.backends.localpods.firewall import (
    CGROUP_ROOT,
    unavailable,
)
from stride.podwatcher.adapters.outbound.backends.localpods.firewall import v2_root as _v2_root

__all__ = ["Partition", "port_of", "unavailable"]

TABLE_PREFIX = "stride_chaos_"


@dataclass
class Partition:
    """``pids`` cut off from local TCP ``ports`` until :meth:`heal`."""

    name: str
    pids: tuple[int, ...]
    ports: tuple[int, ...]
    _homes: dict[int, Path] = field(default_factory=dict)
    """Each process's own v2 group before the cut (a pod's job group), to go back to."""

    @property
    def _group(self) -> Path:
        root = _v2_root()
        assert root is not None
        return root / f"stride-chaos-{self.name}"

    @property
    def _table(self) -> str:
        return TABLE_PREFIX + self.name.replace("-", "_")

    def cut(self) -> None:
        """Drop what the processes send to the ports: on the connections they hold now
        (matched by their local ports: a socket keeps the cgroup it was made in) and on
        any they open while cut (their new sockets are made in the partition's group)."""
        group = self._group
        group.mkdir(exist_ok=True)
        for pid in self.pids:
            try:
                self._homes[pid] = _v2_group(pid)
                (group / "cgroup.procs").write_text(str(pid))
            except (ProcessLookupError, FileNotFoundError):
                continue  # it ended meanwhile: nothing to cut
        # The path nft resolves is relative to /sys/fs/cgroup; the level is the group's
        # depth in the v2 hierarchy (1: a child of its root).
        path = group.relative_to(CGROUP_ROOT)
        ports = ", ".join(str(port) for port in self.ports)
        held = ", ".join(str(port) for port in _local_ports(self.pids, self.ports))
        rules = (
            f"table inet {self._table} {{\n"
            "  chain output {\n"
            "    type filter hook output priority 0; policy accept;\n"
            f'    socket cgroupv2 level 1 "{path}" tcp dport {{ {ports} }} drop\n'
            + (f"    tcp sport {{ {held} }} tcp dport {{ {ports} }} drop\n" if held else "")
            + "  }\n"
            "}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)

    def heal(self) -> None:
        """Delete the filter and move the processes back to the groups they came from."""
        subprocess.run(
            ["nft", "delete", "table", "inet", self._table], check=False, capture_output=True
        )
        group = self._group
        if not group.exists():
            return
        root = group.parent
        for line in (group / "cgroup.procs").read_text().split():
            home = self._homes.get(int(line), root)
            try:
                (home / "cgroup.procs").write_text(line)
            except (ProcessLookupError, FileNotFoundError):
                continue
        group.rmdir()


def _v2_group(pid: int) -> Path:
    """The v2 group ``pid`` is in now (``0::<path>`` in its /proc cgroup file)."""
    root = _v2_root()
    assert root is not None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return root


def _local_ports(pids: tuple[int, ...], ports: tuple[int, ...]) -> list[int]:
    """The local ports of the established TCP connections ``pids`` hold to ``ports``."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True
    )
    wanted = {f"pid={pid}," for pid in pids}
    found = []
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) < 5 or not any(mark in line for mark in wanted):
            continue
        local, peer = fields[2], fields[3]
        if int(peer.rsplit(":", 1)[1]) in ports:
            found.append(int(local.rsplit(":", 1)[1]))
    return sorted(set(found))


def port_of(address: str) -> int:
    """The port of ``host:port`` or a URL ``scheme://host:port``."""
    return int(address.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
