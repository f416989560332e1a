"""The model's position range (docs/architecture.md#the-position-range), on both families at the real
processors' token counts (conftest.real_token_models: 391 tokens per 2 frames of 640x480 on
Qwen2.5-VL, 196 per frame on LLaVA-OneVision, small ranges):

- at configure, a bounded policy whose kept tokens, one chunk and the largest question cannot fit
  inside ``max_position_embeddings`` is refused with a ConfigError naming its parameter; positions
  grow by the family's rule (a chunk is its tokens with 1D RoPE, its largest t/h/w extent with
  M-RoPE), so the largest accepted budget is exact;
- the full cache stops taking frames in when the range is full, with an ERROR memory diagnostic
  that names the limit and suggests a bounded policy; no position ever passes the range, later
  chunks are refused too, and questions are still answered from what is held.
"""
import json
import pathlib
import shutil

import pytest
import torch

from streamcache_ros.engine import ChunkError, ConfigError, Session, SessionConfig, load_adapter, make_policy
from streamcache_ros.engine.factory import build_policy

from conftest import REAL_TOKEN_FAMILIES

QUESTION = {"max_question_tokens": 64, "max_new_tokens": 16}  # the largest question: 64 + 16 positions
LARGEST_QUESTION = 80
# one chunk of 4 frames of 640x480: LLaVA-OV 4 x 196 tokens, one position each; Qwen2.5-VL two
# temporal patches of 17 x 23 tokens by the chunk-start rule (t 0 and 4, h 0..16, w 0..22): 23
CHUNK_POSITIONS = {"llava_onevision": 4 * 196, "qwen2_5_vl": 23}
# one stream unit alone: 196 tokens; a temporal patch's largest extent, w 0..22
UNIT_POSITIONS = {"llava_onevision": 196, "qwen2_5_vl": 23}


def room(adapter) -> int:
    """Positions left for what a policy keeps: the range less the prefix, a chunk and a question."""
    family = adapter.family
    return (adapter.geometry().max_position_embeddings - len(adapter.prefix_ids) - CHUNK_POSITIONS[family]
            - LARGEST_QUESTION)


