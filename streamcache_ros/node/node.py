"""streamcache_node: cameras in, questions answered, memory status and diagnostics out.

A lifecycle node, and a translation layer: ROS messages and parameters in, the engine's dataclasses
out, and back. configure: read and validate the parameters, build the session and the parts, create
the services, the action, the publishers and the diagnostics. activate: subscribe to the cameras and
start the ingest thread (cameras.py). deactivate / cleanup undo those steps.

Threads: image callbacks (one mutually exclusive group per camera) validate, sample by stamp and put
the frame in the camera's bounded queue; the ingest thread takes frames from the queues into the
session (encoding a chunk every chunk_frames), so a frame sampled while a question is answered waits
and is encoded after it. Questions run on the executor's other threads; the
session's lock serialises them with chunk encoding, and a question flushes the pending frames first,
so every frame taken before the call is in memory for it; a chunk that falls due while a question
runs goes before the next question (engine/questions/turns.py), so ingest waits for one question at most.
Status timers never wait for the session's lock: they publish the status taken after the last
chunk / question / reset.

Faults (docs/reliability.md): a question the engine refuses is answered with the engine's reason
and the memory unchanged; nothing a camera or a client sends can end the process.

Parts (docs/architecture.md, "Layers"): each concern is an object made at configure and given what it
uses, the session, its publishers, the logger, the clock and the other parts it reads: cameras.py
(subscriptions, queues, the ingest thread), questions.py (Ask), memory_services.py (reset, save,
load, timeline, the snapshot), time_questions.py (`when`, the standing questions),
standing_questions.py (one question added or removed, who holds each), status.py
(memory_status, what the diagnostics read) and tuning.py (runtime parameter changes). This file
wires them up and owns the lifecycle; cleanup drops them with the session.

Names: a camera is known everywhere (the session, the log, the diagnostics, MemoryStatus, errors) by
its resolved topic, namespace and remaps applied; a question may name it as written in
camera_topics too.
"""
from __future__ import annotations

import threading
import traceback

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage
from std_msgs.msg import Header
from streamcache_ros_interfaces.action import Ask as AskAction
from streamcache_ros_interfaces.msg import MemoryStatus, WatchEvent
from streamcache_ros_interfaces.srv import Ask, LoadMemory, MemoryTimeline, ResetMemory, SaveMemory, WatchQuestion, When

from ..engine import FAILPOINTS_ENV, ConfigError, ModelLoadError, arm_failpoints, build_session
from ..engine.status import ChunkReport
from . import params, translate
from .cameras import CameraInput, Cameras
from .diagnostics import EngineView, NodeDiagnostics
from .image_conversion import ImageConverter
from .memory_services import MemoryServices
from .parameter_guard import guard_parameter_services
from .questions import Questions
from .sampler import CameraCounters
from .snapshots import DEFAULT_ARCHIVE, SnapshotKeeper, archive_folder, check_path, snapshot_dir
from .standing_questions import StandingQuestions, standing_question_refusal
from .status import StatusReports
from .poses import PoseInput, named_places, pose_input_for
from .time_questions import EVENT_QOS, TimeQuestions
from .tuning import RuntimeTuning, ShownBudget, diagnostic_limits

NODE_NAME = "streamcache_node"
# memory_status: one after each chunk, so a fast replay makes bursts; a deep history keeps a slow
# reliable subscriber from losing any
STATUS_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=100, reliability=QoSReliabilityPolicy.RELIABLE,
                        durability=QoSDurabilityPolicy.VOLATILE)
# Frame acknowledgements: bursts of a fast lock-step replay must not overflow the queue.
ACK_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1000, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.VOLATILE)
# ~/shown: the last frame a `when` found stays for a viewer opened after it (rqt_image_view, Foxglove)
SHOWN_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                       durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
PUBLISHERS = (("status_pub", MemoryStatus, "memory_status", STATUS_QOS), ("ack_pub", Header, "frame_acks", ACK_QOS),
              ("watch_pub", WatchEvent, "watch_events", EVENT_QOS), ("shown_pub", CompressedImage, "~/shown", SHOWN_QOS),
              # the same frames where rqt_image_view and Foxglove look for a CompressedImage (docs/show.md)
              ("shown_compressed_pub", CompressedImage, "~/shown/compressed", SHOWN_QOS))


