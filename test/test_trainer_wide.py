"""A wider world model from a trained one's vision (scripts/train_world_model.py --vision-from and
--text-*; docs/world-models.md "A wider pair"): the new folder has the asked text shape, the trained
vision tower and projector exactly, the source's tokenizer and processor, none of the source's
per-weights files, and it loads with the package's loader and answers in a Session."""
from __future__ import annotations

import importlib
import json
import pathlib
import sys

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_world_model.py"
SOURCES = {"qwen2_5_vl": ROOT / "streamcache_ros" / "models" / "world-qwen2_5_vl",
           "llava_onevision": ROOT / "streamcache_ros" / "models" / "world-llava_onevision"}


@pytest.fixture(scope="module")
def trainer():
    sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("train_world_model")


def test_the_default_shape_is_the_bundled_one(trainer):
    assert trainer.text_shape() == trainer.TEXT
    wide = trainer.text_shape(6, 8, 4)
    assert (wide["num_hidden_layers"], wide["num_attention_heads"], wide["num_key_value_heads"]) == (6, 8, 4)
    assert wide["hidden_size"] == trainer.TEXT["hidden_size"]
    with pytest.raises(ValueError):
        trainer.text_shape(heads=8, kv_heads=3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"])
def test_a_wide_model_takes_the_trained_vision_and_runs_in_a_session(trainer, family, tmp_path):
    from safetensors.torch import load_file  # noqa: PLC0415

    from streamcache_ros import world  # noqa: PLC0415
    from streamcache_ros.engine import Session, SessionConfig, load_adapter, make_policy  # noqa: PLC0415

    torch.set_num_threads(1)
    source, out = SOURCES[family], tmp_path / "wide"
    copied = trainer.build_with_vision_from(family, source, out, 0, trainer.text_shape(6, 8, 4))
    assert copied["tensors_copied"] > 20 and copied["projector_left_new"] == []
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert (text["num_hidden_layers"], text["num_attention_heads"], text["num_key_value_heads"]) == (6, 8, 4)
    if family == "qwen2_5_vl":  # M-RoPE's sections fill a 16-wide head's 8 rotary pairs
        assert sum(text["rope_parameters"]["mrope_section"]) == 8
    for name in ("tokenizer.json", "preprocessor_config.json", "streamcache.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert not (out / "h2svc_head_map.json").exists() and not (out / "evidence_layers.json").exists()
    # the same vision weights under the files' own names; the language model new
    trained, new = load_file(source / "model.safetensors"), load_file(out / "model.safetensors")
    vision = [k for k in trained if trainer._is_vision(k)]
    assert vision and all(torch.equal(trained[k], new[k]) for k in vision)
    assert sum(".layers.5." in k and not trainer._is_vision(k) for k in new)

    adapter = load_adapter(str(out), device="cpu", dtype="float32")
    stream = world.make_stream(800_000_402, 8, question_points=[8])
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8))
    for i in range(8):
        session.add_frame(stream.frame(i), stamp=stream.stamp(i))
    question = stream.questions(8, np.random.default_rng(0), ("now_color",))[0]
    assert session.ask(question.text, question.options).option_index in range(len(question.options))


def test_grow_honest_asks_honest_questions_on_short_streams_first(trainer):
    """A new language model starts on grow's short streams, with honest's free text and hard
    negatives; its held-out check is honest's mix, comparable with the v4 models' figure."""
    drawn = [trainer.sample_example(trainer.TRAIN_SEED + i, 0.0, 2, curriculum="grow-honest") for i in range(6)]
    assert max(len(frames) for frames, _, _ in drawn) <= 16
    labels = [name for _, _, names in drawn for name in names]
    assert any(name.endswith("@free") for name in labels)
    assert any("@hard" in name or "@compare" in name for name in labels)
    assert trainer.HELD_OUT_MIX["grow-honest"] == "honest"
