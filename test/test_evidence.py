"""Time windows, evidence and the memory timeline in the engine (docs/interfaces.md "Time windows and evidence").

First on hand-made tensors: ``KVStore.visible`` (what a window hides), ``KVStore.attention_mass``
(the weights SDPA does not return) and ``AttentionMass`` (summed per unit). Then through the
``Session`` on both tiny models and every policy: evidence stamps lie among the frames in memory and
inside the window, a window changes the answer's logits, refusals leave the memory as it was, and
all of it holds after re-indexes and after a snapshot is restored. Random weights: only what is
deterministic is asserted, never what the answer says.
"""
import math

import pytest
import torch

from streamcache_ros.engine import QuestionError, Session, SessionConfig
from streamcache_ros.engine.cache import PAD_UNIT, PREFIX_UNIT, SUMMARY_UNIT, TEXT_UNIT, KVStore
from streamcache_ros.engine.cache.evidence import OFFSET, AttentionMass
from streamcache_ros.engine.errors import ConfigError

from conftest import policy_for, states_equal

SETTINGS = {"full": {}, "fifo": {"budget_tokens": 48}, "uniform": {"budget_tokens": 48},
            "hermes": {"budget_tokens": 48}, "h2svc": {"w_s": 1, "w_w": 2, "n_e": 4}}
QUESTION = "When did you last see the red circle?"


def store_of(keys, units, shared=True):
    """A store of hand-made keys [rows, T, D] and units ([T] shared, or [rows, T])."""
    rows, length, dim = keys.shape
    heads = list(range(rows))
    axes_shape = (1, length) if shared else (rows, 1, length)
    chunks = torch.zeros_like(units)
    return KVStore(keys[None], keys[None].clone(), torch.zeros(axes_shape), units, chunks,
                   torch.tensor(heads), shared)


# -- hand-made tensors -------------------------------------------------------------------------------
def test_visible_keeps_prefix_and_text_and_the_summary_only_when_listed():
    units = torch.tensor([PREFIX_UNIT, 0, 1, SUMMARY_UNIT, 2, TEXT_UNIT, PAD_UNIT])
    store = store_of(torch.zeros(1, 7, 2), units)
    assert store.visible(torch.tensor([1])).tolist() == [True, False, True, False, False, True, False]
    listed = store.visible(torch.tensor([1, SUMMARY_UNIT]))
    assert listed.tolist() == [True, False, True, True, False, True, False]


def test_attention_mass_is_the_softmax_of_q_k_summed_over_a_rows_query_heads():
    torch.manual_seed(0)
    rows, group, length, dim = 2, 3, 6, 4
    keys = torch.randn(rows, length, dim)
    store = store_of(keys, torch.arange(length))
    q = torch.randn(1, rows * group, 2, dim)  # two query rows: only the newest is read
    visible = torch.tensor([True, True, False, True, False, True])
    got = store.attention_mass(q, visible)
    for row in range(rows):
        expected = torch.zeros(length)
        for h in range(group):
            logits = keys[row] @ q[0, row * group + h, -1] / math.sqrt(dim)
            expected += torch.softmax(logits.masked_fill(~visible, -math.inf), dim=0)
        torch.testing.assert_close(got[row], expected)
    assert torch.all(got[:, ~visible] == 0)
    torch.testing.assert_close(got.sum(dim=1), torch.full((rows,), float(group)))


def test_attention_mass_per_row_masks_each_head_on_its_own():
    torch.manual_seed(1)
    keys = torch.randn(2, 4, 4)
    units = torch.tensor([[0, 1, 2, 3], [0, 2, PAD_UNIT, PAD_UNIT]])
    store = store_of(keys, units, shared=False)
    visible = units != PAD_UNIT
    got = store.attention_mass(torch.randn(1, 2, 1, 4), visible)
    assert torch.all(got[1, 2:] == 0) and torch.allclose(got.sum(dim=1), torch.ones(2))


