"""SAP head profiling (docs/h2svc.md §2): metrics by hand, the split, the head map file, the profiler
against transformers' own attention weights, and the streamcache-profile command on real inputs."""
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from streamcache_ros import world
from streamcache_ros.engine.cache.sap import (HeadMap, TadAccumulator, frame_attention, head_scores, min_max,
                                              pool_query_heads, split_banks, split_counts, split_layers)
from streamcache_ros.tools.profile_heads import (AttentionRecorder, cut_videos, image_message_to_rgb, main,
                                                 profile_video)

ROOT = pathlib.Path(__file__).resolve().parents[1]


# -- the metrics (TC8) -----------------------------------------------------------------------------
def test_tc8_v2v_t2v_and_gqa_by_hand():
    acc = TadAccumulator(num_layers=1, num_q_heads=1, num_frames=3)
    rows = torch.tensor([[[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.2, 0.3, 0.5]]])  # [head, query, frame]
    acc.add_visual(0, rows, torch.tensor([0, 1, 2]))
    acc.add_text(0, torch.tensor([[[0.1, 0.2, 0.7]]]))
    v2v, t2v = acc.result()
    assert v2v.item() == pytest.approx((0 + 0.25 + 0.7) / 3) and v2v.item() == pytest.approx(0.31667, abs=1e-5)
    assert t2v.item() == pytest.approx(0.4)
    assert pool_query_heads(torch.tensor([[0.2, 0.6]]), group=2).item() == pytest.approx(0.4)
    assert pool_query_heads(torch.tensor([[0.2, 0.6]]), group=2, mode="max").item() == pytest.approx(0.6)


def test_v2v_averages_tokens_within_a_frame_then_frames():
    # frame 1 has one query (distance 0); frame 2 has three queries with distances 1, 0, 0.5
    acc = TadAccumulator(num_layers=1, num_q_heads=1, num_frames=2)
    attn = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]])
    acc.add_visual(0, attn, torch.tensor([0, 1, 1, 1]))
    acc.add_text(0, torch.tensor([[[0.0, 1.0]]]))
    v2v, _ = acc.result()
    assert v2v.item() == pytest.approx((0 + (1 + 0 + 0.5) / 3) / 2)


