"""STCE (docs/h2svc.md §3.4) on hand-computed trajectories: the score, edge cases, O(1) maintenance."""
import math

import pytest
import torch

from streamcache_ros.engine.cache.stce import TrajectoryBank, stce_score

D = 8
JITTER = 0.01  # TC3's ε: the size of the jitter (docs/h2svc.md, TC3), not the norm guard


def e(i: int) -> torch.Tensor:
    out = torch.zeros(D, dtype=torch.float64)
    out[i - 1] = 1.0
    return out


def tc3_vectors() -> dict[int, torch.Tensor]:
    """TC3: zig-zag to 19, straight along e3 to 40, a slow turn onto e5 after; jitter ±ε·e4 except 27-29."""
    x = {0: torch.zeros(D, dtype=torch.float64)}
    for t in range(1, 66):
        step = (e(1) if t % 2 else e(2)) if t <= 19 else e(3) if t <= 40 else 0.3 * e(5)
        x[t] = x[t - 1] + step
    return {t: x[t] if t in (27, 28, 29) else x[t] + JITTER * (-1) ** t * e(4) for t in range(1, 66)}


def fill(bank: TrajectoryBank, vectors: dict[int, torch.Tensor], frames) -> list[torch.Tensor]:
    return [bank.insert(t, vectors[t].float()[None].expand(bank.heads, -1)) for t in frames]


def score_by_hand(vp, v, vn, tp, tn) -> float:
    """The seed's formula in float64 with the plain cosine."""
    v_in, v_out = v - vp, vn - v
    cos = float(v_in @ v_out / (v_in.norm() * v_out.norm()))
    return (1 - cos) * min(float(v_in.norm()), float(v_out.norm())) * math.log(tn - tp)


def test_score_of_a_right_angle_turn():
    # v_in = (1,0), v_out = (0,2): cos 0, mag 1, gap 2 -> I = ln 2
    v = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]])
    score = stce_score(v[0], v[1], v[2], torch.tensor(3), torch.tensor(5))
    assert score.item() == pytest.approx(math.log(2), rel=1e-6)


def test_score_of_a_reversal_is_twice_the_magnitude_times_the_weight():
    # straight back: curv 2, mag min(3, 1) = 1, gap 4 -> 2·ln 4
    v = torch.tensor([[0.0, 0.0], [3.0, 0.0], [2.0, 0.0]])
    assert stce_score(v[0], v[1], v[2], torch.tensor(1), torch.tensor(5)).item() == pytest.approx(2 * math.log(4))


def test_score_of_collinear_constant_speed_is_exactly_zero():
    v = torch.tensor([[0.0, 5.0, 0.0], [1.0, 5.0, 0.0], [2.0, 5.0, 0.0]])
    assert stce_score(v[0], v[1], v[2], torch.tensor(0), torch.tensor(2)).item() == 0.0


@pytest.mark.parametrize("v", [
    torch.ones(3, 4),                                              # static: both velocities zero
    torch.tensor([[1.0, 1.0], [1.0, 1.0], [4.0, 0.0]]),            # duplicated frame then a move
    torch.tensor([[1e6, 0.0], [1e6 + 1e-3, 0.0], [1e6, 1.0]]),     # below the relative norm guard
])
def test_near_zero_velocity_scores_zero_without_nan(v):
    score = stce_score(v[0], v[1], v[2], torch.tensor(1), torch.tensor(3))
    assert torch.isfinite(score) and score.item() == 0.0


def test_tc3_frame_28_is_evicted_and_only_its_neighbours_are_rescored():
    vectors = tc3_vectors()
    bank = TrajectoryBank(heads=1, capacity=64)
    evicted = fill(bank, vectors, range(1, 65))
    assert all(int(x) == -1 for x in evicted) and bank.frames(0) == list(range(1, 65))
    before = bank.score.clone()

    # the scores the bank holds before frame 65 match the hand formula (float64)
    for t in (26, 27, 29, 30, 40):
        expected = score_by_hand(vectors[t - 1], vectors[t], vectors[t + 1], t - 1, t + 1)
        assert bank.score_of(0, t) == pytest.approx(expected, rel=1e-4), t
    # the seed's numbers
    weight = (1 - 1 / math.sqrt(1 + JITTER ** 2)) * math.log(2)
    assert weight == pytest.approx(3.4655e-05, rel=1e-4)
    assert bank.score_of(0, 27) == pytest.approx(weight, rel=1e-4)
    assert bank.score_of(0, 29) == pytest.approx(weight, rel=1e-4)
    assert bank.score_of(0, 26) == pytest.approx(3.118e-4, rel=1e-3)
    assert bank.score_of(0, 30) == pytest.approx(3.118e-4, rel=1e-3)
    assert bank.score_of(0, 40) == pytest.approx(0.2087, rel=1e-3)
    assert bank.score_of(0, 28) == 0.0
    ranked = sorted(range(2, 64), key=lambda t: bank.score_of(0, t))
    assert ranked[0] == 28 and set(ranked[1:3]) == {27, 29} and set(ranked[3:5]) == {26, 30}

    (gone,) = bank.insert(65, vectors[65].float()[None]).tolist()
    assert gone == 28
    assert bank.frames(0) == list(range(1, 28)) + list(range(29, 66))
    after_weight = (1 - 1 / math.sqrt(1 + JITTER ** 2)) * math.sqrt(1 + JITTER ** 2) * math.log(3)
    assert after_weight == pytest.approx(5.4929e-05, rel=1e-4)
    assert bank.score_of(0, 27) == pytest.approx(after_weight, rel=1e-4)
    assert bank.score_of(0, 29) == pytest.approx(after_weight, rel=1e-4)
    # τ = 64 was scored on insertion; every other stored score is bitwise what it was
    changed = {int(bank.t[0, s]) for s in range(65) if not torch.equal(bank.score[0, s], before[0, s])}
    assert changed == {27, 29, 64, -1}  # -1: the slot 28 freed (65 went into the spare slot, +inf)
    assert bank.score_of(0, 65) == math.inf and bank.score_of(0, 1) == math.inf
    assert bank.last_evaluations.tolist() == [3]


