"""Named, versioned algorithms with typed requests and replies: the executor's plug-ins.

DLRover implements its optimization algorithms "as plugin functions" so each optimization
can switch between them and they can be iterated without touching running jobs (sec. 4.3).
Here a plug-in is an :class:`AlgorithmSpec`: a name, a version, the dataclasses it takes and
returns, and a pure function. The executor looks specs up by name and version and carries
requests and replies as plain dicts (see :mod:`stride.policy.serialization`).

Versions are whole numbers from 1. Asking for no version (None or 0) gets the newest, so a
caller that pins a version keeps its behaviour while a new one is rolled out beside it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass
from typing import Any, Generic, TypeVar

from stride.policy.serialization import InvalidRequest, from_dict, to_dict

__all__ = [
    "AlgorithmSpec",
    "InvalidRequest",
    "Registry",
    "UnknownAlgorithm",
    "default_registry",
    "from_dict",
    "to_dict",
]

RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
"""Lower-case letters, digits, '-' and '_': a name is one NATS subject token
(``stride.executor.v1.run.<name>``) and one path segment of ``name/version``."""


class UnknownAlgorithm(LookupError):
    """No algorithm is registered under the name (or the name has no such version)."""

    def __init__(self, name: str, version: int | None, known: str) -> None:
        wanted = repr(name) if version is None else f"{name!r} version {version}"
        super().__init__(f"no algorithm {wanted} is registered ({known})")
        self.name = name
        self.version = version


@dataclass(frozen=True)
class AlgorithmSpec(Generic[RequestT, ReplyT]):
    """One registered algorithm: what it is called, what it takes, what it returns."""

    name: str
    version: int
    description: str
    """One line, naming the paper section it implements."""
    request_type: type[RequestT]
    reply_type: type[ReplyT]
    run: Callable[[RequestT], ReplyT]
    """Pure and synchronous; the executor runs it off the event loop."""

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"name: {self.name!r} must match {NAME_PATTERN.pattern}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"version: must be a whole number >= 1, got {self.version!r}")
        for field_name in ("request_type", "reply_type"):
            kind = getattr(self, field_name)
            if not (isinstance(kind, type) and is_dataclass(kind)):
                raise ValueError(f"{field_name}: {kind!r} is not a dataclass")

    @property
    def qualified_name(self) -> str:
        """``name/version``, as recorded in plans and replies."""
        return f"{self.name}/{self.version}"

    def parse_request(self, arguments: Mapping[str, Any]) -> RequestT:
        """The typed request from a plain dict; raises :class:`InvalidRequest`."""
        return from_dict(self.request_type, arguments)

    def run_typed(self, request: RequestT) -> ReplyT:
        """Run on a typed request and check the reply's type (a wrong one is a bug)."""
        reply = self.run(request)
        if not isinstance(reply, self.reply_type):
            raise TypeError(
                f"{self.qualified_name} returned {type(reply).__name__}, "
                f"not {self.reply_type.__name__}"
            )
        return reply

    def run_dict(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Parse, run and serialize: plain dict in, plain dict out."""
        return to_dict(self.run_typed(self.parse_request(arguments)))


class Registry:
    """Algorithms by name and version."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[int, AlgorithmSpec[Any, Any]]] = {}

    def register(self, spec: AlgorithmSpec[Any, Any]) -> AlgorithmSpec[Any, Any]:
        """Add ``spec``; registering a name and version twice is an error."""
        versions = self._specs.setdefault(spec.name, {})
        if spec.version in versions:
            raise ValueError(f"{spec.qualified_name} is already registered")
        versions[spec.version] = spec
        return spec

    def get(self, name: str, version: int | None = None) -> AlgorithmSpec[Any, Any]:
        """The spec of ``name`` at ``version``, or its newest when version is None or 0."""
        versions = self._specs.get(name)
        if not versions:
            names = ", ".join(sorted(self._specs)) or "none"
            raise UnknownAlgorithm(name, version or None, f"known: {names}")
        if not version:
            return versions[max(versions)]
        spec = versions.get(version)
        if spec is None:
            known = ", ".join(str(v) for v in sorted(versions))
            raise UnknownAlgorithm(name, version, f"{name} has versions {known}")
        return spec

    def list(self) -> list[AlgorithmSpec[Any, Any]]:
        """Every registered spec, by name, then version ascending."""
        return [
            self._specs[name][version]
            for name in sorted(self._specs)
            for version in sorted(self._specs[name])
        ]


PLUGIN_MODULES: tuple[str, ...] = (
    "stride.policy.cold_start",
    "stride.policy.throughput",
    "stride.policy.fitting",
    "stride.policy.oom",
    "stride.policy.pareto",
    "stride.policy.selection",
    "stride.policy.warm_start",
    "stride.policy.stages",
    "stride.policy.cluster_round",
    "stride.policy.goldminer",
    "stride.policy.dlrover",
    "stride.policy.kod2",
    "stride.policy.elasticflow",
)
"""Modules whose ``ALGORITHMS`` tuple Stride ships. Imported on first use, because each
plug-in module imports :class:`AlgorithmSpec` from here."""


def default_registry() -> Registry:
    """A registry with every algorithm Stride ships (a new one each call: no shared state)."""
    registry = Registry()
    for module_name in PLUGIN_MODULES:
        module = importlib.import_module(module_name)
        for spec in module.ALGORITHMS:
            registry.register(spec)
    return registry