def dense_frame_attention(q, k, key_frame, num_frames):
    """docs/h2svc.md's definition, one query at a time: softmax over every visible key, mass per frame,
    renormalised over the visual frames."""
    hq, q_len, dim = q.shape
    hkv, k_len, _ = k.shape
    out = torch.zeros(hq, q_len, num_frames, dtype=torch.float64)
    for h in range(hq):
        for i in range(q_len):
            visible = k_len - q_len + i + 1
            logits = torch.stack([q[h, i].double() @ k[h // (hq // hkv), j].double() for j in range(visible)])
            weights = torch.softmax(logits / math.sqrt(dim), 0)
            mass = torch.zeros(num_frames, dtype=torch.float64)
            for j in range(visible):
                if key_frame[j] >= 0:
                    mass[key_frame[j]] += weights[j]
            if mass.sum() > 0:
                out[h, i] = mass / mass.sum()
    return out


def test_frame_attention_equals_the_definition_with_prefix_text_and_gqa():
    torch.manual_seed(0)
    # keys: 2 prefix, frames 0,0,1,1,2,2, then 2 text; the last 5 keys are the queries
    key_frame = torch.tensor([-1, -1, 0, 0, 1, 1, 2, 2, -1, -1])
    q, k = torch.randn(4, 5, 8), torch.randn(2, 10, 8)
    ours = frame_attention(q, k, key_frame, num_frames=3, block_rows=2)
    torch.testing.assert_close(ours.double(), dense_frame_attention(q, k, key_frame, 3), atol=1e-6, rtol=0)
    assert torch.allclose(ours.sum(-1), torch.ones(4, 5))


def test_a_query_that_sees_no_frame_has_no_mass():
    key_frame = torch.tensor([-1, 0])
    out = frame_attention(torch.randn(1, 2, 4), torch.randn(1, 2, 4), key_frame, num_frames=1)
    assert out[0, 0].tolist() == [0.0] and out[0, 1].tolist() == [pytest.approx(1.0)]


# -- score and split (TC9) -------------------------------------------------------------------------
@pytest.mark.parametrize("total, expected", [(112, (11, 45, 56)), (48, (5, 19, 24)), (8, (1, 3, 4))])
def test_tc9_split_counts(total, expected):
    assert split_counts(total) == expected


def test_tc9_the_lowest_scores_are_instantaneous():
    torch.manual_seed(3)
    scores = torch.randperm(112).double().reshape(28, 4)  # 112 distinct values
    banks = split_banks(scores)
    assert [int((banks == b).sum()) for b in range(3)] == [11, 45, 56]
    assert set(scores[banks == 0].tolist()) == set(range(11))
    assert set(scores[banks == 2].tolist()) == set(range(56, 112))
    counts = split_banks(torch.randperm(48).double().reshape(24, 2))
    assert [int((counts == b).sum()) for b in range(3)] == [5, 19, 24]


def test_ties_go_by_layer_then_head():
    banks = split_banks(torch.zeros(2, 5))  # 10 heads, all equal: 1 / 4 / 5 in (layer, head) order
    assert banks.reshape(-1).tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 2]


def test_normalisation_is_global_not_per_layer():
    v2v = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    t2v = torch.tensor([[10.0, 10.0], [10.0, 30.0]])
    assert min_max(v2v).tolist() == [[0.0, 0.25], [0.5, 1.0]]
    assert min_max(torch.full((2, 2), 7.0)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert head_scores(v2v, t2v).tolist() == [[0.0, 0.125], [0.25, 1.0]]


def test_layer_wise_split_gives_a_layer_one_bank():
    v2v = torch.tensor([[1.0, 1.2], [5.0, 5.0], [3.0, 3.5], [0.0, 0.1], [9.0, 8.0], [4.0, 4.0],
                        [2.0, 2.0], [7.0, 7.0], [6.0, 6.0], [8.0, 8.0]])
    banks = split_layers(v2v, v2v.clone())
    assert (banks[:, 0] == banks[:, 1]).all()
    assert banks[3].tolist() == [0, 0]  # the lowest layer: 10% of 10 layers
    assert int((banks[:, 0] == 1).sum()) == 4 and int((banks[:, 0] == 2).sum()) == 5


def test_ratios_are_checked():
    with pytest.raises(ValueError, match="sum to 1"):
        split_counts(10, (0.2, 0.2, 0.2))


# -- the head map file -----------------------------------------------------------------------------
def test_head_map_round_trip_and_resplit(tmp_path):
    v2v, t2v = torch.rand(4, 2), torch.rand(4, 2)
    head_map = HeadMap.build("m", "abc", v2v, t2v)
    path = tmp_path / "map.json"
    head_map.save(path)
    loaded = HeadMap.load(path)
    assert loaded == head_map and loaded.split == [1, 3, 4]
    assert loaded.bank_ids().tolist() == head_map.bank_id
    resplit = loaded.bank_ids((0.5, 0.5, 0.0))
    assert [int((resplit == b).sum()) for b in range(3)] == [4, 4, 0]


@pytest.mark.parametrize("content, message", [
    (None, "no head map at"),
    ("{not json", "not a readable head map"),
    ('{"model_id": "x"}', "is not an H2SVC head map"),
])
def test_bad_head_map_files_say_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "map.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        HeadMap.load(path)


def test_head_map_with_a_wrong_shape_is_refused(tmp_path):
    data = json.loads(json.dumps(HeadMap.build("m", "h", torch.rand(2, 2), torch.rand(2, 2)).__dict__))
    data["score"] = [[0.1, 0.2]]
    (tmp_path / "map.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'score' is not \\[2\\]\\[2\\]"):
        HeadMap.load(tmp_path / "map.json")


# -- the profiler on the tiny models -----------------------------------------------------------------
def reference_tads(attentions, units, first_question_token, num_frames):
    """TAD_V2V / TAD_T2V [layers, Hq] straight from transformers' attention maps, by loops."""
    layers, hq = len(attentions), attentions[0].shape[1]
    v2v, t2v = torch.zeros(layers, hq, dtype=torch.float64), torch.zeros(layers, hq, dtype=torch.float64)
    visual = [j for j in range(len(units)) if units[j] >= 0]
    for layer, attn in enumerate(attentions):
        for h in range(hq):
            per_frame = {i: [] for i in range(num_frames)}
            for row in visual:
                i = units[row]
                mass = [sum(attn[0, h, row, j].item() for j in visual if units[j] == f) for f in range(num_frames)]
                total = sum(mass)
                per_frame[i].append(sum((i - f) * m / total for f, m in enumerate(mass) if f <= i))
            v2v[layer, h] = sum(sum(d) / len(d) for d in per_frame.values()) / num_frames
            rows = range(first_question_token, len(units))
            values = []
            for row in rows:
                mass = [sum(attn[0, h, row, j].item() for j in visual if units[j] == f) for f in range(num_frames)]
                values.append(sum((num_frames - 1 - f) * m for f, m in enumerate(mass)) / sum(mass))
            t2v[layer, h] = sum(values) / len(values)
    return v2v, t2v


def test_profile_equals_tads_from_transformers_attention_weights(adapter):
    frames = list(world.world_frames(3 * adapter.frames_per_unit))
    question = "what moved?"
    recorder = AttentionRecorder(block_rows=5)
    recorder.setup(adapter.geometry())
    v2v, t2v = profile_video(adapter, recorder, frames, question, chunk_units=2)

    store = recorder.layers[0]
    units = store.units.tolist()
    newline = adapter.tokenizer("\n", add_special_tokens=False).input_ids
    question_ids = adapter.tokenizer(question, add_special_tokens=False).input_ids
    with torch.inference_mode():
        per_chunk = 2 * adapter.frames_per_unit
        video = [adapter.encode(adapter.preprocess(frames[s:s + per_chunk])) for s in range(0, len(frames), per_chunk)]
        embeds = torch.cat([adapter.embed_text(adapter.prefix_ids)[0], *video,
                            adapter.embed_text(newline)[0], adapter.embed_text(question_ids)[0]])[None]
    positions = store.positions
    pos = positions[:, None, :].long() if positions.shape[0] == 3 else positions.long()
    adapter.model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = adapter.text_model(inputs_embeds=embeds, position_ids=pos, use_cache=False, output_attentions=True)
    finally:
        adapter.model.set_attn_implementation("sdpa")
    ref_v2v, ref_t2v = reference_tads(out.attentions, units, len(units) - len(question_ids), 3)
    torch.testing.assert_close(v2v, ref_v2v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t2v, ref_t2v, atol=1e-5, rtol=1e-5)
    assert float(v2v.min()) >= 0 and float(v2v.max()) <= 2 and float(t2v.max()) <= 2


def test_cut_videos_makes_windows():
    sources = iter([list(range(10)), list(range(3))])
    assert cut_videos(sources, 4, 5) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2]]


class _Image:  # a sensor_msgs/Image as the bag reader gives it
    def __init__(self, pixels, encoding, pad=0):
        self.height, self.width = pixels.shape[:2]
        channels = 1 if pixels.ndim == 2 else pixels.shape[2]
        self.encoding, self.step = encoding, self.width * channels + pad
        rows = pixels.reshape(self.height, -1)
        self.data = np.concatenate([rows, np.zeros((self.height, pad), np.uint8)], axis=1).reshape(-1)


def test_image_messages_convert_with_row_padding():
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert np.array_equal(image_message_to_rgb(_Image(rgb, "rgb8", pad=3), "sensor_msgs/msg/Image"), rgb)
    assert np.array_equal(image_message_to_rgb(_Image(rgb[..., ::-1].copy(), "bgr8"), "sensor_msgs/msg/Image"), rgb)
    mono = rgb[..., 0].copy()
    assert np.array_equal(image_message_to_rgb(_Image(mono, "mono8", pad=1), "sensor_msgs/msg/Image"),
                          np.repeat(mono[..., None], 3, axis=2))
    with pytest.raises(ValueError, match="'yuv422' is not supported"):
        image_message_to_rgb(_Image(rgb, "yuv422"), "sensor_msgs/msg/Image")


def _write_bag(path, frames, fps):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    image_t, header_t, time_t = (store.types[n] for n in
                                 ("sensor_msgs/msg/Image", "std_msgs/msg/Header", "builtin_interfaces/msg/Time"))
    with Writer(path, version=9) as writer:
        conn = writer.add_connection("/camera/image_raw", image_t.__msgtype__, typestore=store)
        for i, frame in enumerate(frames):
            stamp = 100.0 + i / fps
            bgr = np.ascontiguousarray(frame[..., ::-1])
            msg = image_t(header=header_t(stamp=time_t(sec=int(stamp), nanosec=int(round(stamp % 1 * 1e9))),
                                          frame_id="cam"),
                          height=frame.shape[0], width=frame.shape[1], encoding="bgr8", is_bigendian=0,
                          step=frame.shape[1] * 3, data=bgr.reshape(-1))
            writer.write(conn, int(stamp * 1e9), store.serialize_cdr(msg, image_t.__msgtype__))


def test_profile_command_on_a_rosbag(tmp_path):
    bag = tmp_path / "bag"
    _write_bag(bag, list(world.world_frames(12)), fps=2.0)  # sampled at 1 fps: frames 0, 2, 4, ...
    out = tmp_path / "map.json"
    assert main(["--model", "tiny-llava_onevision", "--input", str(bag), "--output", str(out), "--units", "3",
                 "--videos", "4", "--device", "cpu", "--dtype", "float32"]) == 0
    head_map = HeadMap.load(out)
    assert head_map.model_id == "tiny-llava_onevision" and head_map.split == [1, 3, 4]
    assert head_map.profile["videos"] == 2 and head_map.profile["frames_per_video"] == [3, 3]
    assert len(head_map.tad_v2v_std) == 4


def test_profile_command_on_frame_folders_and_a_gif(tmp_path):
    frames = list(world.world_frames(8))
    for video in ("a", "b"):
        (tmp_path / "videos" / video).mkdir(parents=True)
        for i, frame in enumerate(frames):
            Image.fromarray(frame).save(tmp_path / "videos" / video / f"{i:03d}.png")
    Image.fromarray(frames[0]).save(tmp_path / "videos" / "c.gif", save_all=True,
                                    append_images=[Image.fromarray(f) for f in frames[1:]])
    out = tmp_path / "map.json"
    assert main(["--model", "tiny-qwen2_5_vl", "--input", str(tmp_path / "videos"), "--output", str(out),
                 "--units", "2", "--device", "cpu", "--dtype", "float32"]) == 0
    head_map = HeadMap.load(out)
    # 8 frames per source = 2 videos of 2 units (4 frames) each, three sources
    assert head_map.profile["videos"] == 6 and head_map.profile["units_per_video"] == [2] * 6


def test_profile_command_entry_point_reports_bad_input(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "-m", "streamcache_ros.tools.profile_heads", "--input",
                           str(tmp_path / "nothing"), "--output", str(tmp_path / "x.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    missing = tmp_path / "nothing"
    assert done.stderr.strip().splitlines()[-1] == f"streamcache-profile: --input '{missing}' does not exist"


def test_resplit_makes_the_banks_again_and_a_map_with_bad_ratios_is_refused(tmp_path):
    head_map = HeadMap.build("m", "abc", torch.rand(4, 2), torch.rand(4, 2))
    again = head_map.resplit([0.0, 0.25, 0.75])
    assert again.split == [0, 2, 6] and again.ratios == [0.0, 0.25, 0.75]
    assert again.bank_id == again.bank_ids(again.ratios).tolist() and again.score == head_map.score
    again.save(tmp_path / "map.json")
    assert HeadMap.load(tmp_path / "map.json") == again
    text = (tmp_path / "map.json").read_text().replace('"ratios": [\n  0.0,', '"ratios": [\n  0.5,')
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(ValueError, match="bad.json.*sum to 1"):
        HeadMap.load(tmp_path / "bad.json")


def test_profile_cli_splits_a_map_again_without_a_model(tmp_path):
    from streamcache_ros.tools.profile_heads import main

    HeadMap.build("m", "abc", torch.rand(4, 2), torch.rand(4, 2)).save(tmp_path / "map.json")
    out = tmp_path / "again.json"
    assert main(["--resplit", str(tmp_path / "map.json"), "--ratios", "0", "0", "1", "--output", str(out)]) == 0
    assert HeadMap.load(out).split == [0, 0, 8]
    assert main(["--resplit", str(tmp_path / "missing.json"), "--output", str(out)]) == 2
