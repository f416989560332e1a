"""Every policy at the real processors' token counts (conftest.real_token_models, docs/setup.md#test-models):
a 640x480 frame is 391 tokens per temporal patch of 2 frames on Qwen2.5-VL and 196 tokens on
LLaVA-OneVision, and the position ranges are small (2048, 4096), so a stream of 40 frames evicts at
every chunk and re-indexes again and again, as a real deployment does over hours.

Checked per chunk: positions inside the range, what each policy holds (exactly its budget or window
once full), which units it evicts, and, for fifo, the chunks at which it re-indexes, predicted from
the positions rule (docs/architecture.md#positions); questions keep being answered."""
import pytest

from streamcache_ros.engine import Session, SessionConfig
from streamcache_ros.engine.cache import PAD_UNIT

from conftest import REAL_TOKEN_FAMILIES, policy_for

CHUNK = 4  # frames: LLaVA-OV 4 units of 196 tokens; Qwen2.5-VL 2 units of 391
FRAMES = 40
CONFIG = dict(chunk_frames=CHUNK, max_question_tokens=64, max_new_tokens=8, mc_max_new_tokens=8)
UNIT_TOKENS = {"llava_onevision": 196, "qwen2_5_vl": 391}
FRAMES_PER_UNIT = {"llava_onevision": 1, "qwen2_5_vl": 2}
# positions one chunk takes: LLaVA-OV its 784 tokens; Qwen2.5-VL its largest extent (t 0 and 4, h 0..16, w 0..22)
CHUNK_POSITIONS = {"llava_onevision": 784, "qwen2_5_vl": 23}
# budgets in whole units: 6 frames on LLaVA-OV, 4 temporal patches (2 chunks) on Qwen2.5-VL
BUDGET = {"llava_onevision": 6 * 196, "qwen2_5_vl": 4 * 391}
# lazy re-index: LLaVA-OV at 4096 - 1024; Qwen2.5-VL, whose chunks take 23 positions, at 2048 - 1900
MARGIN = {"llava_onevision": 1024, "qwen2_5_vl": 1900}
WINDOWS = {"w_s": 1, "w_w": 2, "n_e": 4}  # H2SVC, in units
POLICIES = ["full", "fifo", "uniform", "hermes", "h2svc"]


def settings(family: str, name: str) -> dict:
    if name == "h2svc":
        return dict(WINDOWS)
    return {} if name == "full" else {"budget_tokens": BUDGET[family]}


def fifo_reindex_chunks(family: str, prefix: int, mode: str, chunks: int) -> list[int]:
    """The chunks (1-based) after which fifo re-indexes: eager after every one; lazy when the
    largest position passes max_position_embeddings - margin, renumbering to the budget's layout
    (1D: prefix + budget tokens; M-RoPE: the 2 kept chunks back to back, 23 positions each)."""
    if mode == "eager":
        return list(range(1, chunks + 1))
    limit = {"llava_onevision": 4096, "qwen2_5_vl": 2048}[family]
    threshold = limit - MARGIN[family]
    kept = prefix - 1 + (BUDGET[family] if family == "llava_onevision" else 2 * CHUNK_POSITIONS[family])
    largest, out = prefix - 1, []
    for chunk in range(1, chunks + 1):
        largest += CHUNK_POSITIONS[family]
        if largest > threshold:
            out.append(chunk)
            largest = kept
    return out


