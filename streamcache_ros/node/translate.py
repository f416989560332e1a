"""Between ROS messages and the engine's dataclasses: the node's whole vocabulary of conversions."""
from __future__ import annotations

from builtin_interfaces.msg import Time
from geometry_msgs.msg import Pose as PoseMsg
from geometry_msgs.msg import PoseStamped
from sensor_msgs.msg import CompressedImage
from streamcache_ros_interfaces.msg import FrameRetention, MemoryStatus, WatchEvent

from ..engine import Place, Pose, resolve_place
from ..engine.status import Answer, MemoryCounts, MemoryTimeline, SessionStatus, WatchAnswer, WhenAnswer, size_text
from .sampler import NS_PER_S, CameraSnapshot


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def seconds_to_time(seconds: float) -> Time:
    ns = int(round(seconds * 1e9))
    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def window_bound(stamp) -> float | None:
    """A request's ``since`` / ``until`` in the engine's seconds (as the frames' stamps are taken);
    None for zero (open)."""
    ns = stamp_to_ns(stamp)
    return ns * 1e-9 if ns else None


def memory_status(status: SessionStatus, cameras: dict[str, CameraSnapshot], stamp,
                  most_waiting: int = 0) -> MemoryStatus:
    """The MemoryStatus message: the engine's status plus the cameras' live frame counters (by
    resolved topic) and the most frames a camera's queue has held."""
    msg = MemoryStatus()
    msg.header.stamp = stamp
    cache, chunk, device = status.cache, status.last_chunk, status.device_memory
    msg.policy, msg.model_id = status.policy, status.model_id
    msg.frames_in_memory = status.frames_in_memory
    msg.oldest_stamp = seconds_to_time(status.oldest_stamp)
    msg.newest_stamp = seconds_to_time(status.newest_stamp)
    msg.cameras = list(cameras)
    msg.camera_frames_in_memory = [status.camera_memory.get(c, MemoryCounts()).frames for c in cameras]
    msg.kv_tokens, msg.kv_bytes, msg.budget_tokens = cache.kv_tokens, cache.kv_bytes, cache.budget_tokens
    msg.layer_tokens = [int(n) for n in cache.layer_tokens]
    msg.bank_tokens = [int(n) for n in cache.bank_tokens]
    msg.gpu_allocated_bytes, msg.gpu_reserved_bytes = device.allocated_bytes, device.reserved_bytes
    msg.gpu_peak_bytes = device.peak_bytes
    msg.process_rss_bytes = status.process_rss_bytes
    if status.archive is not None:
        archive = status.archive
        msg.archive_chunks, msg.archive_bytes = archive.chunks, archive.bytes
        msg.archive_oldest_stamp = seconds_to_time(archive.oldest_stamp)
        msg.archive_newest_stamp = seconds_to_time(archive.newest_stamp)
        msg.chunks_not_archived, msg.archive_holes = archive.not_archived, archive.holes
    if chunk is not None:
        msg.encode_ms, msg.prefill_ms, msg.compress_ms = chunk.encode_ms, chunk.prefill_ms, chunk.compress_ms
    msg.last_ttft_ms = status.last_ttft_ms
    msg.chunks_encoded, msg.chunks_failed = status.chunks_encoded, status.chunks_failed
    msg.questions_answered = status.questions_answered
    msg.most_frames_waiting = most_waiting
    for snap in cameras.values():
        msg.frames_waited += snap.waited
        msg.frames_received += snap.received
        msg.frames_sampled += snap.sampled
        msg.frames_dropped += snap.dropped
        msg.frames_rejected += snap.rejected
        msg.ingest_fps += snap.ingest_rate
    return msg


def refuse(result, message: str, held: MemoryCounts | None = None):
    """An Ask response or action result that says why the question was not answered, and what the
    memory holds (``held``: every camera's, or the camera asked about)."""
    result.success = False
    result.error_message = message
    result.option_index = -1
    if held is not None:
        fill_memory(result, held)
    return result


