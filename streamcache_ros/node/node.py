"""streamcache_node: cameras in, questions answered, memory status and diagnostics out.

A lifecycle node. configure: read and validate the parameters, load the model, build the session,
create the services, the action, the publishers and the diagnostics. activate: subscribe to the
cameras and start the ingest thread. deactivate / cleanup undo those steps.

Threads: image callbacks (one mutually exclusive group per camera) validate, sample by stamp and put
the frame in the camera's one-frame slot; the ingest thread takes frames from the slots into the
session (encoding a chunk every chunk_frames). Questions run on the executor's other threads; the
session's lock serialises them with chunk encoding, and a question flushes the pending frames first,
so every frame taken before the call is in memory for it; a chunk that falls due while a question
runs goes before the next question (engine/turns.py), so ingest waits for one question at most.
Status timers never wait for the session's lock: they publish the snapshot taken after the last
chunk / question / reset.

Faults (README "Reliability"): a bad image is rejected with its reason and counted; a bad question
is refused with a specific error_message and the memory unchanged; a chunk that fails (the model
raising, CUDA out of memory) is dropped and reported while ingest goes on; nothing a camera or a
client sends can end the process.
"""
from __future__ import annotations

import threading
import traceback

import torch
from builtin_interfaces.msg import Time
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
from rclpy.qos_overriding_options import QoSOverridingOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header
from streamcache_ros_interfaces.action import Ask as AskAction
from streamcache_ros_interfaces.msg import MemoryStatus
from streamcache_ros_interfaces.srv import Ask, LoadMemory, ResetMemory, SaveMemory

from ..engine.errors import (AnswerError, ChunkError, ConfigError, FrameError, ModelLoadError, SnapshotError,
                             StreamCacheError)
from ..engine.factory import build_session
from ..engine import failpoints
from ..engine.session import REPLACEMENT_CHARACTER
from . import params
from .diagnostics import NodeDiagnostics
from .image_conversion import ImageConverter, ImageRejected, check_raw_image, is_compressed
from .sampler import NS_PER_S, CameraCounters, LatestFrameSlots, SampledFrame
from .snapshots import SnapshotKeeper, check_path

NODE_NAME = "streamcache_node"
# A question longer than this many characters per allowed token cannot fit: refused before the
# tokenizer sees it (a megabyte string must not cost a tokenizer pass).
CHARS_PER_TOKEN_LIMIT = 16
# memory_status: one after each chunk, so a fast replay makes bursts; a deep history keeps a slow
# reliable subscriber from losing any
STATUS_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=100, reliability=QoSReliabilityPolicy.RELIABLE,
                        durability=QoSDurabilityPolicy.VOLATILE)
