"""Where the services of a running suite are, as `stride up` recorded them.

An explicit ``STRIDE_<SERVICE>_ADDRESS`` always wins (a remote or compose deployment);
otherwise the CLI reads ``endpoints.json`` in the state directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUITE = ("admission", "optimizer", "executor", "configdb", "dispatcher", "ckptcache", "podwatcher")
"""Services `stride up` runs. The agent is not among them: it runs inside training pods."""


@dataclass
class SuiteState:
    """What `stride up` wrote about the suite it runs."""

    supervisor_pid: int
    nats_url: str
    embedded_nats: bool
    database: str
    services: dict[str, str] = field(default_factory=dict)
    ready: bool = False
    error: str = ""

    def write(self, state_dir: Path) -> None:
        """Write atomically, so a reader never sees half a file."""
        target = state_dir / "endpoints.json"
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2))
        temporary.replace(target)

    @classmethod
    def read(cls, state_dir: Path) -> SuiteState | None:
        """The recorded state, or None if no suite was started there."""
        try:
            return cls(**json.loads((state_dir / "endpoints.json").read_text()))
        except FileNotFoundError:
            return None


class NoSuite(RuntimeError):
    """No address is configured and no suite is running."""


def address(service: str, state_dir: Path) -> str:
    """host:port of ``service``'s gRPC API."""
    configured = os.environ.get(f"STRIDE_{service.upper()}_ADDRESS")
    if configured:
        return configured
    state = SuiteState.read(state_dir)
    if state is None or not state.ready or service not in state.services:
        raise NoSuite(
            f"no running suite in {state_dir}: run `stride up`, "
            f"or set STRIDE_{service.upper()}_ADDRESS=host:port"
        )
    return state.services[service]


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