def fill_memory(result, held: MemoryCounts):
    result.frames_in_memory = held.frames
    result.oldest_stamp = seconds_to_time(held.oldest_stamp)
    result.newest_stamp = seconds_to_time(held.newest_stamp)
    result.kv_tokens = held.kv_tokens
    return result


def fill_answer(result, answer: Answer, now_s: float):
    """An Ask response or action result from the engine's answer; ``now_s``: the node's clock."""
    result.success = not answer.cancelled and not answer.kind_error
    # an answer of the wrong kind is no answer: success false, the model's words kept in `answer`
    # (docs/interfaces.md "Free-text answers")
    result.error_message = "cancelled" if answer.cancelled else answer.kind_error
    result.answer = answer.text
    result.option_index = answer.option_index
    result.option_probabilities = [float(p) for p in answer.option_probabilities]
    result.recalled_chunks = int(answer.recalled_chunks)
    result.frames_in_memory = answer.frames_in_memory
    result.oldest_stamp = seconds_to_time(answer.oldest_stamp)
    result.newest_stamp = seconds_to_time(answer.newest_stamp)
    result.newest_frame_age_s = now_s - answer.newest_stamp  # how fresh the memory it answered from is
    result.kv_tokens = answer.kv_tokens
    result.ttft_ms = answer.ttft_ms
    result.total_ms = answer.total_ms
    result.answer_tokens = answer.answer_tokens
    result.evidence_stamps = [seconds_to_time(e.stamp) for e in answer.evidence]
    result.evidence_cameras = [e.camera for e in answer.evidence]
    result.evidence_weights = [float(e.weight) for e in answer.evidence]
    result.evidence_summary_share = float(answer.evidence_summary_share)
    result.searched_since = seconds_to_time(answer.searched_since)
    result.evicted_before = bool(answer.evicted_before)
    result.frames_in_window = int(answer.frames_in_window)
    result.found_by, result.index_candidates = answer.found_by, int(answer.index_candidates)
    result.search_complete = bool(answer.search_complete)
    result.evidence_poses = [pose_stamped(e.pose, e.stamp) for e in answer.evidence]
    result.frames_in_place = int(answer.frames_in_place)
    fill_holes(result, answer.holes)
    return result


def request_place(request, named: dict) -> Place | None:
    """The place an Ask / When request limits its question to (None: anywhere); PlaceError for a name
    the places_file lacks or a radius that is not a positive number (docs/places.md)."""
    center = getattr(request, "place_center", None)
    return resolve_place(getattr(request, "place", ""), None if center is None else (float(center.x), float(center.y)),
                         float(getattr(request, "place_radius", 0.0)), named)


def pose_message(pose: Pose) -> PoseMsg:
    msg = PoseMsg()
    msg.position.x, msg.position.y, msg.position.z = float(pose.x), float(pose.y), float(pose.z)
    o = msg.orientation
    o.x, o.y, o.z, o.w = float(pose.qx), float(pose.qy), float(pose.qz), float(pose.qw)
    return msg


def pose_stamped(pose: Pose | None, stamp: float) -> PoseStamped:
    """A frame's pose, stamped with the frame's stamp; an empty frame_id (and identity pose) for none."""
    msg = PoseStamped()
    msg.header.stamp = seconds_to_time(stamp)
    if pose is not None:
        msg.header.frame_id = pose.frame_id
        msg.pose = pose_message(pose)
    return msg


def fill_holes(reply, holes) -> None:
    """A reply's hole_* fields (docs/archive.md "Holes"), oldest first."""
    reply.hole_since = [seconds_to_time(h.since) for h in holes]
    reply.hole_until = [seconds_to_time(h.until) for h in holes]
    reply.hole_reasons = [h.reason for h in holes]