# Frame acknowledgements: bursts of a fast lock-step replay must not overflow the queue.
ACK_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1000, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.VOLATILE)


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def seconds_to_time(seconds: float) -> Time:
    ns = int(round(seconds * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


class CameraInput:
    """One subscribed camera: its configured name, resolved topic, counters and subscription."""

    def __init__(self, name: str, counters: CameraCounters, group):
        self.name = name  # as written in camera_topics: the session's camera key and the Ask camera
        self.counters = counters
        self.group = group
        self.topic = name  # resolved full name once subscribed
        self.subscription = None
        self.logged_reasons: set[str] = set()
        self.last_ingested_ns: int | None = None  # the stamp of the last frame the ingest thread took


class StreamCacheNode(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        self.values = params.declare_all(self)  # ConfigError: a wrong type or a value out of range
        for name in params.unknown_overrides(self):
            self.get_logger().warning(f"parameter '{name}' is not a streamcache_node parameter: ignored")
        self.autostart = bool(self.values["autostart"])
        self.sample_fps = float(self.values["sample_fps"])
        self.configure_error: str = ""  # the one line main prints when configure fails
        self.session = None
        self.cameras: dict[str, CameraInput] = {}
        self.slots = LatestFrameSlots()
        self.converter: ImageConverter | None = None
        self.diagnostics: NodeDiagnostics | None = None
        self._active = False
        self._stopping = threading.Event()
        self._ingest_thread: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._status = None  # engine SessionStatus after the last chunk / question / reset / load
        self._last_chunk_error = ""
        self.snapshots = SnapshotKeeper("")
        self._saved_at_stop = False
        self._entities = []  # services, action server, publishers, timers made at configure
        self._timer = None
        self._question_group = MutuallyExclusiveCallbackGroup()
        self._action_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self.add_post_set_parameters_callback(self._on_parameters_set)

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
        faults = failpoints.arm_from_environment()  # before the model loads: a typo fails fast
        self.values = values
        self.session = build_session(params.engine_params(values))
        if faults is not None:
            self.get_logger().warning(f"{failpoints.ENV}={faults}: TEST faults are being injected")
        self.snapshots = SnapshotKeeper(snapshot_path, float(values["memory_snapshot_period_s"]))
        self._saved_at_stop = False
        restored = self.snapshots.restore(self.session)
        if restored:
            log = self.get_logger().error if self.snapshots.state == "refused" else self.get_logger().info
            log(restored)
        self.sample_fps = float(values["sample_fps"])
        self.converter = ImageConverter(int(values["max_image_pixels"]))
        self.cameras = {name: CameraInput(name, CameraCounters(name, self.sample_fps),
                                          MutuallyExclusiveCallbackGroup())
                        for name in values["camera_topics"]}
        for camera in self.cameras.values():
            self._check_qos_overrides(camera)
        self._status = self.session.status()
        self._last_chunk_error = ""
        self.slots = LatestFrameSlots()
        self._make_interfaces()
        if self.diagnostics is None:  # the Updater declares its parameter: made once per node
            self.diagnostics = NodeDiagnostics(self, self.memory_status, self._diagnostics_context)
        min_rate, max_delay = self._diagnostic_limits()
        for camera in self.cameras.values():
            self.diagnostics.add_camera(camera.name, camera.counters, min_rate, max_delay)
        self.diagnostics.add_engine(self.session.adapter.model_id)
        adapter = self.session.adapter
        self.get_logger().info(
            f"configured: model {adapter.model_id} ({adapter.family}, {adapter.device}, {adapter.dtype}), "
            f"policy {self.session.policy.name}, cameras {', '.join(self.cameras)}, sample_fps {self.sample_fps}, "
            f"chunk_frames {self.session.config.chunk_frames}; images via {self.converter.backend}, "
            f"diagnostics via {self.diagnostics.backend}")

    def _check_qos_overrides(self, camera: CameraInput) -> None:
        """A bad qos_overrides.<topic>.subscription.* value is a configuration error (found at
        configure, before anything is subscribed): declare and check them as rclpy will at activate."""
        from rclpy.qos_overriding_options import _declare_qos_parameters  # noqa: PLC0415
        from rclpy.subscription import Subscription  # noqa: PLC0415

        topic = self.resolve_topic_name(camera.name)
        sensor = qos_profile_sensor_data
        scratch = QoSProfile(history=sensor.history, depth=sensor.depth, reliability=sensor.reliability,
                             durability=sensor.durability)  # rclpy writes the overrides into the profile
        try:
            _declare_qos_parameters(Subscription, self, topic, scratch, QoSOverridingOptions.with_default_policies())
        except Exception as err:  # noqa: BLE001 - InvalidQosOverridesError, ParameterException, ...
            raise ConfigError(f"qos_overrides.{topic}.subscription", str(err).splitlines()[0]) from None

    def _make_interfaces(self) -> None:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse  # noqa: PLC0415

        q = self._question_group
        self._entities = [
            self.create_service(Ask, "ask", self._on_ask, callback_group=q),
            self.create_service(ResetMemory, "reset_memory", self._on_reset, callback_group=q),
            self.create_service(SaveMemory, "save_memory", self._on_save, callback_group=q),
            self.create_service(LoadMemory, "load_memory", self._on_load, callback_group=q),
        ]
        self._action = ActionServer(self, AskAction, "ask_action", execute_callback=self._execute_ask,
                                    goal_callback=lambda goal: GoalResponse.ACCEPT,
                                    cancel_callback=lambda handle: CancelResponse.ACCEPT,
                                    callback_group=self._action_group)
        self.status_pub = self.create_publisher(MemoryStatus, "memory_status", STATUS_QOS)
        self.ack_pub = self.create_publisher(Header, "frame_acks", ACK_QOS)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        for camera in self.cameras.values():
            msg_type = CompressedImage if camera.name.rstrip("/").endswith("/compressed") else Image
            try:
                # sensor-data QoS (best effort) by default; qos_overrides.<topic>.subscription.reliability
                # := reliable for large images from a reliable publisher (best effort loses big messages)
                camera.subscription = self.create_subscription(
                    msg_type, camera.name, lambda msg, c=camera: self._on_image(c, msg), qos_profile_sensor_data,
                    callback_group=camera.group, qos_overriding_options=QoSOverridingOptions.with_default_policies())
            except Exception as err:  # noqa: BLE001 - checked at configure already; anything else rclpy refuses
                self.configure_error = f"cannot subscribe to {camera.name}: {str(err).splitlines()[0]}"
                if not self.autostart:
                    self.get_logger().error(self.configure_error)
                self._deactivate()
                return TransitionCallbackReturn.FAILURE
            camera.topic = camera.subscription.topic_name
            camera.last_ingested_ns = None
        self._stopping.clear()
        self.slots = LatestFrameSlots()
        self._ingest_thread = threading.Thread(target=self._ingest_loop, name="streamcache-ingest", daemon=True)
        self._ingest_thread.start()
        # steady clock: the status keeps coming at 1 Hz when a replay's /clock stops
        self._timer = self.create_timer(1.0, self.publish_memory_status, callback_group=self._timer_group,
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
        return TransitionCallbackReturn.SUCCESS

    def _deactivate(self) -> None:
        self._active = False
        self._stopping.set()  # a question in progress stops at its next token
        self.slots.close()
        for camera in self.cameras.values():
            if camera.subscription is not None:
                self.destroy_subscription(camera.subscription)
                camera.subscription = None
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
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
        for name in ("status_pub", "ack_pub"):
            if getattr(self, name, None) is not None:
                self.destroy_publisher(getattr(self, name))
                setattr(self, name, None)
        if self.diagnostics is not None:
            self.diagnostics.clear()
        self.cameras = {}
        self.session = None

    def stop(self) -> None:
        """Called on SIGINT / shutdown from main: stop questions and the ingest thread, then write the
        memory snapshot (memory_snapshot_path)."""
        if self._active:
            self._deactivate()
        self._stopping.set()
        if not self._saved_at_stop:
            self._saved_at_stop = True
            self._write_snapshot("shutdown")

    def _write_snapshot(self, reason: str) -> None:
        session = self.session
        if session is None:
            return
        try:
            line = self.snapshots.write(session, reason)
        except SnapshotError as err:
            self.get_logger().error(f"memory snapshot not written: {err}")
            return
        if line:
            self.get_logger().info(line)

    @property
    def active(self) -> bool:
        return self._active

    # -- frames ---------------------------------------------------------------------------------
    def _on_image(self, camera: CameraInput, msg) -> None:
        stamp_ns = stamp_to_ns(msg.header.stamp)
        camera.counters.arrived(stamp_ns)
        self.diagnostics.frame_arrived(camera.name, stamp_ns, self.get_clock().now().nanoseconds)
        try:
            if not is_compressed(msg):
                check_raw_image(msg, self.converter.max_pixels)  # cheap: every frame is checked
            if camera.counters.is_due(stamp_ns):
                # compressed images are decoded (and so fully checked) only when sampled
                rgb = self.converter.to_rgb(msg)
                camera.counters.sampled(stamp_ns)
                replaced = self.slots.put(SampledFrame(camera.name, stamp_ns, rgb))
                if replaced is not None:  # the ingest thread had not taken the previous one
                    camera.counters.dropped()
                    self._ack(camera, replaced.stamp_ns)
                return  # acknowledged once the ingest thread has taken it
        except ImageRejected as err:
            self._reject(camera, err.reason, str(err))
        except Exception as err:  # noqa: BLE001 - an exception here would end the executor's spin
            self._reject(camera, "internal", f"conversion failed: {type(err).__name__}: {err}")
            self.get_logger().debug(traceback.format_exc())
        self._ack(camera, stamp_ns)

    def _reject(self, camera: CameraInput, reason: str, text: str) -> None:
        camera.counters.rejected(reason, text)
        message = f"rejected a frame from {camera.topic}: {text}"
        if reason not in camera.logged_reasons:
            camera.logged_reasons.add(reason)
            self.get_logger().warning(message)
        else:
            self.get_logger().warning(message, throttle_duration_sec=5.0)

    def _ack(self, camera: CameraInput, stamp_ns: int) -> None:
        """Tell a lock-step replay that this frame has been dealt with (taken, skipped or rejected)."""
        msg = Header(frame_id=camera.topic)
        msg.stamp.sec, msg.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        self._publish(self.ack_pub, msg)

    def _ingest_loop(self) -> None:
        while not self._stopping.is_set():
            frame = self.slots.take(timeout=0.5)
            if frame is None:
                continue
            camera = self.cameras.get(frame.camera)
            session = self.session
            if camera is None or session is None:
                continue
            self._time_jump(camera, frame.stamp_ns, session)
            report, failed = None, False
            try:
                report = session.add_frame(frame.rgb, stamp=frame.stamp_ns * 1e-9, camera=frame.camera)
                camera.counters.ingested()
            except ChunkError as err:  # dropped (memory as before it) or kept uncompressed; counted by the session
                camera.counters.ingested()  # the frame was taken; its chunk failed
                failed, self._last_chunk_error = True, str(err)
                self.get_logger().error(str(err))
            except FrameError as err:
                camera.counters.rejected("frame", str(err))
                self.get_logger().warning(f"frame from {camera.topic} refused by the session: {err}")
            except Exception as err:  # noqa: BLE001 - the ingest thread must survive anything
                failed, self._last_chunk_error = True, f"{type(err).__name__}: {err}"
                self.get_logger().error(f"ingest failed: {self._last_chunk_error}\n{traceback.format_exc()}")
            if report is not None or failed:
                self._refresh_status()
                self.publish_memory_status()
                if self.snapshots.due():
                    self._write_snapshot("periodic")
            self._ack(camera, frame.stamp_ns)

    def _time_jump(self, camera: CameraInput, stamp_ns: int, session) -> None:
        """Stamps going back by more than one sampling period (a bag looped, a sim clock reset):
        the sampler has restarted its slots (sampler.py); the memory is kept, or forgotten with
        reset_on_time_jump. The camera's diagnostics show the jump."""
        last, camera.last_ingested_ns = camera.last_ingested_ns, stamp_ns
        if last is None or stamp_ns >= last - NS_PER_S / self.sample_fps:
            return
        back = (last - stamp_ns) / NS_PER_S
        if self.get_parameter("reset_on_time_jump").value:
            forgotten = session.reset()
            for other in self.cameras.values():
                other.last_ingested_ns = stamp_ns if other is camera else None
            self._refresh_status()
            self.get_logger().warning(f"{camera.topic}: stamps jumped back {back:.3f} s: memory reset "
                                      f"({forgotten} frames forgotten, reset_on_time_jump)")
        else:
            self.get_logger().warning(f"{camera.topic}: stamps jumped back {back:.3f} s: sampling restarted, "
                                      "memory kept (reset_on_time_jump is false)")

    # -- questions ------------------------------------------------------------------------------
    def _resolve_camera(self, camera: str) -> str:
        if not camera:
            return ""
        for name, cam in self.cameras.items():
            if camera in (name, cam.topic):
                return name
        known = ", ".join(self.cameras) or "none"
        raise ValueError(f"unknown camera '{camera}' (camera_topics: {known})")

    def _refuse(self, result, message: str):
        result.success = False
        result.error_message = message
        result.option_index = -1
        return result

    def answer(self, request, result, on_text=None, should_stop=None):
        """Answer an Ask request into ``result`` (an Ask response or action result). Never raises.
        Returns (result, cancelled)."""
        session = self.session
        result.method = session.policy.name if session is not None else ""
        result.model_id = session.adapter.model_id if session is not None else ""
        result.option_index = -1
        if not self._active or session is None:
            return self._refuse(result, f"{self.get_name()} is not active: configure and activate it first"), False
        question = request.question
        limit = session.config.max_question_tokens
        if not question.strip():
            return self._refuse(result, "the question is empty"), False
        if len(question) > CHARS_PER_TOKEN_LIMIT * limit:
            return self._refuse(result, f"the question is {len(question)} characters; at most "
                                        f"{CHARS_PER_TOKEN_LIMIT * limit} (max_question_tokens {limit})"), False
        if REPLACEMENT_CHARACTER in request.camera:
            return self._refuse(result, "the camera name is not valid UTF-8"), False
        try:
            camera = self._resolve_camera(request.camera)
        except ValueError as err:
            return self._refuse(result, str(err)), False
        if camera and camera not in session.cameras:
            return self._refuse(result, f"no frames from camera '{camera}' yet"), False
        stop = (lambda: self._stopping.is_set() or should_stop()) if should_stop else self._stopping.is_set
        try:
            answer = session.ask(question, list(request.options), camera=camera,
                                 max_new_tokens=int(request.max_new_tokens), on_text=on_text, should_stop=stop)
        except StreamCacheError as err:  # QuestionError, ChunkError (flushing), AnswerError: memory unchanged
            if isinstance(err, (AnswerError, ChunkError)):  # a fault, not the client's doing
                self.get_logger().error(f"question failed: {err}")
            return self._refuse(result, str(err)), False
        except Exception as err:  # noqa: BLE001 - a request never takes the node down
            self.get_logger().error(f"question failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            return self._refuse(result, f"internal error: {type(err).__name__}: {err}"), False
        finally:
            self._refresh_status()
        result.success = not answer.cancelled
        result.error_message = "cancelled" if answer.cancelled else ""
        result.answer = answer.text
        result.option_index = answer.option_index
        result.frames_in_memory = answer.frames_in_memory
        result.oldest_stamp = seconds_to_time(answer.oldest_stamp)
        result.newest_stamp = seconds_to_time(answer.newest_stamp)
        result.kv_tokens = answer.kv_tokens
        result.ttft_ms = answer.ttft_ms
        result.total_ms = answer.total_ms
        result.answer_tokens = answer.answer_tokens
        return result, answer.cancelled

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

    # -- memory services ------------------------------------------------------------------------
    def _memory_call(self, response, action):
        if not self._active or self.session is None:
            response.success = False
            response.error_message = f"{self.get_name()} is not active: configure and activate it first"
            return response
        try:
            action(response)
            response.success = True
        except StreamCacheError as err:
            response.success = False
            response.error_message = str(err)
        except Exception as err:  # noqa: BLE001
            self.get_logger().error(f"memory service failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            response.success = False
            response.error_message = f"internal error: {type(err).__name__}: {err}"
        self._refresh_status()
        self.publish_memory_status()
        return response

    def _on_reset(self, request, response):
        def reset(r):
            self.slots.clear()  # sampled before the reset: not wanted after it
            for camera in self.cameras.values():
                camera.counters.restart_sampling()
                camera.last_ingested_ns = None
            r.frames_cleared = self.session.reset()
            self.get_logger().info(f"memory reset: {r.frames_cleared} frames forgotten")
        return self._memory_call(response, reset)

    def _on_save(self, request, response):
        def save(r):
            path = request.path.strip()
            if not path:  # the configured snapshot file
                if not self.snapshots.path:
                    raise _RequestError("path is empty (and memory_snapshot_path is not set)")
                if not self.snapshots.writable:
                    raise _RequestError(f"path is empty and memory_snapshot_path {self.snapshots.path} holds a "
                                        "snapshot refused at start: give a path")
                path = self.snapshots.path
            r.bytes_written = self.session.save(path)
            r.frames_in_memory = self.session.status().frames_in_memory
            self.get_logger().info(f"memory saved to {path}: {r.bytes_written} bytes")
        return self._memory_call(response, save)

    def _on_load(self, request, response):
        def load(r):
            if not request.path.strip():
                raise _RequestError("path is empty")
            self.slots.clear()
            r.frames_in_memory = self.session.load(request.path)
            for camera in self.cameras.values():
                camera.last_ingested_ns = None
            self.get_logger().info(f"memory loaded from {request.path}: {r.frames_in_memory} frames")
        return self._memory_call(response, load)

    # -- status ---------------------------------------------------------------------------------
    def _refresh_status(self) -> None:
        session = self.session
        if session is not None:
            status = session.status()
            with self._status_lock:
                self._status = status

    def memory_status(self) -> MemoryStatus:
        """The MemoryStatus message: the session snapshot plus the live frame counters."""
        msg = MemoryStatus()
        msg.header.stamp = self.get_clock().now().to_msg()
        with self._status_lock:
            status = self._status
        if status is None:
            return msg
        cache, chunk = status.cache, status.last_chunk
        msg.policy, msg.model_id = status.policy, status.model_id
        msg.frames_in_memory = status.frames_in_memory
        msg.oldest_stamp = seconds_to_time(status.oldest_stamp)
        msg.newest_stamp = seconds_to_time(status.newest_stamp)
        msg.kv_tokens, msg.kv_bytes, msg.budget_tokens = cache.kv_tokens, cache.kv_bytes, cache.budget_tokens
        msg.layer_tokens = [int(n) for n in cache.layer_tokens]
        msg.bank_tokens = [int(n) for n in cache.bank_tokens]
        if torch.cuda.is_available() and self.session is not None and self.session.adapter.device.type == "cuda":
            device = self.session.adapter.device
            msg.gpu_allocated_bytes = torch.cuda.memory_allocated(device)
            msg.gpu_reserved_bytes = torch.cuda.memory_reserved(device)
            msg.gpu_peak_bytes = torch.cuda.max_memory_allocated(device)
        if chunk is not None:
            msg.encode_ms, msg.prefill_ms, msg.compress_ms = chunk.encode_ms, chunk.prefill_ms, chunk.compress_ms
        msg.last_ttft_ms = status.last_ttft_ms
        msg.chunks_encoded, msg.chunks_failed = status.chunks_encoded, status.chunks_failed
        msg.questions_answered = status.questions_answered
        for camera in list(self.cameras.values()):
            snap = camera.counters.snapshot()
            msg.frames_received += snap.received
            msg.frames_sampled += snap.sampled
            msg.frames_dropped += snap.dropped
            msg.frames_rejected += snap.rejected
            msg.ingest_fps += snap.ingest_rate
        return msg

    def publish_memory_status(self) -> None:
        if self._active:
            self._publish(self.status_pub, self.memory_status())

    def _publish(self, publisher, msg) -> None:
        if publisher is None:
            return
        try:
            publisher.publish(msg)
        except Exception:  # noqa: BLE001 - the context is shutting down (SIGINT): nothing to tell
            pass

    def _on_parameters_set(self, changed) -> None:
        if self.diagnostics is not None and any(p.name in ("camera_min_rate", "max_frame_delay") for p in changed):
            self.diagnostics.set_limits(*self._diagnostic_limits())

    def _diagnostic_limits(self) -> tuple[float, float]:
        min_rate = float(self.get_parameter("camera_min_rate").value) or self.sample_fps
        return min_rate, float(self.get_parameter("max_frame_delay").value)

    def _diagnostics_context(self) -> dict:
        session = self.session
        gpu_total = 0
        if session is not None and session.adapter.device.type == "cuda":
            gpu_total = torch.cuda.get_device_properties(session.adapter.device).total_memory
        chunk_frames = session.config.chunk_frames if session is not None else 1
        return {"active": self._active, "prefix_tokens": len(session.adapter.prefix_ids) if session else 0,
                "chunk_span_s": chunk_frames / self.sample_fps if session else 0.0,
                "chunk_error": self._last_chunk_error, "gpu_total_bytes": gpu_total,
                "snapshot": self.snapshots.summary(),
                "chunk_waited_questions": self._status.most_questions_a_chunk_waited_for if self._status else 0,
                "snapshot_error": self.snapshots.detail if self.snapshots.state == "refused" else ""}


class _RequestError(StreamCacheError):
    """A service request that cannot be served as asked (the message says why)."""