class StreamCacheNode(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        self.values = params.declare_all(self)  # ConfigError: a wrong type or a value out of range
        for name in params.unknown_overrides(self):
            self.get_logger().warning(f"parameter '{name}' is not a streamcache_node parameter: ignored")
        self.autostart = bool(self.values["autostart"])
        self.configure_error: str = ""  # the one line main prints when configure fails
        self.session = None
        self.info = None  # what the session runs (model, policy, chunk_frames ...)
        # the parts, made at configure and dropped at cleanup
        self.cameras: Cameras | None = None
        self.questions: Questions | None = None
        self.memory: MemoryServices | None = None
        self.time_questions: TimeQuestions | None = None
        self.poses: PoseInput | None = None
        self.named_places: dict = {}
        self.standing: StandingQuestions | None = None
        self.status: StatusReports | None = None
        self.tuning: RuntimeTuning | None = None
        self.shown_budget = ShownBudget(self)
        self.diagnostics: NodeDiagnostics | None = None
        self._active = False
        self._stopping = threading.Event()
        self._saved_at_stop = False
        self._entities = []  # services made at configure
        self._action = None
        self._made_publishers: dict[str, object] = {}
        self._lifecycle_timers = []
        self.finalized = False  # the lifecycle shutdown transition ran: main ends the process
        self._question_group = MutuallyExclusiveCallbackGroup()
        self._action_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        # runtime changes: each value in its declared type or refused with the node's reason (params.py),
        # then taken while unconfigured (checked at the next configure), else tuning.py's. One pre-set
        # callback: rclpy hands each its own copy of the list and sets what all of them return
        convert, check = params.typing_callbacks(self)
        self.add_pre_set_parameters_callback(lambda changed: self.tuning.model_budget_for_zero(convert(changed))
                                             if self.tuning else convert(changed))
        self.add_on_set_parameters_callback(lambda changed: self.tuning.check_changes(changed)
                                            if self.tuning else SetParametersResult(successful=True))
        self.add_post_set_parameters_callback(lambda changed: self.tuning.apply(changed) if self.tuning else None)
        self.add_on_set_parameters_callback(check)  # added last, runs first
        guard_parameter_services(self)  # a parameter of no known type is refused, not the end of the node

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
        folder = snapshot_dir(str(values["snapshot_dir"]))
        faults = arm_failpoints()  # before the model loads: a typo fails fast
        self.values = values
        self.named_places = named_places(str(values["places_file"]))  # a bad file fails before the model loads
        topics = {name: self.resolve_topic_name(name) for name in values["camera_topics"]}
        archive = archive_folder(str(values["archive_path"]), self.get_fully_qualified_name())
        session = build_session({**params.engine_params(values), "camera_topics": list(topics.values()),
                                 "archive_path": archive, "archive_owner": self.get_fully_qualified_name(),
                                 # on the default path a robot whose model or cameras changed still starts
                                 "archive_set_aside": str(values["archive_path"]) == DEFAULT_ARCHIVE})
        info = session.info()
        self.shown_budget.show_in_force(session, int(values["budget_tokens"]), info.policy)
        far = session.budget_warning(int(values["budget_tokens"]))
        if far:
            self.get_logger().warning(far)
        self.session, self.info = session, info
        if faults is not None:
            self.get_logger().warning(f"{FAILPOINTS_ENV}={faults}: TEST faults are being injected")
        snapshots = SnapshotKeeper(snapshot_path, float(values["memory_snapshot_period_s"]))
        self._saved_at_stop = False
        restored = snapshots.restore(session)
        if restored:
            log = self.get_logger().error if snapshots.state == "refused" else self.get_logger().info
            log(restored)
        self._made_publishers = {attr: self.create_publisher(kind, topic, qos) for attr, kind, topic, qos in PUBLISHERS}
        if self.diagnostics is None:  # the Updater declares its parameter: made once per node
            self.diagnostics = NodeDiagnostics(self, self._engine_view)
        self._make_parts(session, info, values, topics, snapshots, folder)
        self._make_interfaces()
        min_rate, max_delay = diagnostic_limits(self, self.cameras.sample_fps)
        for camera in self.cameras.inputs.values():
            self.diagnostics.add_camera(camera.topic, camera.counters, min_rate, max_delay,
                                        qos=lambda c=camera: (c.qos_text, c.qos_changes))
        self.diagnostics.add_engine()
        if self.poses is not None:
            self.diagnostics.add_poses(self.poses)
        # once nothing else can fail: a configure error stays the one line it ends the process with
        self._log_archive(session, archive)
        self.get_logger().info(
            f"configured: model {info.model_id} ({info.model_family}, {info.device}, {info.dtype}), "
            f"policy {info.policy}, cameras {', '.join(self.cameras.inputs)}, sample_fps {self.cameras.sample_fps}, "
            f"chunk_frames {info.chunk_frames}; images via {self.cameras.converter.backend}, "
            f"diagnostics via {self.diagnostics.backend}")

    def _log_archive(self, session, folder: str) -> None:
        """What opening the archive mended, where it is and which index it has: logged, since the
        archive is on by default and a new one is otherwise silent."""
        log = self.get_logger()
        for warning, line in translate.archive_lines(session, folder, self.values):
            if warning:  # one severity a call site: rclpy refuses a call site whose severity changes
                log.warning(line)
            else:
                log.info(line)

    def _make_parts(self, session, info, values: dict, topics: dict[str, str], snapshots: SnapshotKeeper,
                    folder: str) -> None:
        """The parts, each given what it uses; shared facts travel in these arguments."""
        logger, clock, name, pubs = self.get_logger(), self.get_clock(), self.get_name(), self._made_publishers
        sample_fps = float(values["sample_fps"])
        inputs = {topic: CameraInput(written, CameraCounters(topic, sample_fps), MutuallyExclusiveCallbackGroup(),
                                     topic) for written, topic in topics.items()}
        self.cameras = Cameras(self, session, inputs, int(values["frame_queue_size"]),
                               ImageConverter(int(values["max_image_pixels"])), self.diagnostics, pubs["ack_pub"],
                               self._stopping, sample_fps, self._after_chunk, lambda: self.status.refresh())
        self.time_questions = TimeQuestions(session, pubs["watch_pub"], self.cameras.key, name, logger,
                                            self._is_active, lambda: self.status.refresh(),
                                            (pubs["shown_pub"], pubs["shown_compressed_pub"]))
        self.standing = StandingQuestions(
            self.time_questions, lambda: list(self.get_parameter("watch_questions").value),
            lambda questions: self.set_parameters([Parameter("watch_questions", Parameter.Type.STRING_ARRAY,
                                                               questions)])[0],
            lambda question: standing_question_refusal(session, question), logger)
        self.standing.set_watch_questions(values["watch_questions"])
        self.status = StatusReports(session, info, pubs["status_pub"], clock, self._is_active, self.cameras,
                                    snapshots, self.time_questions)
        self.questions = Questions(session, info, self.status, self.cameras.key, self._stopping, name, logger, clock,
                                   self._is_active)
        self.memory = MemoryServices(session, self.cameras, snapshots, folder, name, logger, self._is_active,
                                     self._memory_changed)
        self.poses = pose_input_for(self, session, values)  # None: no pose source
        self.questions.places = self.time_questions.places = self.named_places
        self.tuning = RuntimeTuning(session, info, values, self, self.shown_budget, self.cameras, self.status,
                                    self.standing, self.diagnostics)

    def _make_interfaces(self) -> None:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse  # noqa: PLC0415

        q, memory = self._question_group, self.memory
        self._entities = [
            self.create_service(Ask, "ask", self.questions.on_ask, callback_group=q),
            self.create_service(ResetMemory, "reset_memory", memory.on_reset, callback_group=q),
            self.create_service(SaveMemory, "save_memory", memory.on_save, callback_group=q),
            self.create_service(LoadMemory, "load_memory", memory.on_load, callback_group=q),
            self.create_service(MemoryTimeline, "memory_timeline", memory.on_memory_timeline, callback_group=q),
            self.create_service(When, "when", self.time_questions.on_when, callback_group=q),
            # with the parameter services (rclpy's default group): an edit never interleaves with a set
            *(self.create_service(WatchQuestion, name, serve, callback_group=self.default_callback_group)
              for name, serve in (("add_watch_question", self.standing.on_add),
                                  ("remove_watch_question", self.standing.on_remove))),
        ]
        self._action = ActionServer(self, AskAction, "ask_action", execute_callback=self.questions.execute_ask,
                                    goal_callback=lambda goal: GoalResponse.ACCEPT,
                                    cancel_callback=lambda handle: CancelResponse.ACCEPT,
                                    callback_group=self._action_group)

    def _after_chunk(self, report: ChunkReport | None) -> None:
        """On the ingest thread, after a chunk went in (``report``) or failed (None)."""
        # (the standing questions ran with the chunk: TimeQuestions.ask_standing via Session.on_chunk)
        self._memory_changed()
        if self.memory.snapshots.due():
            self.memory.write_snapshot("periodic")

    def _memory_changed(self) -> None:
        self.status.refresh()
        self.status.publish()

    def _is_active(self) -> bool:
        return self._active

    def _engine_view(self) -> EngineView:
        status = self.status
        return status.engine_view() if status is not None else EngineView(active=False)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stopping.clear()
        error = self.cameras.activate()
        if self.poses is not None and not error:
            self.poses.activate()
        if error:
            self.configure_error = error
            if not self.autostart:
                self.get_logger().error(self.configure_error)
            self._deactivate()
            return TransitionCallbackReturn.FAILURE
        # steady clock: the status keeps coming at 1 Hz when a replay's /clock stops; the cameras'
        # reliability follows their publishers as they come and go (cameras.py)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._lifecycle_timers = [self.create_timer(1.0, callback, callback_group=self._timer_group, clock=steady)
                        for callback in (self.status.publish, self.cameras.match_qos)]
        self._active = True
        self.get_logger().info(f"active: listening on {', '.join(self.cameras.inputs)}")
        self.status.publish()
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
        for timer in self._lifecycle_timers:
            self.destroy_timer(timer)
        self._lifecycle_timers = []
        if self.cameras is not None:
            self.cameras.deactivate()
        if self.poses is not None:
            self.poses.deactivate()

    def _teardown(self) -> None:
        if not self._saved_at_stop and self.memory is not None:  # cleanup / shutdown: the memory goes with the session
            self.memory.write_snapshot("cleanup")
        self.tuning = None  # from here every parameter change is taken, checked at the next configure
        for entity in self._entities:
            self.destroy_service(entity)
        self._entities = []
        if self._action is not None:
            self._action.destroy()
            self._action = None
        for publisher in self._made_publishers.values():
            self.destroy_publisher(publisher)
        self._made_publishers = {}
        if self.diagnostics is not None:
            self.diagnostics.clear()
        self.cameras = self.questions = self.memory = self.time_questions = self.standing = self.status = None
        self.poses = None
        if self.session is not None:
            self.session.close_archive()  # the lock goes: another node may take the archive
        self.session = None
        self.info = None
        self.shown_budget.show_given()

    def stop(self) -> None:
        """Called on SIGINT / shutdown from main: stop questions and the ingest thread, write the
        memory snapshot (memory_snapshot_path), close the archive."""
        if self._active:
            self._deactivate()
        self._stopping.set()
        if not self._saved_at_stop:
            self._saved_at_stop = True
            if self.memory is not None:
                self.memory.write_snapshot("shutdown")
        if self.session is not None:
            # one file at rest: the write-ahead log folded back, so a copy of archive.sqlite alone
            # holds every chunk (docs/archive.md "Durability"); waits for a chunk in progress
            self.session.close_archive()

    @property
    def active(self) -> bool:
        return self._active
