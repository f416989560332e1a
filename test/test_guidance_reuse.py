"""HERMES's embedding guidance (engine/ingest/guidance.py): a layer's q/k depend on the prompt and the
weights alone, so they are projected once and reused while both stay the same; only the layers a
prompt is read by are projected. What the policy gets must equal a fresh projection bit for bit."""
import torch

from streamcache_ros.engine import Session, SessionConfig, make_policy
from streamcache_ros.engine.cache import GuidancePrompt, GuidanceRequest
from streamcache_ros.engine.ingest.guidance import GuidanceProvider


class Counting(GuidanceProvider):
    def __init__(self, adapter):
        super().__init__(adapter)
        self.projected: list[list[int]] = []

    def embedding_qk(self, ids, layers=None):
        self.projected.append(list(layers))
        return super().embedding_qk(ids, layers)


def fresh(adapter, text, layers):
    provider = GuidanceProvider(adapter)
    every = provider.embedding_qk(provider.token_ids(text))
    return [every[i] for i in layers]


def assert_equal_passes(got, adapter, request):
    for prompt, guidance_pass in zip(request.prompts, got):
        assert guidance_pass.layers == prompt.layers
        for (q, k), (q0, k0) in zip(guidance_pass.qk, fresh(adapter, prompt.text, prompt.layers)):
            assert torch.equal(q, q0) and torch.equal(k, k0)


def test_a_prompt_is_projected_once_and_only_for_its_layers(llava_adapter):
    adapter = llava_adapter
    policy = make_policy("fifo", budget_tokens=64)
    Session(adapter, policy)  # the prefix in the cache: guidance positions come after it
    provider = Counting(adapter)
    request = GuidanceRequest([GuidancePrompt("describe the scene", [1, 2]), GuidancePrompt("summarise it", [3])])
    first = provider.compute(request, policy)
    assert provider.projected == [[1, 2], [3]]
    assert_equal_passes(first, adapter, request)
    again = provider.compute(request, policy)
    assert provider.projected == [[1, 2], [3]]  # nothing projected again
    assert_equal_passes(again, adapter, request)
    # a new text after a question (docs/hermes.md §5), and a layer more for the old one
    changed = GuidanceRequest([GuidancePrompt("describe the red ball", [1, 2]), GuidancePrompt("summarise it", [2, 3])])
    assert_equal_passes(provider.compute(changed, policy), adapter, changed)
    assert provider.projected == [[1, 2], [3], [1, 2], [2]]


def test_a_weight_changed_in_place_is_projected_again(tmp_path):
    from streamcache_ros.engine import load_adapter

    adapter = load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32")  # its own copy: weights change
    policy = make_policy("fifo", budget_tokens=64)
    Session(adapter, policy)
    provider = Counting(adapter)
    request = GuidanceRequest([GuidancePrompt("describe the scene", [0, 1])])
    provider.compute(request, policy)
    with torch.no_grad():
        adapter.text_model.layers[1].self_attn.q_proj.weight.mul_(2.0)
    assert_equal_passes(provider.compute(request, policy), adapter, request)
    assert provider.projected == [[0, 1], [1]]


def test_hermes_chunks_reuse_the_guidance_until_a_question_changes_it(qwen_adapter, frames, monkeypatch):
    projected = []
    embedding_qk = GuidanceProvider.embedding_qk

    def counting(self, ids, layers=None):
        projected.append(list(layers))
        return embedding_qk(self, ids, layers)

    monkeypatch.setattr(GuidanceProvider, "embedding_qk", counting)
    session = Session(qwen_adapter, make_policy("hermes", budget_tokens=24), SessionConfig(chunk_frames=4))
    video = frames(24)
    for i, frame in enumerate(video[:16]):
        session.add_frame(frame, stamp=float(i))
    asked = len(projected)
    assert asked > 0, "no chunk compressed: the budget no longer tests guidance"
    session.ask("what moved?", max_new_tokens=2)
    for i, frame in enumerate(video[16:], start=16):
        session.add_frame(frame, stamp=float(i))
    # the prompts of the first compression, then once more after the question changed them
    assert len(projected) == 2 * asked
