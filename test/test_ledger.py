"""The unit ledger on plain data: what each unit is, selection by camera and window, counts,
evidence ranking, the timeline and its part of a snapshot; no model, no cache."""
from __future__ import annotations

import math

import pytest
import torch

from streamcache_ros.engine.cache.base import UnitTokens
from streamcache_ros.engine.errors import QuestionError
from streamcache_ros.engine.memory.ledger import UnitLedger, Window

SUMMARY = -2


@pytest.fixture
def ledger():
    """Two cameras: /front units 0-3 (2 frames each, stamps 0..7), /rear units 4-5 (1 frame each),
    /front again units 6-7 (stamps 10..13); 4 tokens per unit."""
    book = UnitLedger(SUMMARY)
    for camera in ("/front", "/rear"):
        book.note_camera(camera)
    assert book.book_chunk("/front", [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0), (6.0, 7.0)], 4) == 0
    assert book.book_chunk("/rear", [(8.0,), (9.0,)], 4) == 1
    assert book.book_chunk("/front", [(10.0, 11.0), (12.0, 13.0)], 4) == 2
    return book


def test_units_are_numbered_in_arrival_order_per_chunk(ledger):
    assert (ledger.next_unit, ledger.next_chunk) == (8, 3)
    assert ledger.units[5].stamps == (9.0,) and ledger.units[5].camera == "/rear" and ledger.units[5].chunk == 1
    assert ledger.units_of("/front") == [0, 1, 2, 3, 6, 7]
    ledger.note_camera("/front")
    assert ledger.cameras == ["/front", "/rear"]


def test_forgetting_by_eviction_or_by_what_is_held(ledger):
    ledger.forget(evicted=[0, 1])
    assert sorted(ledger.units) == [2, 3, 4, 5, 6, 7]
    ledger.forget(held=[3, 4, 7, 99])
    assert sorted(ledger.units) == [3, 4, 7]


def test_a_camera_sees_its_units_and_the_summary_a_window_hides_it(ledger):
    everything = ledger.visible()
    assert everything.units == list(range(8)) and everything.key_filter is None
    front = ledger.visible("/front")
    assert front.units == [0, 1, 2, 3, 6, 7] and front.key_filter == [0, 1, 2, 3, 6, 7, SUMMARY]
    # a unit with one frame inside the window is in it (unit 1 holds stamps 2 and 3)
    windowed = ledger.visible("/front", Window(3.0, 10.0))
    assert windowed.units == [1, 2, 3, 6] and windowed.key_filter == [1, 2, 3, 6]
    assert ledger.stamps(windowed.units, Window(3.0, 10.0)) == [3.0, 4.0, 5.0, 6.0, 7.0, 10.0]


def test_refusals_name_what_is_missing(ledger):
    with pytest.raises(QuestionError, match="no frames from camera '/side' in memory"):
        ledger.visible("/side")
    with pytest.raises(QuestionError, match="between 20.000 and now .*stamped 0.000 to 13.000"):
        ledger.visible("", Window(20.0, math.inf))
    with pytest.raises(QuestionError, match="no frames in memory yet"):
        UnitLedger(SUMMARY).visible()


def test_counts_follow_what_the_cache_holds(ledger):
    # the cache holds units 0-7 with 4 tokens each in one layer, but unit 2 only 1 (a HERMES remnant)
    counts = torch.tensor([[4, 4, 1, 4, 4, 4, 4, 4]])
    held = UnitTokens(torch.arange(8), counts, rows_per_layer=1, summary=3)
    total = int(counts.sum()) + 3 + 10  # + summary + prefix
    whole = ledger.counts(held, total)
    assert whole.frames == 14 - 2 and whole.kv_tokens == total
    rear = ledger.counts(held, total, ledger.units_of("/rear"))
    assert (rear.frames, rear.oldest_stamp, rear.newest_stamp) == (2, 8.0, 9.0)
    assert rear.kv_tokens == total - 4 * 5 - 1  # the other units' tokens are not attended over
    window = Window(0.0, 3.0)
    inside = ledger.counts(held, total, ledger.visible("", window).units, window)
    assert inside.frames == 4 and inside.kv_tokens == total - (int(counts.sum()) - 8) - 3  # no summary either
    assert ledger.camera_counts(held, total)["/front"].frames == 10


def test_evidence_shares_a_units_mass_among_its_frames(ledger):
    mass = [0.0, 4.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0]
    frames, share = ledger.rank_evidence(mass, summary_mass=1.0, k=3)
    # unit 1's mass split over its frames 2 and 3 (2 each), then 1 each for 8, 12 and 13: ties go to the newer
    assert [(f.stamp, f.camera) for f in frames] == [(3.0, "/front"), (2.0, "/front"), (13.0, "/front")]
    assert share == pytest.approx(1.0 / 8.0)
    assert sum(f.weight for f in frames) == pytest.approx(5.0 / 7.0)
    windowed, _ = ledger.rank_evidence(mass, 0.0, [1, 7], Window(3.0, 12.0), k=5)
    assert [f.stamp for f in windowed] == [3.0, 12.0]  # inside the window only, each with its unit's whole mass


def test_timeline_reports_what_each_layer_keeps(ledger):
    layer_tokens = torch.tensor([[4, 4, 2, 4, 4, 4, 4, 0], [4, 0, 2, 4, 4, 4, 4, 0]])
    layer_rows = torch.tensor([1, 1])
    frames = ledger.timeline(layer_tokens, layer_rows, {}, {}, camera="/front")
    assert [f.stamp for f in frames] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 10.0, 11.0, 12.0, 13.0]
    unit1 = next(f for f in frames if f.stamp == 2.0)
    assert unit1.layer_kept == [1.0, 0.0] and unit1.kept == 0.5
    assert next(f for f in frames if f.stamp == 13.0).layer_kept == [0.0, 0.0]


def test_snapshot_state_round_trips_and_unreadable_state_is_refused(ledger):
    state = ledger.state_dict()
    copy = UnitLedger(SUMMARY)
    copy.load_state(UnitLedger.read_state(state))
    assert copy.units == ledger.units and copy.cameras == ledger.cameras
    assert (copy.next_unit, copy.next_chunk) == (8, 3)
    broken = dict(state, units={"0": {"stamps": [0.0], "camera": "/front"}})  # no chunk
    with pytest.raises(KeyError):
        UnitLedger.read_state(broken)
