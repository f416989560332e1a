"""Several questions in one forward pass (cache/rows.py, engine/questions/scoring.py): each row computes what
it would alone, with every policy on both families, and the cache is as it was afterwards."""
from __future__ import annotations

import pytest
import torch

from streamcache_ros.engine import Session, SessionConfig
from streamcache_ros.engine.questions.scoring import score_options

from conftest import policy_for, states_equal

POLICIES = {"full": {}, "fifo": {"budget_tokens": 40}, "uniform": {"budget_tokens": 40},
            "hermes": {"budget_tokens": 40}, "h2svc": {}}


def alone(adapter, policy, ids: list[int], key_filter) -> torch.Tensor:
    """log-probabilities after each of ``ids`` for one question asked alone with ``key_filter``."""
    mark = policy.mark()
    hidden = adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), policy, key_filter)
    policy.truncate(mark)
    return torch.log_softmax(adapter.logits(hidden[0]), dim=-1)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_row_scores_what_it_would_alone(adapter, frames, name):
    session = Session(adapter, policy_for(adapter, name, **POLICIES[name]), SessionConfig(chunk_frames=4))
    for i, frame in enumerate(frames(20)):
        session.add_frame(frame, stamp=float(i), camera="/front" if i < 12 else "/rear")
    session.flush()
    policy = session.policy
    before = policy.state_dict()
    units = sorted(session.ledger.units)
    filters = [None, torch.tensor(units[:2]), torch.tensor(units[-1:]), torch.tensor(units[1:4] + [-2])]
    options = [adapter.option_ids(["yes", "no", "green square"], i) for i in range(3)]
    prompt = adapter.question_ids("Did you see a red circle?", ["yes", "no", "green square"])
    scored = score_options(adapter, policy, [(prompt, f) for f in filters], options)
    assert states_equal(policy.state_dict(), before)  # the rows' tokens are gone again
    for key_filter, result in zip(filters, scored):
        expected = []
        for ids in options:
            logp = alone(adapter, policy, prompt + ids[:-1], key_filter)[len(prompt) - 1:]
            expected.append(float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum()))
        assert result.log_likelihoods == pytest.approx(expected, abs=1e-4)
        assert sum(result.probabilities) == pytest.approx(1.0)
        assert result.best == max(range(3), key=expected.__getitem__)
    # what one row sees matters: a window of two units and the whole memory score differently
    assert scored[0].log_likelihoods != pytest.approx(scored[1].log_likelihoods, abs=1e-4)


def test_identical_rows_are_asked_once(qwen_adapter, frames, monkeypatch):
    """Single-token options share one row per question: the forward takes one row per filter."""
    session = Session(qwen_adapter, policy_for(qwen_adapter, "full"), SessionConfig(chunk_frames=4))
    for i, frame in enumerate(frames(8)):
        session.add_frame(frame, stamp=float(i))
    seen = []
    forward = qwen_adapter.forward
    monkeypatch.setattr(qwen_adapter, "forward", lambda embeds, new, *a, **k: seen.append(len(new)) or
                        forward(embeds, new, *a, **k))
    prompt = qwen_adapter.question_ids("Did you see a red circle?", ["yes", "no"])
    yes, no = (qwen_adapter.option_ids(["yes", "no"], i) for i in range(2))
    assert len(yes) == len(no) == 1
    score_options(qwen_adapter, session.policy, [(prompt, f) for f in (None, torch.tensor([0]), torch.tensor([1]))],
                  [yes, no])
    assert seen == [3 * len(prompt)]
