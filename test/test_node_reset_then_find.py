"""After a reset the next stream is found as the first was, over DDS (docs/archive.md "The store"):
a node with the archive and the bundled index, HERMES, one frame a second; stream A replayed, then
for each of its windows `when` last and first for an identity absent there, a windowed "did you see"
for it and for one present, and `when` last for the present one; then `reset_memory` (or a time jump
with reset_on_time_jump), stream B, and the same questions over B's windows. Both streams held-out
world streams, every frame waited for (lock-step)."""
import pytest

from node_procs import Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_reset_find"
CAM = "/reset_find/cam"
S = 1_000_000_000
START = bagfile.DEFAULT_START_NS
FRAMES = 360
WINDOW = 60
SEEDS = (800_000_611, 800_000_612)  # the tests' seed range: no training run draws it
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
PARAMS = {"model_path": "world-qwen2_5_vl", "policy": "hermes", "chunk_frames": 8}


def ask_every_window(client, stream, start_ns: int) -> dict:
    """Each window's questions; the counts of right answers by kind."""
    right = {"when present": 0, "when absent": 0, "seen present": 0, "seen absent": 0}
    everything = sorted((s, c) for s in world.SHAPES for c in world.COLOUR_NAMES)
    for first in range(0, FRAMES, WINDOW):
        inside = sorted({v.identity for f in stream.truth[first:first + WINDOW] for v in f})
        present = inside[first // WINDOW % len(inside)]
        absent = next(i for i in everything[first // WINDOW:] + everything if i not in inside)
        since, until = (start_ns + first * S) / S, (start_ns + (first + WINDOW - 1) * S) / S
        ask = {identity: world.SEEN_PROBE.format(shape=identity[0], colour=identity[1]) for identity in (present, absent)}
        for mode in ("last", "first"):
            reply = client.when(ask[absent], mode, since=since, until=until)
            assert reply.success, reply.error_message
            right["when absent"] += not reply.found and reply.search_complete
        for identity, key in ((present, "seen present"), (absent, "seen absent")):
            reply = client.ask(ask[identity], ["yes", "no"], since=since, until=until)
            assert reply.success, reply.error_message
            right[key] += reply.answer == ("yes" if identity == present else "no")
        reply = client.when(ask[present], "last", since=since, until=until)
        last = max(i for i in range(first, first + WINDOW) if present in {v.identity for v in stream.truth[i]})
        right["when present"] += reply.found and abs(stamp_ns(reply.stamp) - start_ns - last * S) <= 2 * S
    return right


@pytest.mark.parametrize("how", ["reset_memory", "time jump"])
def test_after_a_reset_the_next_stream_is_found_as_the_first_was(how, domain, tmp_path):
    streams = [world.make_stream(seed, FRAMES, look=LOOK) for seed in SEEDS]
    # B later than A for the service; earlier for a time jump (stamps going back reset the memory)
    starts = [START, START + (FRAMES + 100) * S] if how == "reset_memory" else [START, START - 2 * FRAMES * S]
    bags = [bagfile.make_world_bag(tmp_path / f"bag{i}", seed, FRAMES, look=LOOK, topic=CAM, start_ns=start)
            for i, (seed, start) in enumerate(zip(SEEDS, starts))]
    params = {**PARAMS, "archive_path": str(tmp_path / "archive"), "reset_on_time_jump": how == "time jump"}
    windows = FRAMES // WINDOW
    with Proc(tiny_node(NS, [CAM], **params), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as client:
            replay_lock_step(domain, bags[0], NS, "--fast")
            first = ask_every_window(client, streams[0], starts[0])
            if how == "reset_memory":
                assert client.reset().archived_chunks_cleared == FRAMES // 8
            replay_lock_step(domain, bags[1], NS, "--fast")
            status = client.memory_status()
            assert status.archive_chunks == FRAMES // 8  # stream B alone
            assert stamp_ns(status.archive_oldest_stamp) == starts[1]
            second = ask_every_window(client, streams[1], starts[1])
        if how == "time jump":
            assert "stamps jumped back" in proc.output() and "memory reset" in proc.output()
    for right in (first, second):
        assert right["when absent"] == 2 * windows and right["seen absent"] == windows, right
        assert right["when present"] >= windows - 1 and right["seen present"] >= windows - 1, right
    assert second["when present"] >= first["when present"] - 1, (first, second)
