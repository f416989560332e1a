"""Model adapters on the bundled tiny models: inputs, positions, and the cached path vs transformers."""
import math

import pytest
import torch

from streamcache_ros.engine import ConfigError, ModelLoadError, Session, SessionConfig, load_adapter, make_policy
from streamcache_ros.engine.cache import TEXT_UNIT

from conftest import make_variant


def test_qwen_video_of_a_repeated_frame_equals_the_image_path(qwen_adapter, frames):
    frame = frames(1)[0]
    inputs = qwen_adapter.preprocess([frame, frame])
    reference = qwen_adapter.image_processor(images=[frame], return_tensors="pt")
    torch.testing.assert_close(inputs.tensors["pixel_values_videos"], reference["pixel_values"], atol=0, rtol=0)
    assert inputs.tensors["video_grid_thw"].tolist() == reference["image_grid_thw"].tolist()


def test_qwen_two_frames_share_each_patch_on_the_temporal_axis(qwen_adapter, frames):
    a, b = frames(2)
    inputs = qwen_adapter.preprocess([a, b])
    p = qwen_adapter.patch_size
    pixels = inputs.tensors["pixel_values_videos"].view(-1, 3, 2, p, p)
    first = qwen_adapter.preprocess([a, a]).tensors["pixel_values_videos"].view(-1, 3, 2, p, p)
    second = qwen_adapter.preprocess([b, b]).tensors["pixel_values_videos"].view(-1, 3, 2, p, p)
    torch.testing.assert_close(pixels[:, :, 0], first[:, :, 0], atol=0, rtol=0)
    torch.testing.assert_close(pixels[:, :, 1], second[:, :, 1], atol=0, rtol=0)
    assert inputs.unit_frames == [(0, 1)]


def test_qwen_odd_chunk_pads_the_last_unit(qwen_adapter, frames):
    inputs = qwen_adapter.preprocess(frames(3))
    assert inputs.num_units == 2 and inputs.unit_frames == [(0, 1), (2,)]


def test_qwen_chunk_positions_follow_the_grid(qwen_adapter, frames):
    inputs = qwen_adapter.preprocess(frames(4))  # 2 units of a 120x160 frame -> 84x112 -> 3x4 tokens
    units, rows, cols = inputs.grid
    assert (units, rows, cols) == (2, 3, 4)
    rel = qwen_adapter.chunk_rel_positions(inputs)
    stride = 2 / 1.0 * qwen_adapter.model.config.vision_config.tokens_per_second  # 2 frames / fps · tps
    assert rel[0].tolist() == [0.0] * 12 + [float(math.floor(stride))] * 12
    assert rel[1, :4].tolist() == [0.0] * 4 and rel[1, 4:8].tolist() == [1.0] * 4
    assert rel[2, :4].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_llava_frames_normalised_like_the_image_processor(llava_adapter, frames):
    frame = frames(1)[0]
    ours = llava_adapter.preprocess([frame]).tensors["pixel_values_videos"][0, 0]
    # the image processor's first crop is the whole frame resized to the tower's input
    reference = llava_adapter.image_processor(images=[frame], return_tensors="pt")["pixel_values"][0, 0]
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)


def test_llava_tokens_per_frame_and_no_newline(llava_adapter, frames):
    inputs = llava_adapter.preprocess(frames(3))
    side = llava_adapter.image_size // llava_adapter.model.config.vision_config.patch_size
    assert inputs.tokens_per_unit == math.ceil(side / 2) ** 2
    assert llava_adapter.encode(inputs).shape[0] == 3 * inputs.tokens_per_unit


def _reference_logits(adapter, embeds, positions):
    """transformers' own text model over the whole sequence (no cache), then the LM head."""
    pos = positions[:, None, :].long() if positions.shape[0] == 3 else positions.long()
    with torch.inference_mode():
        hidden = adapter.text_model(inputs_embeds=embeds, position_ids=pos, use_cache=False).last_hidden_state
        return adapter.lm_head(hidden).float()


def test_cached_path_equals_full_recompute(adapter, frames):
    """Prefix, two chunks and a question through the ``full`` cache give the logits transformers
    computes over the same tokens and positions in one pass."""
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=4))
    video = frames(8)
    for i, frame in enumerate(video):
        session.add_frame(frame, stamp=float(i))
    policy = session.policy
    positions_before_question = policy.layers[0].positions.clone()
    ids = adapter.question_ids("what moved?", [])
    mark = policy.mark()
    ours = adapter.logits(adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), policy))
    all_positions = policy.layers[0].positions.clone()
    policy.truncate(mark)

    with torch.inference_mode():
        prefix = adapter.embed_text(adapter.prefix_ids)
        chunks = [adapter.encode(adapter.preprocess(video[i:i + 4]))[None] for i in (0, 4)]
        embeds = torch.cat([prefix, *chunks, adapter.embed_text(ids)], dim=1)
    assert embeds.shape[1] == all_positions.shape[1]
    # positions: text continues at max + 1 after the video (the chunk-start rule)
    assert all_positions[:, positions_before_question.shape[1]].tolist() == \
        [positions_before_question.max().item() + 1] * all_positions.shape[0]
    reference = _reference_logits(adapter, embeds, all_positions)[:, -len(ids):]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_missing_model_path_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="'/nonexistent/model' does not exist"):
        load_adapter("/nonexistent/model")


def test_unsupported_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="'bert' model; supported: qwen2_5_vl, llava_onevision"):
        load_adapter(str(tmp_path))


def test_cuda_requested_without_cuda_names_the_parameter(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    with pytest.raises(ConfigError, match="parameter 'device': 'cuda' requested but CUDA is not available"):
        load_adapter("tiny-qwen2_5_vl", device="cuda")


def test_text_tokens_are_temporary_units(adapter):
    new = adapter.text_tokens(3)
    assert new.units.tolist() == [TEXT_UNIT] * 3 and new.rel_positions[:, -1].tolist() == [2.0] * new.rel_positions.shape[0]


def test_variant_loads_with_changed_config(tmp_path):
    adapter = load_adapter(make_variant(tmp_path, "tiny-llava_onevision", max_position_embeddings=128))
    assert adapter.geometry().max_position_embeddings == 128