def test_attention_mass_sums_per_unit_and_only_for_the_chosen_layers():
    units = torch.tensor([[PREFIX_UNIT, 0, 0, 2, SUMMARY_UNIT], [PREFIX_UNIT, 2, PAD_UNIT, PAD_UNIT, PAD_UNIT]])
    store = store_of(torch.zeros(2, 5, 2), units, shared=False)  # equal logits: the mass spreads evenly
    visible = units != PAD_UNIT
    mass = AttentionMass(layers=[1], num_layers=3, units=3)
    mass.observe(0, store, torch.zeros(1, 2, 1, 2), visible)  # not a chosen layer: ignored
    mass.observe(1, store, torch.zeros(1, 2, 1, 2), visible)
    assert mass.mass[0].sum() == 0 and mass.mass[2].sum() == 0
    assert mass.of(0) == pytest.approx(2 / 5)
    assert mass.of(2) == pytest.approx(1 / 5 + 1 / 2)
    assert mass.of(PREFIX_UNIT) == pytest.approx(1 / 5 + 1 / 2)
    assert mass.of(SUMMARY_UNIT) == pytest.approx(1 / 5)
    assert mass.of(1) == 0 and mass.of(PAD_UNIT) == 0
    assert mass.totals().shape == (3 + OFFSET,)


# -- through the session -----------------------------------------------------------------------------
def session_of(adapter, name, **config):
    settings = dict(SETTINGS[name])
    reindex = config.pop("reindex", None)
    if reindex:
        settings["reindex"] = reindex
    return Session(adapter, policy_for(adapter, name, **settings),
                   SessionConfig(chunk_frames=4, max_new_tokens=3, **config))


def feed(session, frames, first_stamp=0.0, camera=""):
    for i, frame in enumerate(frames):
        session.add_frame(frame, stamp=first_stamp + i, camera=camera)


def memory_stamps(session, camera=None):
    return {s for info in session.ledger.units.values() if camera is None or info.camera == camera for s in info.stamps}


def counted_stamps(session):
    """Stamps of the frames frames_in_memory counts (docs/interfaces.md "What the numbers mean"): some
    layer (H2SVC: some KV head) still holds at least half the unit's tokens. HERMES keeps a token or
    two of other frames, which evidence may still name: they are in ``memory_stamps``."""
    held = session.policy.unit_tokens()
    most = dict(zip(held.units.tolist(), held.counts.max(dim=0).values.tolist()))
    return {s for u, info in session.ledger.units.items() if 2 * most.get(u, 0) >= info.tokens for s in info.stamps}


def check_evidence(answer, session, k, window=None, camera=None):
    stamps = [e.stamp for e in answer.evidence]
    assert 1 <= len(stamps) <= k and len(set(stamps)) == len(stamps)
    assert set(stamps) <= memory_stamps(session, camera)
    if window is not None:
        assert all(window[0] <= s <= window[1] for s in stamps), (stamps, window)
    weights = [e.weight for e in answer.evidence]
    assert weights == sorted(weights, reverse=True) and all(0 < w <= 1 for w in weights)
    assert sum(weights) <= 1 + 1e-5
    assert 0 <= answer.evidence_summary_share <= 1