def fill_images(reply, thumbnails) -> None:
    """A reply's evidence_images from archive thumbnails (None entries left out: a frame the archive
    no longer holds): header.stamp the frame's stamp, frame_id its camera, as rqt and Foxglove read it."""
    reply.evidence_images = [compressed_image(t) for t in thumbnails if t is not None]


def compressed_image(thumbnail) -> CompressedImage:
    msg = CompressedImage(format="jpeg", data=bytes(thumbnail.jpeg))
    msg.header.stamp = seconds_to_time(thumbnail.stamp)
    msg.header.frame_id = thumbnail.camera
    return msg


def fill_timeline(response, timeline: MemoryTimeline, poses: list[Pose | None] | None = None):
    """A MemoryTimeline response from the engine's timeline, with each frame's pose (``poses``)."""
    response.policy, response.num_layers = timeline.policy, timeline.num_layers
    response.bank_names = list(timeline.bank_names)
    poses = poses or [None] * len(timeline.frames)
    response.frames = [FrameRetention(stamp=seconds_to_time(f.stamp), camera=f.camera, unit=f.unit,
                                      layer_kept=[float(x) for x in f.layer_kept],
                                      bank_kept=[float(x) for x in f.bank_kept], has_pose=pose is not None,
                                      pose=PoseMsg() if pose is None else pose_message(pose),
                                      pose_frame="" if pose is None else pose.frame_id)
                       for f, pose in zip(timeline.frames, poses)]
    fill_holes(response, timeline.holes)
    return response


def fill_when(response, found: WhenAnswer):
    """A When response from the engine's search."""
    response.success, response.error_message = True, ""
    response.found = found.found
    response.stamp = seconds_to_time(found.stamp) if found.found else Time()
    response.camera = found.camera
    response.yes_probability = float(found.yes_probability)
    response.timeline_stamps = [seconds_to_time(s) for s in found.timeline_stamps]
    response.timeline_yes_probability = [float(p) for p in found.timeline_yes_probability]
    response.questions_asked = int(found.questions_asked)
    response.total_ms = float(found.total_ms)
    response.frames_searched = int(found.frames_searched)
    response.searched_since = seconds_to_time(found.searched_since)
    response.evicted_before = bool(found.evicted_before)
    response.may_be_older = bool(found.may_be_older)
    response.found_by = found.found_by
    response.index_candidates = int(found.index_candidates)
    response.recalled_chunks = int(found.recalled_chunks)
    response.frames_in_window = int(found.frames_in_window)
    response.may_lie_in_hole = bool(found.may_lie_in_hole)
    response.search_complete = bool(found.search_complete)
    response.has_pose = found.pose is not None
    response.pose = pose_stamped(found.pose, found.stamp if found.found else 0.0)
    response.frames_in_place = int(found.frames_in_place)
    fill_holes(response, found.holes)
    return response


def watch_event(answer: WatchAnswer, changed: bool) -> WatchEvent:
    msg = WatchEvent(camera=answer.camera, question=answer.question, answer=answer.answer,
                     yes_probability=float(answer.yes_probability), changed=changed)
    msg.header.stamp = seconds_to_time(answer.stamp)
    return msg


def archive_lines(session, folder: str, values: dict) -> list[tuple[bool, str]]:
    """(is a warning, line) for the log at configure: what opening the archive found and mended,
    where it is and its bound, and which index it has and whether its "nothing here" is trusted."""
    if not folder:
        return [(False, f"archive off (archive_path '{values['archive_path']}')")]
    lines = [(True, warning) for warning in session.archive_warnings()]
    status = session.status()
    held = status.archive
    lines.append((False, f"archive: {held.path or folder} ({held.chunks} chunk(s) kept from before, "
                         f"{size_text(held.file_bytes)} on disk; bound {size_text(held.max_bytes)})"))
    if status.index is None:
        lines.append((False, f"archive index off (retrieval_model_path '{values['retrieval_model_path']}'): `when` "
                             "and \"did you see\" walk the archive"))
    else:
        lines.append((not status.index.trusted, f"archive {status.index.description}"))
    return lines