def largest_budget(adapter) -> int:
    """1D: one position a kept token. M-RoPE: the budget in whole chunks of 782 tokens (2 x 391),
    each 23 positions after a re-index, and one more for a partial chunk."""
    if adapter.family == "llava_onevision":
        return room(adapter)
    return (room(adapter) // CHUNK_POSITIONS["qwen2_5_vl"] - 1) * 2 * 391


@pytest.mark.parametrize("family", REAL_TOKEN_FAMILIES)
def test_a_budget_that_cannot_fit_the_range_is_refused_at_configure(real_token_adapters, family):
    adapter = real_token_adapters[family]
    limit = adapter.geometry().max_position_embeddings
    most = largest_budget(adapter)  # LLaVA-OV: 3211 tokens; Qwen2.5-VL: 82 chunks, 64124 tokens in 2048 positions
    base = {"chunk_frames": 4, **QUESTION}
    for name in ("fifo", "uniform", "hermes"):
        assert build_policy(adapter, name, {**base, "budget_tokens": most}).budget_tokens == most  # just fits
        with pytest.raises(ConfigError) as refused:
            build_policy(adapter, name, {**base, "budget_tokens": most + 1})
        assert refused.value.parameter == "budget_tokens"
        assert f"max_position_embeddings {limit}" in str(refused.value)
        assert f"use budget_tokens <= {most}" in str(refused.value)
    # H2SVC keeps its longest window in units, each unit renumbered with its own extent
    units = room(adapter) // UNIT_POSITIONS[family]
    assert build_policy(adapter, "h2svc", {**base, "h2svc.n_e": units}).n_e == units
    with pytest.raises(ConfigError) as refused:
        build_policy(adapter, "h2svc", {**base, "h2svc.n_e": units + 1})
    assert refused.value.parameter == "h2svc.n_e" and f"use h2svc.n_e <= {units}" in str(refused.value)
    # the full cache is never refused: it stops taking frames in at the range instead
    assert build_policy(adapter, "full", base).bounding_setting == ""


def test_a_fifo_budget_past_the_position_range_is_refused_and_the_real_ranges_take_the_default_budgets(
        real_token_adapters, tmp_path):
    # fifo with budget 3000 in 4096 positions once ran to position 4588 (LLaVA-OV, chunks of 8 frames,
    # the default question sizes; docs/architecture.md#the-position-range)
    llava = real_token_adapters["llava_onevision"]
    with pytest.raises(ConfigError, match="budget_tokens <= 1931"):  # 4096 - 21 - 8 * 196 - (512 + 64)
        build_policy(llava, "fifo", {"budget_tokens": 3000})
    # at the real models' ranges (LLaVA-OV-0.5B 32768, Qwen2.5-VL-3B 128000) the defaults fit
    for family, limit in (("llava_onevision", 32768), ("qwen2_5_vl", 128000)):
        adapter = load_adapter(with_range(real_token_adapters[family].model_dir, tmp_path, limit), device="cpu")
        assert build_policy(adapter, "hermes", {}).budget_tokens == 6000
        assert build_policy(adapter, "h2svc", {}).n_e == 64


def with_range(folder: str, tmp_path, limit: int) -> str:
    """A copy of a model folder with another position range (the same weights and name, so its head
    map is still its own)."""
    out = tmp_path / f"range-{limit}" / pathlib.Path(folder).name
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = limit
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


@pytest.mark.parametrize("family, limit", [
    ("llava_onevision", None),  # the fixture's 4096: 20 frames of 196 tokens with the prefix and a question
    # M-RoPE: chunks take 23 positions, and a full re-index ranks each axis densely, so the range
    # fills only when a chunk, a question and the densest layout no longer fit: a small range
    ("qwen2_5_vl", 140),
])
def test_the_full_cache_stops_taking_frames_in_at_the_range(real_token_adapters, camera_frames, tmp_path, family,
                                                            limit):
    from diagnostic_msgs.msg import DiagnosticStatus  # noqa: PLC0415

    from streamcache_ros.node import diagnostics  # noqa: PLC0415
    from test_node_diagnostics import run  # noqa: PLC0415

    adapter = real_token_adapters[family]
    if limit is not None:
        adapter = load_adapter(with_range(adapter.model_dir, tmp_path, limit), device="cpu", dtype="float32")
        # memoised: the same processor and vision tower
        adapter.preprocess, adapter.encode = real_token_adapters[family].preprocess, real_token_adapters[family].encode
    limit = adapter.geometry().max_position_embeddings
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=4, **QUESTION))
    refused, held = [], None
    for i, frame in enumerate(camera_frames(120)):
        try:
            session.add_frame(frame, stamp=float(i))
        except ChunkError as err:
            assert err.position_range and not err.kept
            refused.append(str(err))
            held = held or session.policy.state_dict()
            if len(refused) == 2:
                break
        assert session.policy.max_position() < limit  # never past the range
    assert len(refused) == 2, "the full cache never reached the range"
    assert f"max_position_embeddings {limit}" in refused[0] and "bounded policy" in refused[0]
    status = session.status()
    assert status.ingest_stopped == refused[1] and status.frames_in_memory == 4 * status.chunks_encoded
    assert torch.equal(held["layers"][0]["keys"], session.policy.state_dict()["layers"][0]["keys"])  # unchanged
    # the memory still answers, from the frames it holds, without passing the range
    answer = session.ask("what happened?", max_new_tokens=8)
    assert answer.answer_tokens >= 1 and answer.frames_in_memory == status.frames_in_memory
    assert answer.newest_stamp == status.newest_stamp
    # the memory diagnostic is ERROR and says why, until a chunk is taken in again (here: after a reset)
    level, message, _ = run(diagnostics.EngineTasks(lambda: diagnostics.EngineView(session.status())).memory)
    assert level == DiagnosticStatus.ERROR and message == refused[1]
    session.reset()
    session.add_frame(camera_frames(1)[0], stamp=1000.0)
    assert session.status().ingest_stopped == ""
