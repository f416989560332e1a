"""The camera side of the node: image callbacks (validate, sample by stamp, put the frame in the
camera's one-frame slot) and the ingest thread that takes frames from the slots into the session.

Faults (docs/reliability.md): a bad image is rejected with its reason and counted; a chunk that
fails (the model raising, CUDA out of memory) is dropped and reported while ingest goes on; nothing
a camera sends can end the process.
"""
from __future__ import annotations

import traceback

from rclpy.qos import QoSProfile, qos_profile_sensor_data
from rclpy.qos_overriding_options import QoSOverridingOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header

from ..engine.errors import ChunkError, ConfigError, FrameError
from .image_conversion import ImageRejected, check_raw_image, is_compressed
from .sampler import NS_PER_S, CameraCounters, SampledFrame
from .translate import stamp_to_ns


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


class CameraIngest:
    """Mixed into the node (node.py), which owns ``cameras``, ``slots``, ``converter``, ``session``,
    ``diagnostics``, ``ack_pub``, ``snapshots``, ``_stopping`` and ``sample_fps``."""

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

    def _subscribe(self, camera: CameraInput) -> None:
        msg_type = CompressedImage if camera.name.rstrip("/").endswith("/compressed") else Image
        # sensor-data QoS (best effort) by default; qos_overrides.<topic>.subscription.reliability
        # := reliable for large images from a reliable publisher (best effort loses big messages)
        camera.subscription = self.create_subscription(
            msg_type, camera.name, lambda msg, c=camera: self._on_image(c, msg), qos_profile_sensor_data,
            callback_group=camera.group, qos_overriding_options=QoSOverridingOptions.with_default_policies())

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
        msg.stamp.sec, msg.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
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
            except ChunkError as err:  # dropped (memory as before it) or kept uncompressed: the session says
                camera.counters.ingested()  # the frame was taken; its chunk failed
                failed, self._ingest_error = True, ""
                self.get_logger().error(str(err))
            except FrameError as err:
                camera.counters.rejected("frame", str(err))
                self.get_logger().warning(f"frame from {camera.topic} refused by the session: {err}")
            except Exception as err:  # noqa: BLE001 - the ingest thread must survive anything
                failed, self._ingest_error = True, f"ingest failed: {type(err).__name__}: {err}"
                self.get_logger().error(f"{self._ingest_error}\n{traceback.format_exc()}")
            if report is not None:
                self._ingest_error = ""
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

