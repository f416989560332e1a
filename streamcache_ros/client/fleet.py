"""Which robot saw it: one ``when`` asked of every streamcache node on the graph at once, the answers
merged by stamp (docs/places.md "Which robot saw it").

    from streamcache_ros.client.fleet import ask_fleet
    answer = ask_fleet("Did you see a red circle?")       # mode last: the newest sighting first
    if answer.best is not None:
        print(answer.best.node, answer.best.stamp, answer.best.pose)
    answer.no_answer, answer.refused                      # nodes silent within timeout_s; refusals

It runs on a participant of its own (``OwnParticipant``), as ``StreamCacheClient`` does, and serves
nothing: every node's ``when`` is called from one client node, all the calls in flight together, so
the fleet answers in the time of its slowest robot, and a robot that never answers costs
``timeout_s`` once, not once per robot.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field

from .discovery import SETTLE_S
from .participant import OwnParticipant
from .replies import FramePose, frame_pose, place_request, to_time

WHEN_SERVICE_TYPE = "streamcache_ros_interfaces/srv/When"
FLEET_MODES = ("last", "first")

_instances = itertools.count()


@dataclass
class FleetEntry:
    """One robot's answer: ``node`` its namespace ('/' for the root), ``name`` the node's full name."""

    node: str
    name: str
    found: bool
    stamp: float | None
    pose: FramePose | None
    camera: str
    yes_probability: float
    found_by: str
    reply: object = field(repr=False, default=None)


@dataclass
class FleetAnswer:
    """The fleet's answers: ``entries`` those found (newest first for mode last, oldest first for
    first), then those that answered not found; ``no_answer`` the nodes silent within the timeout;
    ``refused`` node -> the node's reason."""

    question: str
    mode: str
    entries: list[FleetEntry]
    no_answer: list[str]
    refused: dict[str, str]

    @property
    def best(self) -> FleetEntry | None:
        return self.entries[0] if self.entries and self.entries[0].found else None


def _when_servers(node) -> dict[str, int]:
    """namespace -> how many nodes serve its ``when``, for every ``when`` of streamcache's type."""
    found = {}
    for name, types in node.get_service_names_and_types():
        if name.endswith("/when") and WHEN_SERVICE_TYPE in types:
            namespace = name[: -len("/when")]
            found[namespace] = node.count_services(name)
    return found


def find_nodes(node, timeout: float = 10.0, settle: float = SETTLE_S) -> list[str]:
    """The namespaces ('' for the root) of every streamcache node ``node`` (an rclpy node, or an
    OwnParticipant) can see, once the graph has settled: unchanged for ``settle`` seconds, or what
    was seen at ``timeout``. Discovery reports nodes one by one, so an early look may miss some
    (docs/interfaces.md "Finding the node"); empty when none was seen."""
    node = getattr(node, "node", node)
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while True:
        found = _when_servers(node)
        now = time.monotonic()
        if found != seen:
            seen, since = found, now
        if (found and now - since >= settle) or now >= deadline:
            return sorted(found)
        time.sleep(0.1)


def _node_names(node, namespaces: list[str]) -> dict[str, str]:
    """namespace -> the full name of the node serving its ``when`` (the namespace when unseen)."""
    wanted = {f"{ns}/when": ns for ns in namespaces}
    names = {}
    for name, namespace in node.get_node_names_and_namespaces():
        try:
            services = node.get_service_names_and_types_by_node(name, namespace)
        except Exception:  # noqa: BLE001 - the node left the graph meanwhile
            continue
        for service, _ in services:
            if service in wanted:
                names[wanted[service]] = f"{namespace.rstrip('/')}/{name}"
    return {ns: names.get(ns, ns or "/") for ns in namespaces}


def _entry(namespace: str, name: str, reply) -> FleetEntry:
    stamp = reply.stamp.sec + reply.stamp.nanosec * 1e-9 if reply.found else None
    pose = frame_pose(reply.pose) if reply.found and reply.has_pose else None
    return FleetEntry(namespace or "/", name, bool(reply.found), stamp, pose, reply.camera,
                      float(reply.yes_probability), reply.found_by, reply)


def merge(question: str, mode: str, answered: list[FleetEntry], no_answer: list[str],
          refused: dict[str, str]) -> FleetAnswer:
    """The found entries by stamp (newest first for last, oldest first for first), then the rest by node."""
    sign = -1.0 if mode == "last" else 1.0  # ties go to the first node by name either way
    found = sorted((e for e in answered if e.found), key=lambda e: (sign * e.stamp, e.node))
    rest = sorted((e for e in answered if not e.found), key=lambda e: e.node)
    return FleetAnswer(question, mode, found + rest, sorted(no_answer), refused)


