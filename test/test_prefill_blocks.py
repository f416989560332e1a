"""A chunk prefilled in blocks (engine/ingest/prefill.py) against the same chunk in one forward per step:
both families, every policy, chunks whose end triggers a compression. The caches must agree within
1e-5 in float32 (the same attention, summed in another order), every policy must take the same
steps (after_prefill, one compression a chunk), and no block may shrink the cache."""
import pytest
import torch

from streamcache_ros.engine import ConfigError, Session, SessionConfig
from streamcache_ros.engine.cache import NewTokens
from streamcache_ros.engine.ingest.prefill import prefill_steps

from conftest import policy_for

CHUNK = 4  # frames: two Qwen2.5-VL units; the tiny models give 4-6 tokens a frame
CHUNKS = 4
# small budgets: the second chunk's end compresses (h2svc: its episodic heads evict from the third unit on)
POLICIES = {
    "full": {},
    "fifo": {"budget_tokens": 24},
    "uniform": {"budget_tokens": 24},
    "hermes": {"budget_tokens": 24},
    "h2svc": {"w_s": 1, "w_w": 2, "n_e": 2},
    "h2svc-chunk": {"w_s": 1, "w_w": 2, "n_e": 2, "unit_by_unit": False},
}
BLOCKS = [1, 5]  # one token a forward; 5, which cuts units and chunks at odd places


class Recorder:
    """Counts what the session asks of the policy: each forward of a chunk (its length, at the
    policy's layer-0 attention), after_prefill and compress; and checks that between two forwards
    of a chunk every store grew by exactly the tokens of the first (nothing evicted, nothing else)."""

    def __init__(self, session):
        policy = session.policy
        self.forwards, self.after_prefill, self.compressions, self.unexpected_lengths = [], [], 0, 0
        attend, after_prefill, compress = policy.attend, policy.after_prefill, policy.compress
        expected = [None]

        def lengths():
            return [len(store) for layer in policy.layer_stores() for _, store in layer]

        def on_attend(layer, q, k, v, new, *args, **kwargs):
            if layer == 0 and bool((new.units >= 0).any()):  # a chunk's forward (not the prefix or a question)
                now = lengths()
                if expected[0] is not None and now != expected[0]:
                    self.unexpected_lengths += 1
                expected[0] = [n + len(new) for n in now]
                self.forwards.append(len(new))
            return attend(layer, q, k, v, new, *args, **kwargs)

        def on_after_prefill(new):
            self.after_prefill.append(len(new))
            return after_prefill(new)

        def on_compress(context):
            self.compressions += 1
            expected[0] = None
            return compress(context)

        policy.attend, policy.after_prefill, policy.compress = on_attend, on_after_prefill, on_compress


def run(adapter, frames, policy: str, block: int):
    name = policy.split("-")[0]
    session = Session(adapter, policy_for(adapter, name, **POLICIES[policy]),
                      SessionConfig(chunk_frames=CHUNK, prefill_block_tokens=block))
    recorder = Recorder(session)
    reports = []
    for i, frame in enumerate(frames(CHUNK * CHUNKS)):
        report = session.add_frame(frame, stamp=float(i))
        if report is not None:
            reports.append(report)
    return session, recorder, reports


def assert_close_states(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype, where
        if a.is_floating_point() and not where.endswith("/positions"):  # keys, values, STCE's frame vectors
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m: f"{where}: {m}")
        else:  # positions, units, chunks, heads: exact
            assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_close_states(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_states(x, y, f"{where}/{i}")
    else:
        assert a == b, where


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_chunk_in_blocks_equals_the_chunk_in_one_forward(adapter, frames, policy):
    whole, whole_calls, whole_reports = run(adapter, frames, policy, block=0)
    assert any(r.outcome.evicted_tokens for r in whole_reports) or policy == "full", \
        "no chunk's end compressed anything: the budgets no longer test a compression"
    tokens = whole_reports[0].tokens
    unit_by_unit = whole.policy.prefill_unit_by_unit
    for block in BLOCKS:
        blocked, calls, reports = run(adapter, frames, policy, block)
        assert_close_states(whole.policy.state_dict(), blocked.policy.state_dict(), f"{policy}, blocks of {block}")
        assert [r.outcome.evicted_units for r in reports] == [r.outcome.evicted_units for r in whole_reports]
        assert [r.outcome.evicted_tokens for r in reports] == [r.outcome.evicted_tokens for r in whole_reports]
        # the same steps: after_prefill once a chunk (or once a unit), one compression a chunk
        assert calls.after_prefill == whole_calls.after_prefill
        assert calls.compressions == whole_calls.compressions == CHUNKS
        # every block at most ``block`` tokens, none across a unit where the policy steps by unit
        assert max(calls.forwards) <= block and sum(calls.forwards) == CHUNKS * tokens
        if block < max(whole_calls.forwards):  # (blocks of 5 where a unit is 4 tokens: one forward a unit)
            assert len(calls.forwards) > len(whole_calls.forwards)
        if unit_by_unit:
            assert len(calls.forwards) >= CHUNKS * reports[0].units
        assert calls.unexpected_lengths == 0  # no block evicted anything


def test_one_forward_per_step_without_blocks(adapter, frames):
    _, calls, reports = run(adapter, frames, "fifo", block=0)
    assert calls.forwards == [reports[0].tokens] * CHUNKS
    _, calls, reports = run(adapter, frames, "h2svc", block=0)
    per_unit = reports[0].tokens // reports[0].units
    assert calls.forwards == [per_unit] * (CHUNKS * reports[0].units)


def test_prefill_steps_cover_the_chunk_in_order():
    # 10 tokens, units of 4: by chunk, blocks of 3 cut anywhere; by unit, a block never crosses a unit
    assert prefill_steps(10, 4, False, 3) == [[slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]]
    assert prefill_steps(10, 4, True, 3) == [[slice(0, 3), slice(3, 4)], [slice(4, 7), slice(7, 8)],
                                             [slice(8, 10)]]
    assert prefill_steps(10, 4, False, 0) == [[slice(0, 10)]]
    assert prefill_steps(10, 4, True, 0) == [[slice(0, 4)], [slice(4, 8)], [slice(8, 10)]]
    assert prefill_steps(10, 4, False, 64) == [[slice(0, 10)]]


def test_a_block_of_a_step_arrives_with_the_steps_first_unit():
    units = torch.tensor([7, 7, 8, 8])
    assert NewTokens(torch.zeros(1, 4), units, units).arriving_unit() == 7
    assert NewTokens(torch.zeros(1, 2), units[2:], units[2:], first_unit=7).arriving_unit() == 7
    text = torch.full((3,), -1)
    assert NewTokens(torch.zeros(1, 3), text, text).arriving_unit() is None


@pytest.mark.parametrize("value", [-1, 1.5, True, "512", None])
def test_a_bad_block_size_is_refused_naming_the_parameter(value):
    with pytest.raises(ConfigError) as err:
        SessionConfig(prefill_block_tokens=value)
    assert err.value.parameter == "prefill_block_tokens"
    assert "prefill_block_tokens" in str(err.value)


def test_block_size_defaults_and_zero():
    assert SessionConfig().prefill_block_tokens > 0
    assert SessionConfig(prefill_block_tokens=0).prefill_block_tokens == 0
