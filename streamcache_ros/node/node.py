"""streamcache_node: cameras in, questions answered, memory status and diagnostics out.

A lifecycle node, and a translation layer: ROS messages and parameters in, the engine's dataclasses
out, and back. configure: read and validate the parameters, build the session, create the services,
the action, the publishers and the diagnostics. activate: subscribe to the cameras and start the
ingest thread (cameras.py). deactivate / cleanup undo those steps.

Threads: image callbacks (one mutually exclusive group per camera) validate, sample by stamp and put
the frame in the camera's bounded queue; the ingest thread takes frames from the queues into the
session (encoding a chunk every chunk_frames), so a frame sampled while a question is answered waits
and is encoded after it. Questions run on the executor's other threads; the
session's lock serialises them with chunk encoding, and a question flushes the pending frames first,
so every frame taken before the call is in memory for it; a chunk that falls due while a question
runs goes before the next question (engine/turns.py), so ingest waits for one question at most.
Status timers never wait for the session's lock: they publish the status taken after the last
chunk / question / reset.

Faults (docs/reliability.md): a question the engine refuses is answered with the engine's reason
and the memory unchanged; nothing a camera or a client sends can end the process.

Names: a camera is known everywhere (the session, the log, the diagnostics, MemoryStatus, errors) by
its resolved topic, namespace and remaps applied; a question may name it as written in
camera_topics too. Parameters that can change at runtime: tuning.py; memory_status and what the
diagnostics read: status.py.
"""
from __future__ import annotations

import threading
import traceback

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from std_msgs.msg import Header
from streamcache_ros_interfaces.action import Ask as AskAction
from streamcache_ros_interfaces.msg import MemoryStatus, WatchEvent
from streamcache_ros_interfaces.srv import Ask, LoadMemory, MemoryTimeline, ResetMemory, SaveMemory, When

from ..engine import failpoints
from ..engine.errors import AnswerError, ChunkError, ConfigError, ModelLoadError, StreamCacheError
from ..engine.factory import build_session
from ..engine.status import EngineInfo, SessionStatus
from . import params, translate
from .cameras import CameraIngest, CameraInput
from .memory_services import MemoryServices
from .diagnostics import NodeDiagnostics
from .image_conversion import ImageConverter
from .sampler import CameraCounters, FrameQueues
from .snapshots import SnapshotKeeper, check_path, snapshot_dir
from .status import StatusReports
from .time_questions import EVENT_QOS, TimeQuestions
from .tuning import RuntimeTuning

NODE_NAME = "streamcache_node"
# memory_status: one after each chunk, so a fast replay makes bursts; a deep history keeps a slow
# reliable subscriber from losing any
STATUS_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=100, reliability=QoSReliabilityPolicy.RELIABLE,
                        durability=QoSDurabilityPolicy.VOLATILE)
# Frame acknowledgements: bursts of a fast lock-step replay must not overflow the queue.
ACK_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1000, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.VOLATILE)


