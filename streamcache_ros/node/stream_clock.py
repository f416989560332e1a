"""How old a camera's frame is, judged against the right clock (docs/interfaces.md "Diagnostics").

A live camera stamps its frames by the clock the node runs on: a frame's age is the node's clock minus
its stamp. A bag replayed faster than real time without a clock of its own (streamcache-replay
--fast --lock-step, the package's own way of testing) sends frames stamped an hour ago, and each
next frame is stamped further ahead than the time it took to arrive: by the node's clock every frame
is "too far in the past", and the camera diagnostic was red for the whole run. Such a stream is
judged against its own clock instead (as is any stream for its first second of stamps): the age is how far a frame lags behind the stream's best,
the smallest (node clock - stamp) it has shown, so a replay that keeps up is fresh and one that
falls behind ages. With use_sim_time the node's clock is the replay's /clock and stays the judge
unless the frames outrun it too.
"""
from __future__ import annotations

from collections import deque

# frames arrive faster than their stamps when the stamps advance this many times faster than the
# arrivals over the recent frames, and by at least a second: a live camera's bursts do not
REPLAY_SPEEDUP = 2.0
MIN_STAMP_SPAN_NS = 1_000_000_000
RECENT_FRAMES = 20
NODE_CLOCK, STREAM_CLOCK = "the node's clock", "the stream's own clock (frames arrive faster than their stamps: a replay)"


class StreamClock:
    """One camera's judge of frame age: ``age_s`` per frame; ``judged_by`` says which clock."""

    def __init__(self):
        self.recent: deque[tuple[int, int]] = deque(maxlen=RECENT_FRAMES)  # (stamp, arrival) ns
        self.replay = False
        self.decided = False  # a second of stamps seen: enough to tell a replay from a live camera
        self.best_offset_ns: int | None = None  # the smallest node clock - stamp seen

    @property
    def judged_by(self) -> str:
        return NODE_CLOCK if self.decided and not self.replay else STREAM_CLOCK

    def age_s(self, stamp_ns: int, now_ns: int, arrival_ns: int) -> float:
        """The frame's age in seconds: ``now_ns`` the node's clock, ``arrival_ns`` a steady clock."""
        if self.recent and stamp_ns < self.recent[-1][0]:  # stamps jumped back: a bag loop, a new stream
            self.recent.clear()
            self.replay, self.decided, self.best_offset_ns = False, False, None
        self.recent.append((stamp_ns, arrival_ns))
        offset = now_ns - stamp_ns
        self.best_offset_ns = offset if self.best_offset_ns is None else min(self.best_offset_ns, offset)
        (first_stamp, first_arrival), (last_stamp, last_arrival) = self.recent[0], self.recent[-1]
        stamp_span, arrival_span = last_stamp - first_stamp, last_arrival - first_arrival
        if stamp_span >= MIN_STAMP_SPAN_NS:
            self.decided = True
            # once a replay, judged so until the stamps jump back
            self.replay = self.replay or stamp_span > REPLAY_SPEEDUP * arrival_span
        # until a second of stamps tells which it is, the stream's own clock: a replay's first frames
        # are not an error, and a live camera's age shows a second later
        return (offset if self.decided and not self.replay else offset - self.best_offset_ns) / 1e9
