"""Finding the streamcache node in the ROS graph (docs/interfaces.md "Finding the node"): the
namespaces that serve its Ask service, decided once the graph has settled, never one picked by chance."""
from __future__ import annotations

import time
from typing import Callable

ASK_SERVICE_TYPE = "streamcache_ros_interfaces/srv/Ask"


class NodeNotFound(TimeoutError):
    """No streamcache node answered in time (not running, another ROS_DOMAIN_ID, ...)."""


class NodeNotConfigured(NodeNotFound):
    """The node is there, unconfigured: it serves nothing until it is configured (said at once)."""


# How long the graph must stay the same before a client with no namespace trusts what it sees:
# discovery reports nodes one by one, so an early look may hold one node of several
# (docs/interfaces.md "Finding the node").
SETTLE_S = 2.0


def find_namespaces(node) -> list[str]:
    """Namespaces of the streamcache nodes ``node`` can see ('' for the root namespace)."""
    found = []
    for name, types in node.get_service_names_and_types():
        if name.endswith("/ask") and ASK_SERVICE_TYPE in types:
            found.append(name[: -len("/ask")])
    return sorted(found)


def discover_namespace(node, timeout: float, spin: Callable[[float], None] | None = None,
                       settle: float = SETTLE_S) -> str:
    """The namespace of the one streamcache node in the graph, decided once the graph has settled:
    the nodes found (and how many serve each ``ask``) unchanged for ``settle`` seconds, or at
    ``timeout`` with what was found by then. NodeNotFound when none was found, LookupError (naming
    every node found) when several were: a node is never picked by chance."""
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while True:
        found = {ns: node.count_services(f"{ns}/ask") for ns in find_namespaces(node)}
        now = time.monotonic()
        if found != seen:
            seen, since = found, now
        if found and (now - since >= settle or now > deadline):
            return the_one(found)
        if now > deadline:
            raise NodeNotFound(f"no streamcache node found within {timeout:.0f} s "
                               f"(ROS domain {node.context.get_domain_id()})")
        (spin or time.sleep)(0.1)


def the_one(found: dict[str, int]) -> str:
    """The one namespace in ``found`` (namespace -> nodes serving its ``ask``); LookupError otherwise."""
    if len(found) > 1:
        raise LookupError(f"{len(found)} streamcache nodes: {', '.join(ns or '/' for ns in sorted(found))}; "
                          "name one with --namespace (StreamCacheClient(namespace=...))")
    ((namespace, servers),) = found.items()
    if servers > 1:
        raise LookupError(f"{servers} nodes serve {namespace}/ask: a call would reach either; give each node a "
                          "namespace of its own")
    return namespace