@pytest.mark.parametrize("name", list(SETTINGS))
def test_evidence_lies_in_memory_and_inside_the_window(adapter, frames, name):
    session = session_of(adapter, name, evidence_k=4)
    feed(session, frames(24))
    answer = session.ask(QUESTION)
    check_evidence(answer, session, 4)
    held = sorted(memory_stamps(session))
    window = (held[len(held) // 2] - 0.5, held[-1] - 2.5)  # the middle of what is held, open at no end
    inside = session.ask(QUESTION, since=window[0], until=window[1])
    check_evidence(inside, session, 4, window)
    assert inside.frames_in_memory == sum(window[0] <= s <= window[1] for s in counted_stamps(session))
    assert inside.evidence_summary_share == 0  # a window hides the summary tokens
    # open ends: only since, only until
    check_evidence(session.ask(QUESTION, since=window[0]), session, 4, (window[0], math.inf))
    check_evidence(session.ask(QUESTION, until=window[1]), session, 4, (-math.inf, window[1]))


def test_a_unit_is_inside_when_any_of_its_frames_is_and_evidence_names_only_the_frames_inside(qwen_adapter, frames):
    session = session_of(qwen_adapter, "full", evidence_k=3)
    feed(session, frames(8))  # Qwen2.5-VL: units of 2 frames, stamps (0, 1), (2, 3), ...
    answer = session.ask(QUESTION, since=3.0, until=4.0)  # half of unit (2, 3), half of unit (4, 5)
    assert answer.frames_in_memory == 2 and (answer.oldest_stamp, answer.newest_stamp) == (3.0, 4.0)
    assert {e.stamp for e in answer.evidence} == {3.0, 4.0}


def test_the_window_changes_the_answers_logits_and_masked_units_get_no_mass(adapter, frames, monkeypatch):
    session = session_of(adapter, "full", evidence_layers=tuple(range(adapter.geometry().num_layers)))
    feed(session, frames(16))
    seen_logits = []
    logits = adapter.logits
    monkeypatch.setattr(adapter, "logits", lambda hidden: seen_logits.append(logits(hidden)) or seen_logits[-1])
    probes = []
    make = AttentionMass.__init__

    def keep(self, *args, **kwargs):
        make(self, *args, **kwargs)
        probes.append(self)

    monkeypatch.setattr(AttentionMass, "__init__", keep)
    whole = session.ask(QUESTION, max_new_tokens=1)
    first = seen_logits[-1]
    late = session.ask(QUESTION, max_new_tokens=1, since=10.0)
    assert not torch.allclose(first, seen_logits[-1])  # the window excludes frames 0..9: another answer
    assert all(e.stamp >= 10.0 for e in late.evidence)
    early_units = [u for u, info in session.ledger.units.items() if max(info.stamps) < 10.0]
    assert early_units and all(probes[-1].of(u) == 0 for u in early_units)
    assert any(probes[0].of(u) > 0 for u in early_units)
    # every query head's weights sum to one: one forward (the question) over every measured layer
    geometry = adapter.geometry()
    torch.testing.assert_close(probes[0].mass.sum(), torch.tensor(float(geometry.num_layers * geometry.num_q_heads)))
    assert whole.evidence and late.evidence


@pytest.mark.parametrize("name", ["fifo", "hermes", "h2svc"])
def test_refused_windows_leave_the_memory_as_it_was(adapter, frames, name):
    session = session_of(adapter, name)
    feed(session, frames(20))
    before = session.policy.state_dict()
    held = sorted(memory_stamps(session))
    for since, until, words in [(5.0, 4.0, "the window is empty"), (held[-1] + 1, None, "no frames in memory between"),
                                (None, held[0] - 0.5, "no frames in memory between"), (float("nan"), None, "numbers")]:
        with pytest.raises(QuestionError, match=words):
            session.ask(QUESTION, since=since, until=until)
    with pytest.raises(QuestionError, match="evidence_k"):
        session.ask(QUESTION, evidence_k=-1)
    assert states_equal(before, session.policy.state_dict())
    assert session.questions_answered == 0


def test_window_and_camera_combine(qwen_adapter, frames):
    session = session_of(qwen_adapter, "full", evidence_k=5)
    feed(session, frames(8), 0.0, camera="/a")
    feed(session, frames(8, start=8), 100.0, camera="/b")
    answer = session.ask(QUESTION, camera="/b", since=102.0, until=105.0)
    check_evidence(answer, session, 5, (102.0, 105.0), camera="/b")
    assert all(e.camera == "/b" for e in answer.evidence)
    both = session.ask(QUESTION, evidence_k=16)
    assert {e.camera for e in both.evidence} == {"/a", "/b"}
    with pytest.raises(QuestionError, match="from camera '/a' in memory between"):
        session.ask(QUESTION, camera="/a", since=102.0, until=105.0)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_window_and_evidence_after_reindexes(adapter, frames, name):
    session = session_of(adapter, name, reindex="eager")
    feed(session, frames(24))
    assert session.status().cache.reindex_events > 0
    held = sorted(memory_stamps(session))
    window = (held[0], held[len(held) // 2])
    check_evidence(session.ask(QUESTION, since=window[0], until=window[1]), session, 3, window)
    check_evidence(session.ask(QUESTION), session, 3)


@pytest.mark.parametrize("name", ["fifo", "hermes", "h2svc"])
def test_window_and_evidence_after_a_snapshot_is_restored(adapter, frames, tmp_path, name):
    session = session_of(adapter, name)
    feed(session, frames(20))
    session.save(str(tmp_path / "memory.pt"))
    restored = session_of(adapter, name)
    restored.load(str(tmp_path / "memory.pt"))
    held = sorted(memory_stamps(session))
    window = (held[1], held[-2])
    for kwargs in ({}, {"since": window[0], "until": window[1]}):
        mine, theirs = session.ask(QUESTION, **kwargs), restored.ask(QUESTION, **kwargs)
        assert (mine.text, mine.evidence) == (theirs.text, theirs.evidence)
        check_evidence(theirs, restored, 3, window if kwargs else None)
    assert restored.memory_timeline() == session.memory_timeline()


def test_no_evidence_when_k_is_zero_and_layers_are_checked(adapter, frames):
    session = session_of(adapter, "full", evidence_k=0)
    feed(session, frames(4))
    answer = session.ask(QUESTION)
    assert answer.evidence == [] and answer.evidence_summary_share == 0
    assert len(session.ask(QUESTION, evidence_k=2).evidence) == 2
    layers = adapter.geometry().num_layers
    with pytest.raises(ConfigError, match="evidence_layers"):
        session_of(adapter, "full", evidence_layers=(0, layers))
    with pytest.raises(ConfigError, match="evidence_k"):
        SessionConfig(evidence_k=-1)


def test_hermes_reports_the_summary_tokens_share(adapter, frames):
    layers = adapter.geometry().num_layers
    session = session_of(adapter, "hermes", evidence_layers=tuple(range(layers)))
    feed(session, frames(24))
    assert any(session.policy.stats().extra["summary_tokens"])
    answer = session.ask(QUESTION)
    assert 0 < answer.evidence_summary_share < 1


# -- the memory timeline -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SETTINGS))
def test_memory_timeline_lists_every_frame_in_memory_with_its_kept_share(adapter, frames, name):
    session = session_of(adapter, name)
    feed(session, frames(24))
    timeline = session.memory_timeline()
    assert timeline.policy == name and timeline.num_layers == adapter.geometry().num_layers
    stamps = [f.stamp for f in timeline.frames]
    assert stamps == sorted(stamps) and set(stamps) == memory_stamps(session)
    for frame in timeline.frames:
        assert len(frame.layer_kept) == timeline.num_layers
        assert all(0 <= share <= 1 for share in frame.layer_kept + frame.bank_kept) and frame.kept > 0
    if name == "full":
        assert all(share == 1 for f in timeline.frames for share in f.layer_kept)
    else:  # bounded: something is gone (hermes keeps tokens of every frame in some layer)
        assert len(stamps) < 24 or min(f.kept for f in timeline.frames) < 1
    if name == "h2svc":
        assert timeline.bank_names == ["instantaneous", "short_term", "episodic"][:len(timeline.bank_names)]
        assert all(len(f.bank_kept) == len(timeline.bank_names) for f in timeline.frames)
        # the newest unit is in every bank's window
        assert all(share == 1 for share in timeline.frames[-1].bank_kept)
    else:
        assert timeline.bank_names == [] and all(f.bank_kept == [] for f in timeline.frames)


def test_memory_timeline_per_camera(qwen_adapter, frames):
    session = session_of(qwen_adapter, "full")
    feed(session, frames(4), 0.0, camera="/a")
    feed(session, frames(4), 10.0, camera="/b")
    assert [f.stamp for f in session.memory_timeline("/b").frames] == [10.0, 11.0, 12.0, 13.0]
    assert {f.camera for f in session.memory_timeline().frames} == {"/a", "/b"}
    with pytest.raises(QuestionError, match="unknown camera"):
        session.memory_timeline("/c")
