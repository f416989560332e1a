"""A snapshot file that is truncated, corrupted, of another format version or no snapshot at all is
refused, and the memory stays as it was (docs/reliability.md, "Memory across restarts"). The file is
fuzzed: cut at many lengths, bytes flipped all over it, header fields changed."""
import random

import pytest

from streamcache_ros.engine import Session, SessionConfig, SnapshotError
from streamcache_ros.engine.memory.snapshots import SNAPSHOT_FORMAT

from conftest import policy_for, states_equal

MUTATIONS = 120


@pytest.fixture(scope="module")
def saved(qwen_adapter, tmp_path_factory):
    """A session with memory and the snapshot of another memory of it (so a load would change it)."""
    from streamcache_ros import world  # noqa: PLC0415

    session = Session(qwen_adapter, policy_for(qwen_adapter, "fifo", budget_tokens=96), SessionConfig(chunk_frames=4))
    for i, frame in enumerate(world.world_frames(8)):
        session.add_frame(frame, stamp=float(i), camera="/cam")
    path = tmp_path_factory.mktemp("snap") / "memory.pt"
    session.save(str(path))
    for i, frame in enumerate(world.world_frames(4, start=8)):
        session.add_frame(frame, stamp=100.0 + i, camera="/cam")
    session.ask("what is on the table?", max_new_tokens=1)
    return session, path.read_bytes(), path.parent


def memory(session):
    return (session.policy.state_dict(), dict(session.ledger.units), list(session.history), list(session.ledger.cameras),
            session.ledger.next_unit, session.ledger.next_chunk)


def mutations(data: bytes):
    rng = random.Random(18)
    header_end = data.index(b"\n")
    yield "empty", b""
    yield "header only", data[:header_end + 1]
    yield "another format", data.replace(b" %d " % SNAPSHOT_FORMAT, b" 99 ", 1)
    yield "format 1 (no digest)", data[header_end + 1:]
    yield "no header", b"garbage\n" + data[header_end + 1:]
    for _ in range(MUTATIONS // 2):
        cut = rng.randrange(1, len(data))
        yield f"truncated at {cut}", data[:cut]
    for _ in range(MUTATIONS // 2):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(flipped))
            flipped[at] ^= 1 << rng.randrange(8)
        if bytes(flipped) != data:
            yield "flipped bytes", bytes(flipped)


def test_damaged_snapshots_are_refused_and_the_memory_stays(saved):
    session, data, folder = saved
    before = memory(session)
    path = folder / "damaged.pt"
    refused = 0
    for what, content in mutations(data):
        path.write_bytes(content)
        with pytest.raises(SnapshotError) as err:
            session.load(str(path))
        assert str(path) in str(err.value), what
        refused += 1
        assert states_equal(memory(session), before), what
    assert refused >= MUTATIONS
    path.write_bytes(data)  # the intact file still loads
    assert session.load(str(path)) == 8 and not states_equal(memory(session)[0], before[0])


def test_a_refused_snapshot_says_why(saved):
    session, data, folder = saved
    path = folder / "why.pt"
    for content, words in [(data[:-10], "damaged: truncated or altered"),
                           (data.replace(b" %d " % SNAPSHOT_FORMAT, b" 99 ", 1), f"of format 99; this node reads format {SNAPSHOT_FORMAT}"),
                           (data[data.index(b"\n") + 1:], "format 1, written before snapshots carried a digest"),
                           (b"hello", "is not a streamcache snapshot")]:
        path.write_bytes(content)
        with pytest.raises(SnapshotError, match=words):
            session.load(str(path))