def test_tc5_static_scene_evicts_the_oldest_interior_frame():
    bank = TrajectoryBank(heads=1, capacity=64)
    same = {t: torch.full((D,), 0.5, dtype=torch.float64) for t in range(1, 66)}
    fill(bank, same, range(1, 65))
    interior = [bank.score_of(0, t) for t in range(2, 64)]
    assert all(s == 0.0 for s in interior)
    (gone,) = bank.insert(65, same[65].float()[None]).tolist()
    assert gone == 2
    # the rule wins over TC7's count: prev(2) is the protected oldest frame, so only τ and next(2)
    assert bank.last_evaluations.tolist() == [2]


def test_tc6_the_smaller_temporal_gap_goes_first():
    # two frames with the same turn (90°) and magnitude (1): frame 3, whose neighbours are 3 apart
    # after frame 2 left, and frame 4, whose neighbours are 2 apart
    bank = TrajectoryBank(heads=1, capacity=4)
    pts = {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [2.0, 0.0], 4: [2.0, 1.0], 5: [3.0, 1.0]}
    vec = {t: torch.tensor(p + [0.0] * (D - 2), dtype=torch.float64) for t, p in pts.items()}
    fill(bank, vec, [1, 2, 3, 4])
    (gone,) = bank.insert(5, vec[5].float()[None]).tolist()
    assert gone == 2  # collinear, I = 0: now 3 has neighbours (1, 4): gap 3
    # frames 3 and 4 have the same turn (90°) and magnitude 1; gaps: 3 -> (1, 4) = 3, 4 -> (3, 5) = 2
    assert bank.score_of(0, 3) == pytest.approx(math.log(3), rel=1e-6)
    assert bank.score_of(0, 4) == pytest.approx(math.log(2), rel=1e-6)
    vec[6] = torch.tensor([2.0, 1.0] + [0.0] * (D - 2), dtype=torch.float64)  # a reversal at 5: 2·ln 2
    (gone,) = bank.insert(6, vec[6].float()[None]).tolist()
    assert gone == 4  # ln 2 < ln 3


def test_tc7_score_evaluations_per_arrival():
    vectors = tc3_vectors()
    bank = TrajectoryBank(heads=1, capacity=64)
    counts = []
    for t in range(1, 66):
        bank.insert(t, vectors[t].float()[None])
        counts.append(int(bank.last_evaluations[0]))
    # frames 1 and 2: the old tail is the oldest frame (an endpoint): nothing to score; then one (τ)
    assert counts[:2] == [0, 0] and set(counts[2:64]) == {1}
    assert counts[64] == 3  # τ, prev(28) and next(28)


def test_ties_break_by_the_smallest_frame_index():
    bank = TrajectoryBank(heads=1, capacity=3)
    line = {t: torch.tensor([float(t)] + [0.0] * (D - 1), dtype=torch.float64) for t in range(1, 5)}
    fill(bank, line, [1, 2, 3])
    (gone,) = bank.insert(4, line[4].float()[None]).tolist()
    assert gone == 2  # 2 and 3 both score 0


def test_heads_evict_independently():
    vectors = tc3_vectors()
    static = {t: torch.zeros(D, dtype=torch.float64) for t in range(1, 66)}
    bank = TrajectoryBank(heads=2, capacity=64)
    for t in range(1, 66):
        bank.insert(t, torch.stack([vectors[t], static[t]]).float())
    assert 28 not in bank.frames(0) and 2 in bank.frames(0)
    assert 2 not in bank.frames(1) and 28 in bank.frames(1)
    # the next arrival reuses each head's own freed slot
    bank.insert(66, torch.zeros(2, D))
    assert len(bank.frames(0)) == len(bank.frames(1)) == 64


def test_endpoints_are_never_evicted_over_a_long_stream():
    torch.manual_seed(0)
    bank = TrajectoryBank(heads=3, capacity=5)
    for t in range(1, 200):
        evicted = bank.insert(t, torch.randn(3, D))
        assert 1 not in evicted.tolist() and t not in evicted.tolist()
        for h in range(3):
            frames = bank.frames(h)
            assert frames[0] == 1 and frames[-1] == t and frames == sorted(frames) and len(frames) == min(t, 5)


def test_snapshot_restores_the_bank_after_arrivals():
    torch.manual_seed(1)
    bank = TrajectoryBank(heads=2, capacity=4)
    for t in range(1, 7):
        bank.insert(t, torch.randn(2, D))
    snap = bank.snapshot()
    frames = [bank.frames(0), bank.frames(1)]
    scores = bank.score.clone()
    for t in range(7, 10):
        bank.insert(t, torch.randn(2, D))
    bank.restore(snap)
    assert [bank.frames(0), bank.frames(1)] == frames and torch.equal(bank.score, scores)
    bank.insert(7, torch.randn(2, D))  # and it goes on from there
    assert bank.frames(0)[-1] == 7


def test_frames_out_of_order_are_refused():
    bank = TrajectoryBank(heads=1, capacity=4)
    bank.insert(5, torch.zeros(1, D))
    with pytest.raises(ValueError, match="frame 5 arrives after frame 5"):
        bank.insert(5, torch.zeros(1, D))
