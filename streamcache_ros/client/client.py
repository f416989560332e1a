"""A small Python client for streamcache_node, for scripts, other nodes and behaviour-tree leaves.

    from streamcache_ros.client.client import StreamCacheClient
    with StreamCacheClient() as memory:                 # the one node (or namespace="/streamcache")
        reply = memory.ask("what is on the table?")     # the Ask service
        print(reply.success, reply.answer, reply.error_message)
        result = memory.ask_streaming("describe the room", on_text=lambda partial, new: print(new, end=""))
        status = memory.memory_status()                 # the next MemoryStatus message
        memory.node_state()                             # 'active', 'inactive', ... (lifecycle)
        goal = memory.ask_async("is the door open?", options=["yes", "no"])  # returns at once (BT leaves)
        reply = memory.ask("where are the keys?", since=t0, until=t1)  # a time window (stamps, seconds)
        reply.evidence_stamps, reply.evidence_cameras, reply.evidence_weights  # the frames it drew on
        timeline = memory.memory_timeline()            # every frame in memory, and how much of it is kept
        goal.done(), goal.partial_answer, goal.result(), goal.cancel()
        watch = memory.watch_memory_status()            # one subscription; watch.latest: newest message
        found = memory.when("Did you see a red circle?", "last")   # found.found, found.stamp (last | first | timeline)
        memory.set_watch_questions(["Did you see a red circle?"])   # standing questions ('' = taken)
        memory.add_watch_question("Is the door open?")   # one more, the others' kept (.success, .watch_questions)
        memory.remove_watch_question("Is the door open?")   # only that one (when no one else holds it)
        events = memory.watch_events()                  # standing questions' WatchEvents, kept as they come
        event = events.wait_for(lambda e: e.answer == "yes", timeout=60)

The client runs its own rclpy context, node and executor thread, so it works from plain scripts and
from inside another node's callbacks alike (nothing of the caller's is spun). Calls block until
the reply comes or ``timeout`` seconds pass (TimeoutError); ``ask_async`` and ``watch_memory_status``
never block (behaviour-tree leaves poll them once per tick).
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Callable

from .discovery import ASK_SERVICE_TYPE, SETTLE_S, NodeNotConfigured, NodeNotFound, discover_namespace  # noqa: F401
from .discovery import find_namespaces, the_one  # noqa: F401 - re-exported: client.client names them too
from .goals import AskGoal, MemoryStatusWatch, WatchEvents
from .participant import OwnParticipant
from .replies import (EvidenceImage, FramePose, evidence_images, evidence_poses, frame_pose,  # noqa: F401
                      place_request, time_request, to_time)

_instances = itertools.count()


def _wait(future, timeout: float | None, what: str):
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    if not done.wait(timeout):
        raise TimeoutError(f"no reply to {what} within {timeout} s")
    if future.exception() is not None:
        raise future.exception()
    return future.result()


class StreamCacheClient:
    def __init__(self, namespace: str | None = None, timeout: float = 15.0, domain_id: int | None = None):
        """``namespace``: the node's namespace ('/streamcache' with the launch files, '' for a bare
        ``streamcache_node``); None finds the one node in the graph once discovery has settled
        (``discover_namespace``: refused, naming them all, when there are several). ``timeout``: how
        long to wait for the node to appear. ``domain_id``: default ROS_DOMAIN_ID."""
        from rclpy.action import ActionClient  # noqa: PLC0415
        from streamcache_ros_interfaces.action import Ask as AskAction  # noqa: PLC0415
        from streamcache_ros_interfaces.msg import MemoryStatus, WatchEvent  # noqa: PLC0415
        from streamcache_ros_interfaces.srv import (Ask, LoadMemory, MemoryTimeline, ResetMemory,  # noqa: PLC0415
                                                    SaveMemory, WatchQuestion, When)

        self._types = {"Ask": Ask, "AskAction": AskAction, "ResetMemory": ResetMemory, "SaveMemory": SaveMemory,
                       "LoadMemory": LoadMemory, "MemoryStatus": MemoryStatus, "MemoryTimeline": MemoryTimeline,
                       "When": When, "WatchEvent": WatchEvent, "WatchQuestion": WatchQuestion}
        self._participant = OwnParticipant(f"streamcache_client_{os.getpid()}_{next(_instances)}", domain_id,
                                           start=False)  # the action client first (OwnParticipant.start)
        self.node = self._participant.node
        self._watch: MemoryStatusWatch | None = None
        self._events: WatchEvents | None = None
        self._watch_lock = threading.Lock()
        try:
            self.namespace = (discover_namespace(self.node, timeout) if namespace is None
                              else ("/" + namespace.strip("/")) if namespace.strip("/") else "")
            ns = self.namespace
            self._ask = self.node.create_client(Ask, f"{ns}/ask")
            self._reset = self.node.create_client(ResetMemory, f"{ns}/reset_memory")
            self._save = self.node.create_client(SaveMemory, f"{ns}/save_memory")
            self._load = self.node.create_client(LoadMemory, f"{ns}/load_memory")
            self._timeline = self.node.create_client(MemoryTimeline, f"{ns}/memory_timeline")
            self._when = self.node.create_client(When, f"{ns}/when")
            self._add_watch = self.node.create_client(WatchQuestion, f"{ns}/add_watch_question")
            self._remove_watch = self.node.create_client(WatchQuestion, f"{ns}/remove_watch_question")
            self._action = ActionClient(self.node, AskAction, f"{ns}/ask_action")
            self._participant.start()
            if not self._wait_for_ask(timeout):
                state = self._lifecycle_nodes(timeout=min(timeout, 5.0))
                why = "; ".join(f"{name} is {label}: its services appear once it is configured (ros2 lifecycle set "
                                f"{name} configure)" for name, label in state.items()) or "is the node running?"
                raise NodeNotFound(f"service {ns}/ask not available within {timeout:.0f} s ({why})")
        except BaseException:
            self.close()
            raise

    # -- calls ----------------------------------------------------------------------------------
    def _request(self, client, request, timeout, what):
        if not client.wait_for_service(timeout_sec=timeout if timeout is not None else 15.0):
            raise NodeNotFound(f"service {client.srv_name} is not available")
        return _wait(client.call_async(request), timeout, what)

    def ask(self, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
            timeout: float | None = 300.0, *, since=None, until=None, evidence_k: int = 0, with_images: bool = False,
            place=None):
        """The Ask service; returns its response (check ``success`` / ``error_message``).
        ``since`` / ``until``: a time window (seconds as the camera stamps, or Time; None = open);
        ``place``: a named place or (x, y, radius) (docs/places.md; ``evidence_poses(reply)``);
        ``evidence_k``: evidence frames wanted (0: the node's evidence_k); ``with_images``: the
        evidence frames' thumbnails in ``evidence_images`` (``evidence_images(reply)``: as arrays)."""
        request = self._types["Ask"].Request(question=question, options=list(options), camera=camera,
                                             max_new_tokens=max_new_tokens,
                                             **time_request(since, until, evidence_k, with_images, place))
        return self._request(self._ask, request, timeout, "ask")

    def ask_async(self, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
                  on_text: Callable[[str, str], None] | None = None, *, since=None, until=None,
                  evidence_k: int = 0, with_images: bool = False, place=None) -> "AskGoal":
        """The Ask action without blocking (for behaviour-tree leaves): returns an AskGoal at once;
        poll its ``done()``, read ``partial_answer`` while it streams, ``result()`` when done.
        ``on_text(partial_answer, new_text)`` runs on the client's thread for each piece; the time
        fields as in ``ask``."""
        goal = AskGoal(on_text)
        request = self._types["AskAction"].Goal(question=question, options=list(options), camera=camera,
                                                max_new_tokens=max_new_tokens,
                                                **time_request(since, until, evidence_k, with_images, place))

        def send() -> None:
            sent = self._action.send_goal_async(request, feedback_callback=goal._on_feedback)
            sent.add_done_callback(goal._on_goal_response)

        if self._action.server_is_ready():
            send()
            return goal

        # A goal sent before the server is matched is lost: wait for it without blocking the caller.
        def poll() -> None:
            if goal.cancel_requested or self._action.server_is_ready():
                timer.cancel()
                self.node.destroy_timer(timer)  # on the executor's thread: safe between two waits
                if goal.cancel_requested:
                    goal._fail("cancelled before the action server was found")
                else:
                    send()
        timer = self.node.create_timer(0.05, poll)
        return goal

    def ask_streaming(self, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
                      on_text: Callable[[str, str], None] | None = None, cancel: threading.Event | None = None,
                      on_accepted: Callable[[], None] | None = None, timeout: float | None = 300.0, *,
                      since=None, until=None, evidence_k: int = 0, with_images: bool = False, place=None):
        """The Ask action: ``on_text(partial_answer, new_text)`` per feedback; setting ``cancel``
        cancels the goal (the result then has success false and the partial answer). Returns the
        action's result. The time fields as in ``ask``."""
        if not self._action.wait_for_server(timeout_sec=timeout if timeout is not None else 15.0):
            raise NodeNotFound(f"action {self.namespace}/ask_action is not available")
        goal = self.ask_async(question, options, camera, max_new_tokens, on_text, since=since, until=until,
                              evidence_k=evidence_k, with_images=with_images, place=place)
        try:
            if not goal._wait_for(lambda: goal.state != AskGoal.PENDING, timeout):
                raise TimeoutError(f"no reply to ask_action goal within {timeout} s")
            goal._raise_if_failed()
            if on_accepted is not None:
                on_accepted()
            deadline = None if timeout is None else time.monotonic() + timeout
            while not goal._wait_for(goal.done, 0.02):
                if cancel is not None and cancel.is_set():
                    goal.cancel()
                if deadline is not None and time.monotonic() > deadline:
                    goal.cancel()
                    raise TimeoutError(f"no ask_action result within {timeout} s (goal cancelled)")
            goal._raise_if_failed()
            return goal.result()
        except BaseException:
            goal.cancel()  # Ctrl-C or a timeout: the node stops answering too
            raise

    def node_name(self) -> str:
        """The full name of the node serving ``<namespace>/ask`` ('' when none is seen)."""
        for name, namespace in self.node.get_node_names_and_namespaces():
            try:
                services = self.node.get_service_names_and_types_by_node(name, namespace)
            except Exception:  # noqa: BLE001 - the node left the graph meanwhile
                continue
            if any(service == f"{self.namespace}/ask" for service, _ in services):
                return f"{namespace.rstrip('/')}/{name}"
        return ""

    def node_state(self, timeout: float = 5.0) -> str:
        """The node's lifecycle state: 'active', 'inactive', 'unconfigured', 'finalized' ... ('' when
        it cannot be asked: no lifecycle services, no reply within ``timeout``)."""
        deadline = time.monotonic() + timeout
        name = self._node_name_within(timeout)
        return self._get_state(name, max(0.5, deadline - time.monotonic())) if name else ""

    def _node_name_within(self, timeout: float) -> str:
        """``node_name``, waited for: the name comes with the graph's node list, which can lag behind
        the node's services ('' when it has not come within ``timeout``)."""
        deadline = time.monotonic() + timeout
        name = self.node_name()
        while not name and time.monotonic() < deadline:
            time.sleep(0.1)
            name = self.node_name()
        return name

    def _get_state(self, name: str, timeout: float) -> str:
        from lifecycle_msgs.srv import GetState  # noqa: PLC0415

        client = self.node.create_client(GetState, f"{name}/get_state")
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                return ""
            try:
                return _wait(client.call_async(GetState.Request()), timeout, "get_state").current_state.label
            except TimeoutError:
                return ""
        finally:
            self._participant.in_spin_thread(self.node.destroy_client, client)

    def _wait_for_ask(self, timeout: float) -> bool:
        """Until ``ask`` is served (True) or ``timeout`` passes (False). A node that answers its
        lifecycle state 'unconfigured' is not about to serve (one configuring itself at start does not
        answer until it is done), so it is refused at once with NodeNotConfigured instead of waiting
        out the timeout (docs/interfaces.md "Finding the node")."""
        deadline = time.monotonic() + timeout
        while not self._ask.wait_for_service(timeout_sec=min(0.2, max(0.0, deadline - time.monotonic()))):
            unconfigured = [name for name, label in self._lifecycle_nodes(timeout=0.5).items()
                            if label == "unconfigured"]
            if unconfigured:
                name = unconfigured[0]
                raise NodeNotConfigured(f"{name} is unconfigured: it serves nothing until it is configured "
                                        f"(ros2 lifecycle set {name} configure, then activate)")
            if time.monotonic() >= deadline:
                return False
        return True

    def _lifecycle_nodes(self, timeout: float) -> dict[str, str]:
        """The lifecycle nodes in this client's namespace and their states (for a clearer error)."""
        found = {}
        for name, namespace in self.node.get_node_names_and_namespaces():
            full = f"{namespace.rstrip('/')}/{name}"
            if namespace.rstrip("/") == self.namespace and any(
                    service == f"{full}/get_state" for service, _ in self.node.get_service_names_and_types()):
                found[full] = self._get_state(full, timeout) or "in an unknown state"
        return found

    def reset(self, timeout: float | None = 60.0):
        return self._request(self._reset, self._types["ResetMemory"].Request(), timeout, "reset_memory")

    def save(self, path: str, timeout: float | None = 120.0):
        return self._request(self._save, self._types["SaveMemory"].Request(path=path), timeout, "save_memory")

    def load(self, path: str, timeout: float | None = 120.0):
        return self._request(self._load, self._types["LoadMemory"].Request(path=path), timeout, "load_memory")

    def memory_timeline(self, camera: str = "", timeout: float | None = 60.0):
        """The memory_timeline service: every frame in memory (of ``camera`` when given), oldest first,
        with the share of its tokens kept per layer (and per H2SVC bank)."""
        request = self._types["MemoryTimeline"].Request(camera=camera)
        return self._request(self._timeline, request, timeout, "memory_timeline")

    def when(self, question: str, mode: str = "last", camera: str = "", *, since=None, until=None,
             timeout: float | None = 300.0, with_images: bool = False, place=None):
        """The when service: the ``last`` / ``first`` stamp at which the yes/no ``question`` holds,
        or its ``timeline``, searched in the memory (``since`` / ``until`` as in ``ask``). Returns the
        response (check ``success``, then ``found`` and ``stamp``); ``with_images``: the frame found in
        ``evidence_images``; ``place`` as in ``ask``: the pose of the frame found is ``pose`` (``has_pose``)."""
        request = self._types["When"].Request(question=question, mode=mode, camera=camera, since=to_time(since),
                                              until=to_time(until), with_images=bool(with_images),
                                              **place_request(place))
        return self._request(self._when, request, timeout, "when")

    def set_watch_questions(self, questions, timeout: float | None = 30.0) -> str:
        """The node's standing questions from the next chunk on (``ros2 param set <node>
        watch_questions [...]``): '' when taken, else the node's reason. This replaces the whole
        list, other clients' questions included: a client that holds questions of its own uses
        ``add_watch_question`` / ``remove_watch_question``."""
        from rcl_interfaces.srv import SetParameters  # noqa: PLC0415
        from rclpy.parameter import Parameter  # noqa: PLC0415

        name = self._node_name_within(timeout if timeout is not None else 15.0)
        if not name:
            raise NodeNotFound(f"no node serving {self.namespace}/ask in the graph")
        service = self.node.create_client(SetParameters, f"{name}/set_parameters")
        try:
            request = SetParameters.Request(parameters=[
                Parameter("watch_questions", value=[str(q) for q in questions]).to_parameter_msg()])
            result = self._request(service, request, timeout, "set_parameters").results[0]
            return "" if result.successful else result.reason
        finally:
            self._participant.in_spin_thread(self.node.destroy_client, service)

    def add_watch_question(self, question: str, timeout: float | None = 30.0):
        """One more standing question, the others' kept (the add_watch_question service: the node
        edits its list in one step). Returns the response: ``success`` (else ``error_message`` says
        why: empty, not yes/no, too long), ``watch_questions`` (the list now) and ``holders``."""
        request = self._types["WatchQuestion"].Request(question=question)
        return self._request(self._add_watch, request, timeout, "add_watch_question")

    def remove_watch_question(self, question: str, timeout: float | None = 30.0):
        """This client's hold on a standing question let go (the remove_watch_question service): it
        stops being asked once no one holds it (``holders`` 0). Returns the response, as
        ``add_watch_question``'s."""
        request = self._types["WatchQuestion"].Request(question=question)
        return self._request(self._remove_watch, request, timeout, "remove_watch_question")

    def watch_events(self) -> "WatchEvents":
        """The client's one subscription to the standing questions' events (made on the first call,
        kept until close): every WatchEvent from then on, in ``events``."""
        with self._watch_lock:
            if self._events is None or self._events.closed:
                self._events = WatchEvents(self, f"{self.namespace}/watch_events")
            return self._events

    def watch_memory_status(self) -> "MemoryStatusWatch":
        """The client's one MemoryStatus subscription (made on the first call, kept until close):
        ``latest`` is the newest message (None until one arrived)."""
        with self._watch_lock:
            if self._watch is None or self._watch.closed:
                self._watch = MemoryStatusWatch(self, f"{self.namespace}/memory_status")
            return self._watch

    def memory_status(self, timeout: float = 10.0):
        """The next MemoryStatus the node publishes (1 Hz, and after each chunk) after this call."""
        return self.watch_memory_status().next(timeout)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        self._participant.close()

    def __enter__(self) -> "StreamCacheClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
