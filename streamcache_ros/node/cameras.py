"""The camera side of the node: image callbacks (validate, sample by stamp, put the frame in the
camera's queue) and the ingest thread that takes frames from the queues into the session.

QoS (docs/interfaces.md "QoS"): sensor-data depth and history, reliability matched to the topic's
publishers as `ros2 bag record` does: reliable when every publisher is reliable, best effort
otherwise (and while there is none yet). It is checked again every second as publishers come and
go; a change resubscribes, and is logged and shown in the camera's diagnostics. The old subscription
stays until the new one has matched every publisher (a frame sent in between would otherwise be
lost), and a frame both deliver is taken once. A
``qos_overrides.<topic>.subscription.reliability`` parameter wins over the match.

Faults (docs/reliability.md): a bad image is rejected with its reason and counted; a chunk that
fails (the model raising, CUDA out of memory) is dropped and reported while ingest goes on; nothing
a camera sends can end the process.
"""
from __future__ import annotations

import threading
import traceback
from collections import deque
from typing import Callable

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import QoSPolicyKind, QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
from rclpy.qos_overriding_options import QoSOverridingOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from ..engine.errors import ChunkError, ConfigError, FrameError
from ..engine.status import ChunkReport
from .image_conversion import ImageConverter, ImageRejected, check_raw_image, is_compressed
from .publishing import publish_quietly
from .sampler import NS_PER_S, CameraCounters, FrameQueues, SampledFrame
from .translate import stamp_to_ns


RELIABLE, BEST_EFFORT = QoSReliabilityPolicy.RELIABLE, QoSReliabilityPolicy.BEST_EFFORT


def match_reliability(publishers: list[QoSReliabilityPolicy]) -> tuple[QoSReliabilityPolicy, str]:
    """The subscription's reliability for these publishers' and why: reliable when every one is
    reliable, best effort otherwise (a best-effort subscription matches any publisher, and a reliable
    one would not match a best-effort publisher at all)."""
    if not publishers:
        return BEST_EFFORT, "best effort: no publisher yet"
    others = sum(1 for p in publishers if p != RELIABLE)
    if others:
        return BEST_EFFORT, f"best effort: {others} of {len(publishers)} publisher(s) best effort"
    return RELIABLE, f"reliable: matched to {len(publishers)} publisher(s), all reliable"


class CameraInput:
    """One camera: its names, counters, subscription and the QoS it was subscribed with."""

    def __init__(self, name: str, counters: CameraCounters, group, topic: str = ""):
        self.name = name  # as written in camera_topics
        # the resolved full name (namespace and remaps applied): the session's camera key, and the
        # name the log, the diagnostics, MemoryStatus and every error use
        self.topic = topic or name
        self.counters = counters
        self.group = group
        self.subscription = None
        # the subscription being replaced, kept until the new one has matched the publishers, and
        # the stamps taken meanwhile (both deliver the frames sent in between)
        self.retiring = None
        self.retiring_checks = 0
        self.overlap_stamps: deque[int] = deque(maxlen=256)
        self.reliability_overridden = False  # qos_overrides.<topic>.subscription.reliability given
        self.reliability: QoSReliabilityPolicy | None = None  # of the current subscription
        self.qos_text = "not subscribed"  # what the log and the diagnostics say about the QoS
        self.qos_changes = 0  # resubscriptions because the publishers changed
        self.logged_reasons: set[str] = set()
        self.last_ingested_ns: int | None = None  # the stamp of the last frame the ingest thread took


