"""Stamp-based sampling, the latest-frame slot (drop when busy) and the per-camera counters."""
import threading

import numpy as np
import pytest

from streamcache_ros.node.sampler import CameraCounters, FrameQueues, SampledFrame, StampSampler

S = 1_000_000_000
EPOCH = 1_700_000_000 * S  # epoch-sized stamps: float seconds would lose the nanoseconds here


def sampled(sampler, stamps):
    return [i for i, stamp in enumerate(stamps) if sampler.offer(stamp)]


def test_a_30_fps_camera_sampled_at_1_fps_keeps_the_first_frame_of_each_second():
    stamps = [EPOCH + i * S // 30 for i in range(90)]
    assert sampled(StampSampler(1.0), stamps) == [0, 30, 60]


def test_sampling_follows_stamps_not_arrival_so_any_replay_rate_gives_the_same_frames():
    stamps = [EPOCH + 7 + i * 100_000_000 for i in range(40)]  # 10 fps, an odd origin
    # the same stamps, however fast they arrive, give the same choice: every 5th frame at 2 fps
    assert sampled(StampSampler(2.0), stamps) == list(range(0, 40, 5))
    # arrival jitter of +-3 ms on the frames inside a slot changes nothing; a boundary frame 3 ms
    # late is still the first of its slot
    jittered = [s + (3_000_000 if i % 2 else -3_000_000) if i % 5 else s + 3_000_000 * (i > 0)
                for i, s in enumerate(stamps)]
    assert sampled(StampSampler(2.0), jittered) == list(range(0, 40, 5))


def test_slots_are_counted_in_integer_nanoseconds():
    # 3 fps: slot k starts at k/3 s. The frame at exactly 1/3 s (rounded down to the ns) belongs to
    # slot 0 because 333_333_333 ns < 1/3 s; the one a nanosecond later to slot 1.
    sampler = StampSampler(3.0)
    assert sampler.offer(EPOCH)
    assert not sampler.offer(EPOCH + 333_333_333)
    assert sampler.offer(EPOCH + 333_333_334)


def test_a_jump_back_restarts_sampling_and_a_small_reorder_is_skipped():
    sampler = StampSampler(1.0)
    assert sampled(sampler, [EPOCH, EPOCH + S, EPOCH + 2 * S]) == [0, 1, 2]
    assert not sampler.offer(EPOCH + 2 * S - S // 2)  # half a period back: reordered, not sampled
    assert sampler.restarts == 0
    assert sampler.offer(EPOCH - 100 * S)  # a bag started again
    assert sampler.restarts == 1
    assert not sampler.offer(EPOCH - 100 * S + S // 2)
    assert sampler.offer(EPOCH - 99 * S)


def test_is_due_does_not_use_up_the_slot():
    sampler = StampSampler(1.0)
    sampler.offer(EPOCH)
    assert sampler.is_due(EPOCH + S)  # a frame that then turns out unusable ...
    assert sampler.is_due(EPOCH + S + 1)  # ... leaves the slot to the next one
    sampler.commit(EPOCH + S + 1)
    assert not sampler.is_due(EPOCH + S + 2)


def test_sample_fps_must_be_positive():
    with pytest.raises(ValueError):
        StampSampler(0.0)


def frame(camera, stamp, arrived):
    return SampledFrame(camera, stamp, np.zeros((1, 1, 3), np.uint8), arrived=arrived)


def test_frames_sampled_while_the_ingest_thread_waits_are_kept_in_order():
    """Frames kept during answers: a frame sampled while the ingest thread waits (a question being answered)
    waits behind the others and is taken later, in order; none is dropped until the queue is full."""
    queues = FrameQueues(capacity=3)
    assert [queues.put(frame("a", stamp, float(stamp))) for stamp in (1, 2, 3)] == [(None, 0), (None, 1), (None, 2)]
    assert queues.most_waiting == 3
    assert [queues.take(timeout=0).stamp_ns for _ in range(3)] == [1, 2, 3]
    assert queues.take(timeout=0) is None


def test_a_full_queue_drops_its_oldest_frame():
    queues = FrameQueues(capacity=2)
    queues.put(frame("a", 1, 1.0))
    queues.put(frame("a", 2, 2.0))
    dropped, waiting = queues.put(frame("a", 3, 3.0))
    assert dropped.stamp_ns == 1 and waiting == 2  # dropped: the encoder is slower than the sampling
    assert [queues.take(timeout=0).stamp_ns for _ in range(2)] == [2, 3]


def test_a_queue_of_one_keeps_the_latest_frame():
    slots = FrameQueues(capacity=1)
    assert slots.put(frame("a", 1, 1.0)) == (None, 0)
    replaced, _ = slots.put(frame("a", 2, 2.0))
    assert replaced is not None and replaced.stamp_ns == 1
    assert slots.take(timeout=0).stamp_ns == 2
    assert slots.take(timeout=0) is None


def test_take_gives_the_camera_waiting_longest():
    slots = FrameQueues(capacity=4)
    slots.put(frame("b", 5, 2.0))
    slots.put(frame("a", 9, 1.0))
    assert [slots.take(timeout=0).camera for _ in range(2)] == ["a", "b"]


def test_close_wakes_a_waiting_taker():
    slots = FrameQueues()
    got = []
    taker = threading.Thread(target=lambda: got.append(slots.take(timeout=30)))
    taker.start()
    slots.close()
    taker.join(timeout=30)
    assert not taker.is_alive() and got == [None]


def test_camera_counters_add_up():
    counters = CameraCounters("/cam", 1.0)
    for i, stamp in enumerate([EPOCH, EPOCH + S // 2, EPOCH + S, EPOCH + 2 * S]):
        counters.arrived(stamp)
        if counters.is_due(stamp):
            counters.sampled(stamp)
    counters.rejected("encoding", "unsupported encoding 'yuv422'")
    counters.rejected("encoding", "unsupported encoding 'yuv422'")
    counters.rejected("step", "step 8 is less than ...")
    counters.dropped()
    counters.queued(0)
    counters.queued(2)  # two frames were waiting ahead of it
    counters.ingested()
    snap = counters.snapshot()
    assert (snap.received, snap.sampled, snap.dropped, snap.ingested, snap.waited) == (4, 3, 1, 1, 1)
    assert snap.rejected == 3 and snap.rejected_by_reason == {"encoding": 2, "step": 1}
    assert snap.last_reject.startswith("step") and snap.last_stamp_ns == EPOCH + 2 * S
    counters.restart_sampling()  # after a memory reset the next frame opens a new slot
    assert counters.is_due(EPOCH + 2 * S + 1)
    counters.sampled(EPOCH + 3 * S)
    counters.restart_sampling(4.0)  # a new sample_fps: slots of 0.25 s from the next frame
    counters.sampled(EPOCH + 4 * S)
    assert counters.is_due(EPOCH + 4 * S + S // 4) and not counters.is_due(EPOCH + 4 * S + S // 5)
    assert counters.snapshot().time_jumps == 0