@pytest.mark.parametrize("mode", ["eager", "lazy"])
@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("family", REAL_TOKEN_FAMILIES)
def test_every_policy_evicts_and_reindexes_at_real_token_counts(real_token_adapters, camera_frames, family, name,
                                                                mode):
    adapter = real_token_adapters[family]
    policy = policy_for(adapter, name, reindex=mode, reindex_margin=MARGIN[family], **settings(family, name))
    session = Session(adapter, policy, SessionConfig(**CONFIG))
    prefix, per_unit = len(adapter.prefix_ids), UNIT_TOKENS[family]
    limit = adapter.geometry().max_position_embeddings
    units_per_chunk = CHUNK // FRAMES_PER_UNIT[family]
    # the full cache fills LLaVA-OV's 4096 positions after 20 frames (test_position_range), and its
    # attention grows with every chunk: 20 frames
    frames = 20 if name == "full" else FRAMES
    reindexed, answers = [], 0
    for chunk in range(1, frames // CHUNK + 1):
        reports = [session.add_frame(f, stamp=float(i), camera="/cam")
                   for i, f in enumerate(camera_frames(CHUNK, (chunk - 1) * CHUNK), start=(chunk - 1) * CHUNK)]
        report = reports[-1]
        assert report is not None and report.tokens == units_per_chunk * per_unit
        if report.outcome.reindexed:
            reindexed.append(chunk)
        stats = session.status().cache
        assert stats.max_position < limit
        held_units = chunk * units_per_chunk
        if name in ("fifo", "uniform", "hermes"):
            budget_units = BUDGET[family] // per_unit
            # exactly the budget per layer once the stream has passed it (a deep HERMES layer: one
            # of its slots is the summary token)
            expected = prefix + min(held_units, budget_units) * per_unit
            assert stats.layer_tokens == [expected] * len(stats.layer_tokens), (chunk, stats.layer_tokens)
            evicted = report.outcome.evicted_units
            if name != "hermes":  # whole units, as many as the chunk brought in once full
                assert len(evicted) == max(0, min(units_per_chunk, held_units - budget_units))
            if name == "fifo":  # the oldest ones
                first, before = max(0, held_units - budget_units), max(0, held_units - units_per_chunk - budget_units)
                assert evicted == list(range(before, first)) and stats.units == list(range(first, held_units))
            if name == "uniform":  # spread over the stream: the oldest unit stays
                assert stats.units[0] == 0 and stats.units[-1] == held_units - 1
            if name == "hermes" and held_units > budget_units:
                # the deepest layer folds what it drops into a new summary token; an older summary is a
                # candidate like any token (docs/hermes.md D8), so a deep layer may hold more than one
                summaries = stats.extra["summary_tokens"]
                assert summaries[-1] >= 1 and report.outcome.details["summary_tokens"] >= 1, summaries
        elif name == "h2svc":
            for groups in policy.groups:
                for group in groups:
                    window = (WINDOWS["w_s"], WINDOWS["w_w"], WINDOWS["n_e"])[group.bank]
                    rows = (group.store.units != PAD_UNIT).sum(dim=1)
                    assert int(rows.max()) == prefix + min(held_units, window) * per_unit
            assert stats.extra["stce_evictions"] == max(0, held_units - WINDOWS["n_e"])
        else:
            assert stats.layer_tokens[0] == prefix + held_units * per_unit
        if chunk % 3 == 0:
            answer = session.ask("what happened?", max_new_tokens=4)
            assert answer.answer_tokens >= 1 and answer.frames_in_memory == session.status().frames_in_memory
            answers += 1
    status = session.status()
    assert status.chunks_failed == 0 and answers >= 1
    if name == "fifo":
        assert reindexed == fifo_reindex_chunks(family, prefix, mode, frames // CHUNK)
    elif name == "full" and mode == "lazy":  # its positions only grow: re-indexed once past the threshold
        largest = prefix - 1 + frames // CHUNK * CHUNK_POSITIONS[family]
        assert bool(reindexed) == (largest > limit - MARGIN[family]), (reindexed, largest)
    elif mode == "eager" and name != "hermes":  # after every chunk
        assert reindexed == list(range(1, frames // CHUNK + 1))
    else:  # lazy: when positions pass the threshold; eager HERMES: when it shrinks, past its budget
        assert status.cache.reindex_events >= 1 and reindexed


@pytest.mark.parametrize("family", REAL_TOKEN_FAMILIES)
def test_the_real_processors_token_counts(real_token_adapters, camera_frames, family):
    adapter = real_token_adapters[family]
    inputs = adapter.preprocess(camera_frames(8))
    rel = adapter.chunk_rel_positions(inputs)
    embeds = adapter.encode(inputs)
    if family == "qwen2_5_vl":  # 640x480 -> 476x644 (multiples of 28) -> 34x46 patches -> 17x23 merged
        assert (inputs.num_units, inputs.tokens_per_unit, inputs.grid) == (4, 391, (4, 17, 23))
        assert rel.amax(dim=1).tolist() == [12.0, 16.0, 22.0]  # t advances 4 a temporal patch at 1 fps
    else:  # SigLIP 384 / patch 14 -> 27x27 patches, pooled to 14x14
        assert (inputs.num_units, inputs.tokens_per_unit, inputs.grid) == (8, 196, (8, 14, 14))
        assert rel.amax(dim=1).tolist() == [8 * 196 - 1]
    assert embeds.shape[0] == inputs.num_units * inputs.tokens_per_unit