class StreamCacheNode(CameraIngest, MemoryServices, TimeQuestions, RuntimeTuning, StatusReports, LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        self.values = params.declare_all(self)  # ConfigError: a wrong type or a value out of range
        for name in params.unknown_overrides(self):
            self.get_logger().warning(f"parameter '{name}' is not a streamcache_node parameter: ignored")
        self.autostart = bool(self.values["autostart"])
        self.sample_fps = float(self.values["sample_fps"])
        self.configure_error: str = ""  # the one line main prints when configure fails
        self.session = None
        self.info: EngineInfo | None = None  # what the session runs (model, policy, chunk_frames ...)
        self.cameras: dict[str, CameraInput] = {}
        self.slots = FrameQueues()
        self.converter: ImageConverter | None = None
        self.diagnostics: NodeDiagnostics | None = None
        self._active = False
        self._stopping = threading.Event()
        self._ingest_thread: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._status: SessionStatus | None = None  # after the last chunk / question / reset / load
        self._ingest_error = ""  # an ingest failure outside the engine's own chunk errors
        self.snapshots = SnapshotKeeper("")
        self.snapshot_dir = ""  # save_memory / load_memory's folder, from configure on
        self._saved_at_stop = False
        self._entities = []  # services, action server, publishers, timers made at configure
        self._timer = None
        self._qos_timer = None
        self.finalized = False  # the lifecycle shutdown transition ran: main ends the process
        self._question_group = MutuallyExclusiveCallbackGroup()
        self._action_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._init_time_questions()  # time_questions.py
        self._watch_parameters()  # tuning.py

    # -- lifecycle ------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.configure_error = ""
        try:
            self._configure()
        except ConfigError as err:
            self.configure_error = str(err)
        except ModelLoadError as err:
            self.configure_error = str(ConfigError("model_path", str(err)))
        except Exception as err:  # noqa: BLE001 - anything else still ends configure cleanly
            self.configure_error = f"configure failed: {type(err).__name__}: {err}"
            self.get_logger().debug(traceback.format_exc())
        if self.configure_error:
            if not self.autostart:  # with autostart, main prints the one line and exits with code 2
                self.get_logger().error(self.configure_error)
            self._teardown()
            return TransitionCallbackReturn.FAILURE
        return TransitionCallbackReturn.SUCCESS

    def _configure(self) -> None:
        values = params.read_all(self)
        params.validate_node_params(values)
        snapshot_path = check_path(str(values["memory_snapshot_path"]))
        self.snapshot_dir = snapshot_dir(str(values["snapshot_dir"]))
        faults = failpoints.arm_from_environment()  # before the model loads: a typo fails fast
        self.values = values
        topics = {name: self.resolve_topic_name(name) for name in values["camera_topics"]}
        session = build_session({**params.engine_params(values), "camera_topics": list(topics.values())})
        self._show_budget_in_force(session)
        self.session = session
        self.info = self.session.info()
        if faults is not None:
            self.get_logger().warning(f"{failpoints.ENV}={faults}: TEST faults are being injected")
        self.snapshots = SnapshotKeeper(snapshot_path, float(values["memory_snapshot_period_s"]))
        self._saved_at_stop = False
        restored = self.snapshots.restore(self.session)
        if restored:
            log = self.get_logger().error if self.snapshots.state == "refused" else self.get_logger().info
            log(restored)
        self.sample_fps = float(values["sample_fps"])
        self.set_watch_questions(values["watch_questions"])
        self.converter = ImageConverter(int(values["max_image_pixels"]))
        self.cameras = {topic: CameraInput(name, CameraCounters(topic, self.sample_fps),
                                           MutuallyExclusiveCallbackGroup(), topic)
                        for name, topic in topics.items()}
        for camera in self.cameras.values():
            self._check_qos_overrides(camera)
        self._status = self.session.status()
        self._ingest_error = ""
        self.slots = FrameQueues(int(values["frame_queue_size"]))
        self._make_interfaces()
        if self.diagnostics is None:  # the Updater declares its parameter: made once per node
            self.diagnostics = NodeDiagnostics(self, self.engine_view)
        min_rate, max_delay = self._diagnostic_limits()
        for camera in self.cameras.values():
            self.diagnostics.add_camera(camera.topic, camera.counters, min_rate, max_delay,
                                        qos=lambda c=camera: (c.qos_text, c.qos_changes))
        info = self.info
        self.diagnostics.add_engine()
        self.get_logger().info(
            f"configured: model {info.model_id} ({info.model_family}, {info.device}, {info.dtype}), "
            f"policy {info.policy}, cameras {', '.join(self.cameras)}, sample_fps {self.sample_fps}, "
            f"chunk_frames {info.chunk_frames}; images via {self.converter.backend}, "
            f"diagnostics via {self.diagnostics.backend}")

    def _make_interfaces(self) -> None:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse  # noqa: PLC0415

        q = self._question_group
        self._entities = [
            self.create_service(Ask, "ask", self._on_ask, callback_group=q),
            self.create_service(ResetMemory, "reset_memory", self._on_reset, callback_group=q),
            self.create_service(SaveMemory, "save_memory", self._on_save, callback_group=q),
            self.create_service(LoadMemory, "load_memory", self._on_load, callback_group=q),
            self.create_service(MemoryTimeline, "memory_timeline", self._on_memory_timeline, callback_group=q),
            self.create_service(When, "when", self._on_when, callback_group=q),
        ]
        self._action = ActionServer(self, AskAction, "ask_action", execute_callback=self._execute_ask,
                                    goal_callback=lambda goal: GoalResponse.ACCEPT,
                                    cancel_callback=lambda handle: CancelResponse.ACCEPT,
                                    callback_group=self._action_group)
        self.status_pub = self.create_publisher(MemoryStatus, "memory_status", STATUS_QOS)
        self.ack_pub = self.create_publisher(Header, "frame_acks", ACK_QOS)
        self.watch_pub = self.create_publisher(WatchEvent, "watch_events", EVENT_QOS)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        for camera in self.cameras.values():
            try:
                self._subscribe(camera)
            except Exception as err:  # noqa: BLE001 - checked at configure already; anything else rclpy refuses
                self.configure_error = f"cannot subscribe to {camera.topic}: {str(err).splitlines()[0]}"
                if not self.autostart:
                    self.get_logger().error(self.configure_error)
                self._deactivate()
                return TransitionCallbackReturn.FAILURE
            camera.last_ingested_ns = None
        self._stopping.clear()
        self.slots = FrameQueues(self.slots.capacity)
        self._ingest_thread = threading.Thread(target=self._ingest_loop, name="streamcache-ingest", daemon=True)
        self._ingest_thread.start()
        # steady clock: the status keeps coming at 1 Hz when a replay's /clock stops
        self._timer = self.create_timer(1.0, self.publish_memory_status, callback_group=self._timer_group,
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))
        # publishers come and go: the cameras' reliability follows them (cameras.py)
        self._qos_timer = self.create_timer(1.0, self._match_camera_qos, callback_group=self._timer_group,
                                            clock=Clock(clock_type=ClockType.STEADY_TIME))
        self._active = True
        self.get_logger().info(f"active: listening on {', '.join(c.topic for c in self.cameras.values())}")
        self.publish_memory_status()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._deactivate()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._deactivate()
        self._teardown()
        self.finalized = True  # main ends the process (exit code 0) once the transition is done
        return TransitionCallbackReturn.SUCCESS

    def _deactivate(self) -> None:
        self._active = False
        self._stopping.set()  # a question in progress stops at its next token
        self.slots.close()
        for camera in self.cameras.values():
            for name in ("subscription", "retiring"):
                if getattr(camera, name) is not None:
                    self.destroy_subscription(getattr(camera, name))
                    setattr(camera, name, None)
            camera.overlap_stamps.clear()
        for name in ("_timer", "_qos_timer"):
            if getattr(self, name) is not None:
                self.destroy_timer(getattr(self, name))
                setattr(self, name, None)
        if self._ingest_thread is not None:
            self._ingest_thread.join()
            self._ingest_thread = None

    def _teardown(self) -> None:
        if not self._saved_at_stop:  # cleanup / shutdown transitions: the memory goes with the session
            self._write_snapshot("cleanup")
        for entity in self._entities:
            self.destroy_service(entity)
        self._entities = []
        if getattr(self, "_action", None) is not None:
            self._action.destroy()
            self._action = None
        for name in ("status_pub", "ack_pub", "watch_pub"):
            if getattr(self, name, None) is not None:
                self.destroy_publisher(getattr(self, name))
                setattr(self, name, None)
        if self.diagnostics is not None:
            self.diagnostics.clear()
        self.cameras = {}
        self.session = None
        self.info = None
        self._show_budget_given()

    def stop(self) -> None:
        """Called on SIGINT / shutdown from main: stop questions and the ingest thread, then write the
        memory snapshot (memory_snapshot_path)."""
        if self._active:
            self._deactivate()
        self._stopping.set()
        if not self._saved_at_stop:
            self._saved_at_stop = True
            self._write_snapshot("shutdown")

    @property
    def active(self) -> bool:
        return self._active

    # -- questions ------------------------------------------------------------------------------
    def _camera_key(self, camera: str) -> str:
        """The resolved topic of a camera asked for by that name or as written in camera_topics;
        anything else goes to the session as it is (which refuses it, naming the cameras)."""
        for cam in self.cameras.values():
            if camera and camera in (cam.name, cam.topic):
                return cam.topic
        return camera

    def answer(self, request, result, on_text=None, should_stop=None):
        """Answer an Ask request into ``result`` (an Ask response or action result). Never raises.
        Returns (result, cancelled)."""
        session, info = self.session, self.info
        result.method, result.model_id = (info.policy, info.model_id) if info is not None else ("", "")
        result.option_index = -1
        camera = self._camera_key(request.camera)

        def refuse(message: str):  # with what the memory holds (of the camera asked about)
            with self._status_lock:
                status = self._status
            held = None if status is None else status.camera_memory.get(camera) if camera else status.memory
            return translate.refuse(result, message, held)

        if not self._active or session is None:
            return refuse(f"{self.get_name()} is not active: configure and activate it first"), False
        stop = (lambda: self._stopping.is_set() or should_stop()) if should_stop else self._stopping.is_set
        try:
            answer = session.ask(request.question, list(request.options), camera=camera,
                                 max_new_tokens=int(request.max_new_tokens), on_text=on_text, should_stop=stop,
                                 since=translate.window_bound(request.since),
                                 until=translate.window_bound(request.until),
                                 evidence_k=int(request.evidence_k) or None)
        except StreamCacheError as err:  # QuestionError, ChunkError (flushing), AnswerError: memory unchanged
            if isinstance(err, (AnswerError, ChunkError)):  # a fault, not the client's doing
                self.get_logger().error(f"question failed: {err}")
            self._refresh_status()
            return refuse(str(err)), False
        except Exception as err:  # noqa: BLE001 - a request never takes the node down
            self.get_logger().error(f"question failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            self._refresh_status()
            return refuse(f"internal error: {type(err).__name__}: {err}"), False
        self._refresh_status()
        now_s = self.get_clock().now().nanoseconds * 1e-9
        return translate.fill_answer(result, answer, now_s), answer.cancelled

    def _on_ask(self, request, response):
        response, _ = self.answer(request, response)
        return response

    def _execute_ask(self, goal_handle):
        result = AskAction.Result()

        def on_text(partial: str, new_text: str) -> None:
            goal_handle.publish_feedback(AskAction.Feedback(partial_answer=partial, new_text=new_text))

        result, cancelled = self.answer(goal_handle.request, result, on_text, lambda: goal_handle.is_cancel_requested)
        if cancelled and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif result.success:
            goal_handle.succeed()
        else:
            goal_handle.abort()
        return result