class Cameras:
    """The cameras of one configured node: their subscriptions, queues and the ingest thread.

    Given ``node`` (the rclpy node it subscribes, publishes acknowledgements and reads parameters
    with), the ``session`` frames go into, the cameras' ``inputs`` by resolved topic, the image
    ``converter``, the ``diagnostics`` it ticks, ``ack_pub`` (frame_acks), the node's ``stopping``
    event, and ``after_chunk(report)``: called on the ingest thread after a chunk went in
    (``report`` None when it failed) and after a reset on a time jump.
    """

    def __init__(self, node, session, inputs: dict[str, CameraInput], queue_size: int, converter: ImageConverter,
                 diagnostics, ack_pub, stopping: threading.Event, sample_fps: float,
                 after_chunk: Callable[[ChunkReport | None], None], refresh_status: Callable[[], None]):
        self.node = node
        self.log = node.get_logger()
        self.session = session
        self.inputs = inputs
        self.queues = FrameQueues(queue_size)
        self.converter = converter
        self.diagnostics = diagnostics
        self.ack_pub = ack_pub
        self.stopping = stopping
        self.sample_fps = sample_fps
        self.after_chunk = after_chunk
        self.refresh_status = refresh_status
        self.ingest_error = ""  # an ingest failure outside the engine's own chunk errors
        self._thread: threading.Thread | None = None
        for camera in inputs.values():
            self._check_qos_overrides(camera)

    def key(self, camera: str) -> str:
        """The resolved topic of a camera asked for by that name or as written in camera_topics;
        anything else goes to the session as it is (which refuses it, naming the cameras)."""
        for cam in self.inputs.values():
            if camera and camera in (cam.name, cam.topic):
                return cam.topic
        return camera

    def activate(self) -> str:
        """Subscribe every camera and start the ingest thread; the reason when rclpy refuses a subscription."""
        for camera in self.inputs.values():
            try:
                self._subscribe(camera)
            except Exception as err:  # noqa: BLE001 - checked at configure already; anything else rclpy refuses
                return f"cannot subscribe to {camera.topic}: {str(err).splitlines()[0]}"
            camera.last_ingested_ns = None
        self.queues = FrameQueues(self.queues.capacity)
        self._thread = threading.Thread(target=self._ingest_loop, name="streamcache-ingest", daemon=True)
        self._thread.start()
        return ""

    def deactivate(self) -> None:
        """Unsubscribe and stop the ingest thread (the node has set ``stopping``)."""
        self.queues.close()
        for camera in self.inputs.values():
            for name in ("subscription", "retiring"):
                if getattr(camera, name) is not None:
                    self.node.destroy_subscription(getattr(camera, name))
                    setattr(camera, name, None)
            camera.overlap_stamps.clear()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def set_sample_fps(self, sample_fps: float) -> None:
        self.sample_fps = sample_fps
        for camera in list(self.inputs.values()):
            camera.counters.restart_sampling(sample_fps)

    def memory_replaced(self, restart_sampling: bool = False) -> None:
        """The memory was reset or loaded: a stamp before its frames is no time jump (and sampling
        starts again when ``restart_sampling``)."""
        for camera in self.inputs.values():
            if restart_sampling:
                camera.counters.restart_sampling()
            camera.last_ingested_ns = None

    @property
    def ingest_fps(self) -> float:
        return sum(c.counters.snapshot().ingest_rate for c in list(self.inputs.values()))

    def counters(self) -> dict:
        """Each camera's live frame counters, by resolved topic."""
        return {c.topic: c.counters.snapshot() for c in list(self.inputs.values())}

    def _qos_options(self, camera: CameraInput) -> QoSOverridingOptions:
        """The qos_overrides.<topic>.subscription.* parameters rclpy declares and applies: history
        and depth always; reliability only when given (rclpy keeps a declared value, which would
        then pin the reliability the first subscription had)."""
        kinds = [QoSPolicyKind.HISTORY, QoSPolicyKind.DEPTH]
        if camera.reliability_overridden:
            kinds.append(QoSPolicyKind.RELIABILITY)
        return QoSOverridingOptions(kinds)

    def _check_qos_overrides(self, camera: CameraInput) -> None:
        """A bad qos_overrides.<topic>.subscription.* value is a configuration error (found at
        configure, before anything is subscribed): declare and check them as rclpy will at activate."""
        from rclpy.qos_overriding_options import _declare_qos_parameters  # noqa: PLC0415
        from rclpy.subscription import Subscription  # noqa: PLC0415

        topic = camera.topic
        overrides = getattr(self.node, "_parameter_overrides", {})  # rclpy keeps the given ones here
        camera.reliability_overridden = (f"qos_overrides.{topic}.subscription.reliability" in overrides
                                         or self.node.has_parameter(f"qos_overrides.{topic}.subscription.reliability"))
        try:
            _declare_qos_parameters(Subscription, self.node, topic, self._camera_qos(BEST_EFFORT),
                                    self._qos_options(camera))
        except Exception as err:  # noqa: BLE001 - InvalidQosOverridesError, ParameterException, ...
            raise ConfigError(f"qos_overrides.{topic}.subscription", str(err).splitlines()[0]) from None

    @staticmethod
    def _camera_qos(reliability: QoSReliabilityPolicy) -> QoSProfile:
        """Sensor-data depth, history and durability (keep last 5, volatile) with ``reliability``."""
        sensor = qos_profile_sensor_data
        return QoSProfile(history=sensor.history, depth=sensor.depth, reliability=reliability,
                          durability=sensor.durability)

    def _publisher_reliability(self, camera: CameraInput) -> tuple[QoSReliabilityPolicy, str]:
        if camera.reliability_overridden:
            value = self.node.get_parameter(f"qos_overrides.{camera.topic}.subscription.reliability").value
            return QoSReliabilityPolicy[str(value).upper()], f"{str(value).replace('_', ' ')}: set by qos_overrides"
        publishers = self.node.get_publishers_info_by_topic(camera.topic)
        return match_reliability([p.qos_profile.reliability for p in publishers])

    def _subscribe(self, camera: CameraInput) -> None:
        msg_type = CompressedImage if camera.name.rstrip("/").endswith("/compressed") else Image
        reliability, camera.qos_text = self._publisher_reliability(camera)
        # a reliable subscription and a best-effort publisher do not match: rmw then warns on every
        # discovery; the next check (every second) moves to best effort, so say nothing here
        events = SubscriptionEventCallbacks(incompatible_qos=lambda info: None)
        camera.subscription = self.node.create_subscription(
            msg_type, camera.name, lambda msg, c=camera: self._on_image(c, msg), self._camera_qos(reliability),
            callback_group=camera.group, event_callbacks=events, qos_overriding_options=self._qos_options(camera))
        camera.reliability = reliability
        self.log.info(f"camera {camera.topic}: subscribed {camera.qos_text}")

    def match_qos(self) -> None:
        """The QoS timer (every second while active): resubscribe a camera whose publishers now
        call for the other reliability; retire the old subscription once the new one has matched."""
        for camera in list(self.inputs.values()):
            if camera.subscription is None or camera.reliability_overridden:
                continue
            try:
                self._retire_matched(camera)
                reliability, text = self._publisher_reliability(camera)
            except Exception:  # noqa: BLE001 - the context is shutting down
                return
            if reliability == camera.reliability:
                camera.qos_text = text
                continue
            if camera.retiring is not None:  # a change within a change: the older one goes now
                self.node.destroy_subscription(camera.retiring)
            camera.retiring, camera.retiring_checks = camera.subscription, 0
            camera.qos_changes += 1
            self._subscribe(camera)

    # at most this many QoS checks (seconds) with two subscriptions: a publisher that never matches
    # (gone meanwhile, or incompatible) must not keep the old one forever
    RETIRE_AFTER_CHECKS = 5

    def _retire_matched(self, camera: CameraInput) -> None:
        if camera.retiring is None:
            return
        camera.retiring_checks += 1
        publishers = len(self.node.get_publishers_info_by_topic(camera.topic))
        if camera.subscription.get_publisher_count() >= publishers or camera.retiring_checks >= self.RETIRE_AFTER_CHECKS:
            self.node.destroy_subscription(camera.retiring)
            camera.retiring = None
            camera.overlap_stamps.clear()

    def _taken_twice(self, camera: CameraInput, stamp_ns: int) -> bool:
        """While two subscriptions overlap, a frame both deliver is taken once."""
        if camera.retiring is None:
            return False
        if stamp_ns in camera.overlap_stamps:
            return True
        camera.overlap_stamps.append(stamp_ns)
        return False

    def _on_image(self, camera: CameraInput, msg) -> None:
        stamp_ns = stamp_to_ns(msg.header.stamp)
        if self._taken_twice(camera, stamp_ns):
            return
        camera.counters.arrived(stamp_ns)
        self.diagnostics.frame_arrived(camera.topic, stamp_ns, self.node.get_clock().now().nanoseconds)
        try:
            if not is_compressed(msg):
                check_raw_image(msg, self.converter.max_pixels)  # cheap: every frame is checked
            if camera.counters.is_due(stamp_ns):
                # compressed images are decoded (and so fully checked) only when sampled
                rgb = self.converter.to_rgb(msg)
                camera.counters.sampled(stamp_ns)
                dropped, waiting = self.queues.put(SampledFrame(camera.topic, stamp_ns, rgb))
                camera.counters.queued(waiting)  # waits behind a chunk or a question, encoded after it
                if dropped is not None:  # the queue was full: the encoder is slower than the sampling
                    camera.counters.dropped()
                    self._ack(camera, dropped.stamp_ns)
                return  # acknowledged once the ingest thread has taken it
        except ImageRejected as err:
            self._reject(camera, err.reason, str(err))
        except Exception as err:  # noqa: BLE001 - an exception here would end the executor's spin
            self._reject(camera, "internal", f"conversion failed: {type(err).__name__}: {err}")
            self.log.debug(traceback.format_exc())
        self._ack(camera, stamp_ns)

    def _reject(self, camera: CameraInput, reason: str, text: str) -> None:
        camera.counters.rejected(reason, text)
        message = f"rejected a frame from {camera.topic}: {text}"
        if reason not in camera.logged_reasons:
            camera.logged_reasons.add(reason)
            self.log.warning(message)
        else:
            self.log.warning(message, throttle_duration_sec=5.0)

    def _ack(self, camera: CameraInput, stamp_ns: int) -> None:
        """Tell a lock-step replay that this frame has been dealt with (taken, skipped or rejected)."""
        msg = Header(frame_id=camera.topic)
        msg.stamp.sec, msg.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
        publish_quietly(self.ack_pub, msg)

    def _ingest_loop(self) -> None:
        while not self.stopping.is_set():
            frame = self.queues.take(timeout=0.5)
            if frame is None:
                continue
            camera = self.inputs.get(frame.camera)
            if camera is None:
                continue
            self._time_jump(camera, frame.stamp_ns)
            report, failed = None, False
            try:
                report = self.session.add_frame(frame.rgb, stamp=frame.stamp_ns * 1e-9, camera=frame.camera)
                camera.counters.ingested()
            except ChunkError as err:  # dropped (memory as before it) or kept uncompressed: the session says
                camera.counters.ingested()  # the frame was taken; its chunk failed
                failed, self.ingest_error = True, ""
                self.log.error(str(err))
            except FrameError as err:
                camera.counters.rejected("frame", str(err))
                self.log.warning(f"frame from {camera.topic} refused by the session: {err}")
            except Exception as err:  # noqa: BLE001 - the ingest thread must survive anything
                failed, self.ingest_error = True, f"ingest failed: {type(err).__name__}: {err}"
                self.log.error(f"{self.ingest_error}\n{traceback.format_exc()}")
            if report is not None:
                self.ingest_error = ""
            if report is not None or failed:
                self.after_chunk(report)
            self._ack(camera, frame.stamp_ns)

    def _time_jump(self, camera: CameraInput, stamp_ns: int) -> None:
        """Stamps going back by more than one sampling period (a bag looped, a sim clock reset):
        the sampler has restarted its slots (sampler.py); the memory is kept, or forgotten with
        reset_on_time_jump. The camera's diagnostics show the jump."""
        last, camera.last_ingested_ns = camera.last_ingested_ns, stamp_ns
        if last is None or stamp_ns >= last - NS_PER_S / self.sample_fps:
            return
        back = (last - stamp_ns) / NS_PER_S
        if self.node.get_parameter("reset_on_time_jump").value:
            forgotten = self.session.reset()
            for other in self.inputs.values():
                other.last_ingested_ns = stamp_ns if other is camera else None
            self.refresh_status()
            self.log.warning(f"{camera.topic}: stamps jumped back {back:.3f} s: memory reset "
                                      f"({forgotten.frames} frames forgotten, {forgotten.archived_chunks} archived chunks "
                                      "deleted, reset_on_time_jump)")
        else:
            self.log.warning(f"{camera.topic}: stamps jumped back {back:.3f} s: sampling restarted, "
                                      "memory kept (reset_on_time_jump is false)")

