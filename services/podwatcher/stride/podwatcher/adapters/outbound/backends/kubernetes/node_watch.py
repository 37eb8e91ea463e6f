"""Stride's nodes as the cluster has them (:mod:`.nodes` says what drained means): an
informer of Nodes, cordons for Stride's drains, and the draining nodes handed over to be
emptied."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from stride.podwatcher.adapters.outbound.backends.kubernetes import nodes
from stride.podwatcher.adapters.outbound.backends.kubernetes.api import api_error
from stride.podwatcher.adapters.outbound.backends.kubernetes.informer import Informer
from stride.podwatcher.domain.nodes import NodeSpec

log = structlog.get_logger(__name__)


class NodeWatch:
    """The node inventory, drains, and which nodes to empty."""

    def __init__(
        self,
        core: client.CoreV1Api,
        selector: str,
        empty: Callable[[str], Coroutine[Any, Any, None]],
        changed: Callable[[], None],
    ) -> None:
        """``empty``: evict Stride's pods from a node being drained; ``changed``: a node
        came, went or changed (the use cases check the inventory)."""
        self.core = core
        self.empty = empty
        self.changed = changed
        self.informer = Informer("nodes", core.list_node, self._event, label_selector=selector)
        self.tasks: list[asyncio.Task[None]] = []
        self._emptying: set[str] = set()

    def _event(self, kind: str, node: dict[str, Any]) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        if kind != "DELETED" and nodes.evicting(node):
            if name not in self._emptying:
                self._emptying.add(name)
                self.tasks.append(asyncio.create_task(self.empty(name)))
        else:
            self._emptying.discard(name)
        self.changed()

    def all_nodes(self) -> list[tuple[NodeSpec, bool]]:
        """Every node of Stride's and whether it is drained."""
        found = [
            (nodes.node_spec(node), nodes.drained(node)) for node in self.informer.objects.values()
        ]
        return sorted(found, key=lambda item: item[0].name)

    def nodes(self) -> list[NodeSpec]:
        return [spec for spec, drained in self.all_nodes() if not drained]

    def set_drained(self, name: str, drained: bool) -> bool:
        """Cordon or uncordon the node (in the background; the watch brings the change)."""
        if name not in self.informer.objects:
            return False
        node = self.informer.objects[name]
        node.setdefault("spec", {})["unschedulable"] = drained or None
        self.tasks.append(asyncio.create_task(self._cordon(name, drained)))
        return True

    async def _cordon(self, name: str, drained: bool) -> None:
        try:
            await self.core.patch_node(name, nodes.cordon_patch(drained))
        except ApiException as error:
            log.warning("could not cordon the node", node=name, why=api_error(error))
