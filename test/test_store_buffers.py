"""The KV store's reserved buffers (engine/cache/store.py, docs/performance.md#real-widths): appends
write into reserved room in place, eviction moves the kept tokens forward in place, a question is
dropped by shortening the views; so a chunk, an H2SVC unit or an answer's token never copies the
cache, and the results are those of the plain gather / concatenation, bit for bit."""
import pytest
import torch

from streamcache_ros.engine import Session, SessionConfig
from streamcache_ros.engine.cache import PAD_UNIT, PREFIX_UNIT, TEXT_UNIT, KVStore
from streamcache_ros.engine.cache.rope import RotarySpec
from streamcache_ros.engine.cache import store as store_module

from conftest import REAL_TOKEN_FAMILIES, policy_for


def filled_store(tokens: int, rows: int = 2, dim: int = 8, shared: bool = True, seed: int = 0) -> KVStore:
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, rows, tokens, dim, generator=gen)
    values = torch.randn(1, rows, tokens, dim, generator=gen)
    lead = () if shared else (rows,)
    positions = torch.arange(tokens, dtype=torch.float32).expand(*lead, 1, tokens).clone()
    units = torch.arange(tokens).expand(*lead, tokens).clone() // 7
    return KVStore(keys, values, positions, units, units.clone() // 3, torch.arange(rows), shared)


def snapshot(store: KVStore) -> list[torch.Tensor]:
    return [t.clone() for t in (store.keys, store.values, store.positions, store.units, store.chunks)]


BLOCK = 37  # tokens a store of 2 rows moves at a time when evicting in place, in these tests


@pytest.fixture
def small_blocks(monkeypatch):
    """store.MOVE_BYTES for BLOCK tokens of 2 rows x 8 float32 channels (3 rows: 24 tokens), so
    that the stores below are moved in several blocks, the last one short."""
    monkeypatch.setattr(store_module, "MOVE_BYTES", BLOCK * 2 * 8 * 4)


@pytest.mark.parametrize("tokens", [40, 3 * BLOCK + 17])
def test_keep_in_place_equals_the_gather(tokens, small_blocks):
    store = filled_store(tokens)
    gen = torch.Generator().manual_seed(1)
    index = torch.sort(torch.randperm(tokens, generator=gen)[:tokens // 3]).values
    index = torch.cat((torch.arange(5), index[index >= 5]))  # a prefix that stays where it is
    expected = [t.index_select(-2 if t.dim() == 4 else -1, index) for t in snapshot(store)]
    store.keep(index)
    for got, want in zip(snapshot(store), expected):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="ascending"):
        store.keep(torch.tensor([3, 1]))


def test_per_row_compaction_in_place_equals_the_gather_and_pads(small_blocks):
    tokens, rows = 2 * BLOCK + 9, 3
    store = filled_store(tokens, rows=rows, shared=False)
    gen = torch.Generator().manual_seed(2)
    keep = torch.rand(rows, tokens, generator=gen) < torch.tensor([[0.2], [0.5], [0.9]])
    before = snapshot(store)
    store.compact(keep)
    width = int(keep.sum(dim=1).max())
    assert len(store) == width and store.padded
    for row in range(rows):
        slots = torch.nonzero(keep[row]).flatten()
        n = slots.numel()
        assert torch.equal(store.keys[0, row, :n], before[0][0, row, slots])
        assert torch.equal(store.positions[row, :, :n], before[2][row, :, slots])
        assert torch.equal(store.units[row, :n], before[3][row, slots])
        assert bool((store.units[row, n:] == PAD_UNIT).all()) and not bool(store.keys[0, row, n:].any())


def clocked_store(tokens: int, rows: int = 2, shared: bool = True, seed: int = 0) -> KVStore:
    """filled_store with two axes of positions and every slot on a clock, so that every tensor a
    move writes is checked."""
    gen = torch.Generator().manual_seed(seed)
    lead = () if shared else (rows,)
    keys, values = torch.randn(1, rows, tokens, 8, generator=gen), torch.randn(1, rows, tokens, 8, generator=gen)
    positions = torch.randn(*lead, 2, tokens, generator=gen)
    units = torch.arange(tokens).expand(*lead, tokens).clone() // 7
    clocks = torch.randint(0, 3, (*lead, tokens), generator=gen)
    return KVStore(keys, values, positions, units, units.clone() // 3, torch.arange(rows), shared, clocks)


def everything(store: KVStore) -> list[torch.Tensor]:
    return [t.clone() for t in (store.keys, store.values, store.positions, store.units, store.chunks, store.clocks)]


def slots(*runs: tuple[int, int]) -> torch.Tensor:
    return torch.cat([torch.arange(start, end) for start, end in runs])


PREFIX = 5
TAIL = 3 * BLOCK + 17  # the tail FIFO keeps: several blocks, the last one short
RUNS = {  # the slots keep() is given; BLOCK: the tokens a block moves (small_blocks)
    "tail, shift < block": slots((0, PREFIX), (PREFIX + 10, PREFIX + 10 + TAIL)),
    "tail, shift = block": slots((0, PREFIX), (PREFIX + BLOCK, PREFIX + BLOCK + TAIL)),
    "tail, shift > block": slots((0, PREFIX), (PREFIX + 50, PREFIX + 50 + TAIL)),
    "tail, no prefix": slots((23, 23 + TAIL)),
    "several runs": slots((0, PREFIX), (9, 30), (31, 33), (40, 120), (121, 123), (160, 230)),
    "non-contiguous": torch.arange(3, 240, 3),
}


@pytest.fixture
def short_runs(monkeypatch):
    """store.MIN_RUN small enough for the small stores here to move by slices."""
    monkeypatch.setattr(store_module, "MIN_RUN", 4)


@pytest.mark.parametrize("case", list(RUNS))
@pytest.mark.parametrize("shared", [True, False])
def test_keep_by_runs_equals_index_select(case, shared, small_blocks, short_runs, monkeypatch):
    """keep() moves runs of consecutive slots by slice copies, in pieces no longer than the run's
    shift (so no copy_ overlaps itself), the rest by index_select: the result is the reference
    index_select's, bit for bit, for every tensor; a FIFO tail takes no index_select at all."""
    index = RUNS[case]
    store = clocked_store(int(index[-1]) + 1 + 11, shared=shared)
    expected = [t.index_select(2 if t.dim() == 4 else t.dim() - 1, index) for t in everything(store)]
    selects = []
    original = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select", lambda t, *a: selects.append(a) or original(t, *a))
    store.keep(index)
    assert len(store) == index.numel()
    for got, want in zip(everything(store), expected):
        assert torch.equal(got, want)
    assert (not selects) == case.startswith("tail"), "a tail moves by slices, scattered slots by index_select"


def test_keep_by_runs_at_the_default_sizes():
    """With the real MOVE_BYTES and MIN_RUN: a chunk's worth of slots dropped after the prefix."""
    index = slots((0, 13), (13 + 300, 13 + 300 + 1000))
    store = clocked_store(1400, rows=4)
    expected = [t.index_select(2 if t.dim() == 4 else t.dim() - 1, index) for t in everything(store)]
    store.keep(index)
    assert all(torch.equal(got, want) for got, want in zip(everything(store), expected))


def test_per_row_compaction_by_runs_equals_the_gather(small_blocks, short_runs):
    """H2SVC's compact(): each row drops whole units of its own (runs moving by different shifts,
    some too short for slices), and shorter rows are padded."""
    tokens, rows = 3 * BLOCK + 40, 3
    store = clocked_store(tokens, rows=rows, shared=False, seed=3)
    units = store.units.clone()
    keep = torch.stack([units[0] >= 2,  # a window: the oldest units gone
                        (units[1] % 4 != 1) & (units[1] != 9),  # units dropped here and there
                        torch.rand(tokens, generator=torch.Generator().manual_seed(4)) < 0.6])  # scattered
    before = everything(store)
    store.compact(keep)
    width = int(keep.sum(dim=1).max())
    assert len(store) == width and store.padded
    for row in range(rows):
        kept = torch.nonzero(keep[row]).flatten()
        n = kept.numel()
        got = everything(store)
        assert torch.equal(got[0][0, row, :n], before[0][0, row, kept])
        assert torch.equal(got[1][0, row, :n], before[1][0, row, kept])
        for tensor, old in zip(got[2:], before[2:]):
            assert torch.equal(tensor[row][..., :n], old[row][..., kept])
        assert bool((got[3][row, n:] == PAD_UNIT).all()) and not bool(got[0][0, row, n:].any())


def fresh_offsets(store: KVStore, clock) -> torch.Tensor:
    """next_offsets of a new store of the same tokens: worked out, not kept."""
    again = KVStore(store.keys, store.values, store.positions, store.units, store.chunks, store.heads, store.shared,
                    store.clocks)
    return again.next_offsets(clock)


@pytest.mark.parametrize("shared", [True, False])
def test_next_offsets_kept_between_calls_equal_the_ones_worked_out(shared):
    """KVStore keeps next_offsets from call to call (H2SVC asks before every unit's forward); after
    appends on one clock and another, a truncate, an eviction, a compaction and a re-index they are
    still what the tokens held say."""
    rows, dim = 2, 8
    lead = () if shared else (rows,)
    ids = torch.empty(*lead, 0, dtype=torch.long)
    store = KVStore(torch.empty(1, rows, 0, dim), torch.empty(1, rows, 0, dim), torch.empty(*lead, 1, 0), ids, ids,
                    torch.arange(rows), shared)
    store.reserve(200)  # room for every append: none copies the store (which would forget the offsets)
    gen = torch.Generator().manual_seed(5)

    def append(count: int, clock, start: float, unit: int):
        positions = (torch.arange(count, dtype=torch.float32) + start).expand(*lead, 1, count).clone()
        if not shared:  # the rows apart, as after a re-index of one head
            positions[1] += 3
        store.append(torch.randn(1, rows, count, dim, generator=gen), torch.randn(1, rows, count, dim, generator=gen),
                     positions, torch.full((count,), unit), torch.full((count,), 0), clock)

    def check():
        for clock in (None, 0, 1):
            assert torch.equal(store.next_offsets(clock), fresh_offsets(store, clock)), clock

    append(3, None, 0, PREFIX_UNIT)
    check()
    for step in range(6):  # two cameras taking turns, each on its own clock (camera 1's further on)
        clock = step % 2
        append(4 + 3 * clock, clock, float(store.next_offsets(clock).max()), step)
        check()
    mark = len(store)
    append(5, None, float(store.next_offsets(None).max()), TEXT_UNIT)  # a question on no clock
    check()
    store.truncate(mark)
    check()
    store.keep(torch.cat((torch.arange(3), torch.arange(11, len(store)))))
    check()
    if not shared:
        keep = torch.ones(rows, len(store), dtype=torch.bool)
        keep[0, 3:7] = False
        store.compact(keep)
        check()
    store.reindex(RotarySpec(torch.ones(dim // 2), None), lambda old, units, chunks: old - 1.0)
    check()


def test_appends_copy_only_when_the_room_runs_out_and_a_truncate_frees_nothing():
    store = filled_store(0)
    reference = filled_store(0)
    copies = KVStore.copies
    for step in range(40):
        piece = filled_store(8, seed=step)
        store.append(piece.keys, piece.values, piece.positions, piece.units, piece.chunks)
        reference = KVStore(torch.cat((reference.keys, piece.keys), 2), torch.cat((reference.values, piece.values), 2),
                            torch.cat((reference.positions, piece.positions), -1),
                            torch.cat((reference.units, piece.units)), torch.cat((reference.chunks, piece.chunks)),
                            reference.heads, True)
    assert all(torch.equal(a, b) for a, b in zip(snapshot(store), snapshot(reference)))
    # the room grows by an eighth each time it runs out: far fewer copies than appends
    grown = KVStore.copies - copies
    assert 1 <= grown <= 30 and store.capacity >= len(store) == 320
    saved = store.state()
    length, capacity = len(store), store.capacity
    piece = filled_store(capacity - length, seed=99)
    store.append(piece.keys, piece.values, piece.positions, piece.units, piece.chunks)  # fills the room
    store.truncate(length)  # a question's tokens dropped: nothing copied, the room kept
    assert KVStore.copies == copies + grown and store.capacity == capacity
    assert all(torch.equal(a, b) for a, b in zip(snapshot(store), [saved[k] for k in
                                                                   ("keys", "values", "positions", "units", "chunks")]))


def test_buffers_are_written_in_and_outside_inference_mode():
    """Appends run under inference mode, compression and re-index may run outside it (the H2SVC
    re-index once crashed on inference tensors): the buffers are normal tensors, so both may write them."""
    store = filled_store(10)
    with torch.inference_mode():
        piece = filled_store(6, seed=3)
        store.append(piece.keys, piece.values, piece.positions, piece.units, piece.chunks)
    store.keep(torch.arange(2, 16))  # outside inference mode, in place
    piece = filled_store(4, seed=4)
    store.append(piece.keys, piece.values, piece.positions, piece.units, piece.chunks)
    assert len(store) == 18 and not store.keys.is_inference()


@pytest.mark.parametrize("name", ["h2svc", "fifo", "hermes"])
@pytest.mark.parametrize("family", REAL_TOKEN_FAMILIES)
def test_a_steady_chunk_and_a_question_copy_no_store(real_token_adapters, camera_frames, family, name):
    """Once the buffers have grown to what a chunk needs, a chunk (H2SVC: unit after unit) and a
    question with its answer append in place: no store is copied."""
    adapter = real_token_adapters[family]
    settings = {"h2svc": {"w_s": 1, "w_w": 2, "n_e": 3}}.get(name, {"budget_tokens": 4 * 196 if family ==
                                                                 "llava_onevision" else 2 * 391})
    session = Session(adapter, policy_for(adapter, name, **settings),
                      SessionConfig(chunk_frames=4, max_question_tokens=64, max_new_tokens=8))
    frames = camera_frames(32)
    for i, frame in enumerate(frames[:24]):  # past every window and budget: the buffers have grown
        session.add_frame(frame, stamp=float(i))
    session.ask("what happened?", max_new_tokens=4)
    copies = KVStore.copies
    for i, frame in enumerate(frames[24:], start=24):
        session.add_frame(frame, stamp=float(i))
    answer = session.ask("what happened?", max_new_tokens=4)
    assert answer.answer_tokens >= 1
    assert KVStore.copies == copies, f"{KVStore.copies - copies} store copies in two steady chunks and a question"