def ask_fleet(question: str, mode: str = "last", timeout_s: float = 60.0, place=None, since=None, until=None,
              domain_id: int | None = None, camera: str = "", discover_s: float = 10.0,
              namespaces: list[str] | None = None, participant: OwnParticipant | None = None) -> FleetAnswer:
    """``when(question, mode)`` asked of every streamcache node (``namespaces``: these only; None:
    ``find_nodes`` within ``discover_s``), all at once; replies after ``timeout_s`` are not waited
    for: those nodes are named in ``no_answer``. ``place``, ``since``, ``until`` and ``camera`` as in
    ``StreamCacheClient.when``: a named place means whatever each robot's own places_file says.
    ``participant``: one to reuse (left open); None: one of its own, closed on return.
    LookupError when no node was found."""
    from streamcache_ros_interfaces.srv import When  # noqa: PLC0415

    if mode not in FLEET_MODES:
        raise ValueError(f"ask_fleet merges stamps: mode must be one of {FLEET_MODES}, got {mode!r}")
    own = participant is None
    if own:
        participant = OwnParticipant(f"streamcache_fleet_{os.getpid()}_{next(_instances)}", domain_id)
    node = participant.node
    clients = []
    try:
        if namespaces is None:
            namespaces = find_nodes(node, discover_s)
        namespaces = [("/" + ns.strip("/")) if ns.strip("/") else "" for ns in namespaces]
        if not namespaces:
            raise LookupError(f"no streamcache node found within {discover_s:.0f} s "
                              f"(ROS domain {node.context.get_domain_id()})")
        names = _node_names(node, namespaces)
        request = When.Request(question=question, mode=mode, camera=camera, since=to_time(since),
                               until=to_time(until), **place_request(place))
        deadline = time.monotonic() + timeout_s
        clients = [(ns, node.create_client(When, f"{ns}/when")) for ns in namespaces]
        # a request sent before its server is matched is lost: each is sent once its server is seen,
        # and a server never seen by the deadline counts as not answering
        pending = dict(clients)
        futures, done = {}, threading.Event()
        while pending and time.monotonic() < deadline:
            for ns, client in list(pending.items()):
                if client.service_is_ready():
                    futures[ns] = client.call_async(request)
                    futures[ns].add_done_callback(lambda _: done.set())
                    del pending[ns]
            if pending:
                time.sleep(0.05)
        while not all(f.done() for f in futures.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(min(left, 0.1))
            done.clear()
        answered, refused, silent = [], {}, list(pending)
        for ns, future in futures.items():
            if not future.done():
                silent.append(ns)
            elif future.exception() is not None:
                refused[ns or "/"] = str(future.exception())
            elif not future.result().success:
                refused[ns or "/"] = future.result().error_message
            else:
                answered.append(_entry(ns, names[ns], future.result()))
        return merge(question, mode, answered, [ns or "/" for ns in silent], refused)
    finally:
        if own:
            participant.close()  # its clients go with it
        else:
            for _, client in clients:  # a caller's participant keeps spinning: destroyed between two waits
                participant.in_spin_thread(node.destroy_client, client)


def pose_text(pose: FramePose | None) -> str:
    """A frame's pose as the CLI prints it: ``x=1.20 y=-3.40 yaw=0.52 (map)``; 'no pose' for None."""
    if pose is None:
        return "no pose"
    return f"x={pose.x:.2f} y={pose.y:.2f} yaw={pose.yaw:.2f} ({pose.frame_id})"


def fleet_lines(answer: FleetAnswer, timeout_s: float) -> list[str]:
    """One line per robot (found ones in merged order, then not found, refused), then the silent ones."""
    lines = []
    for e in answer.entries:
        if e.found:
            where = f"at {pose_text(e.pose)}" if e.pose else "(no pose)"
            lines.append(f"{e.node}: found {e.stamp:.3f} {e.camera or '-'} {where} "
                         f"(P(yes) {e.yes_probability:.3f}; found by {e.found_by or '-'})")
        else:
            lines.append(f"{e.node}: not found")
    lines += [f"{node}: refused: {why}" for node, why in sorted(answer.refused.items())]
    if answer.no_answer:
        lines.append(f"no answer within {timeout_s:g} s: {', '.join(answer.no_answer)}")
    return lines


def fleet_dict(answer: FleetAnswer) -> dict:
    """The fleet's answer as JSON (no raw replies)."""
    def entry(e: FleetEntry) -> dict:
        pose = None if e.pose is None else {"x": e.pose.x, "y": e.pose.y, "yaw": e.pose.yaw,
                                            "frame_id": e.pose.frame_id}
        return {"node": e.node, "name": e.name, "found": e.found, "stamp": e.stamp, "camera": e.camera,
                "pose": pose, "yes_probability": e.yes_probability, "found_by": e.found_by}

    return {"question": answer.question, "mode": answer.mode, "best": answer.best.node if answer.best else None,
            "entries": [entry(e) for e in answer.entries], "no_answer": answer.no_answer, "refused": answer.refused}
