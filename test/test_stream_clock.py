"""A frame's age for the camera diagnostic (streamcache_ros/node/stream_clock.py): a live camera by
the node's clock, a replay faster than real time by its own; one that falls behind ages either way."""
from streamcache_ros.node.stream_clock import NODE_CLOCK, STREAM_CLOCK, StreamClock

S = 1_000_000_000
BAG_START = 1_700_000_000 * S  # a bag recorded long before the node's clock
NOW = 1_800_000_000 * S


def test_a_fast_replay_of_an_old_bag_is_fresh_by_its_own_clock():
    clock = StreamClock()
    # stamps 1 s apart, sent 0.1 s apart (lock-step --fast)
    ages = [clock.age_s(BAG_START + i * S, NOW + i * S // 10, i * S // 10) for i in range(30)]
    assert max(ages) == 0.0 and clock.judged_by == STREAM_CLOCK


def test_a_replay_that_falls_behind_ages():
    clock = StreamClock()
    for i in range(10):
        clock.age_s(BAG_START + i * S, NOW + i * S // 10, i * S // 10)
    # then each frame takes 2 s of the node's clock for 1 s of stamps: 1 s more behind per frame
    ages = [clock.age_s(BAG_START + (10 + i) * S, NOW + S + 2 * i * S, S + 2 * i * S) for i in range(1, 8)]
    assert ages == sorted(ages) and ages[-1] > 5.0


def test_a_live_camera_is_judged_by_the_node_clock():
    clock = StreamClock()
    # stamps 30 s old, at the camera's own pace of 10 Hz: after a second of stamps, 30 s old
    ages = [clock.age_s(NOW - 30 * S + i * S // 10, NOW + i * S // 10, i * S // 10) for i in range(20)]
    assert clock.judged_by == NODE_CLOCK and ages[-1] == 30.0
    fresh = StreamClock()
    assert max(fresh.age_s(NOW + i * S // 10, NOW + i * S // 10 + S // 100, i * S // 10) for i in range(20)) < 0.02


def test_stamps_jumping_back_start_the_judgement_again():
    clock = StreamClock()
    for i in range(20):
        clock.age_s(BAG_START + i * S, NOW + i * S // 10, i * S // 10)
    assert clock.judged_by == STREAM_CLOCK
    assert clock.age_s(BAG_START, NOW + 3 * S, 3 * S) == 0.0  # a bag loop: its own clock again, from here
    assert not clock.decided
