"""Calibrating the index (engine/recall/index/calibration.py; docs/archive.md "Calibrating the
index"): every dual encoder is checked on the calibration set the node ships, its scale and bias kept
when they hold there and fitted when not; an encoder that cannot be trusted never makes a silent "not
found": the window is walked, and what was not read is said. Encoders other than the bundled one: tiny
random CLIP and SigLIP of real classes, the bundled one with its bias or temperature set far off."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL, resolve_retrieval_path
from streamcache_ros.engine.recall.index import RetrievalEncoder
from streamcache_ros.engine.recall.index.calibration import (CALIBRATION_FILE, FALSE_YES_LIMIT, RECALL_TARGET,
                                                             CalibrationSet, check, fit)
from streamcache_ros.tools.other_encoders import shifted_encoder, tiny_dual_encoder
from test_when_index import archived, probe

BUNDLED = RETRIEVAL_DIR / WORLD_RETRIEVAL
SEED = 800_000_345  # the tests' seed range (docs/world-models.md): no training run draws it
FRAMES = 96


@pytest.fixture(scope="module")
def calibration_set():
    return CalibrationSet.load(RETRIEVAL_DIR / CALIBRATION_FILE)


def shifted(folder, **settings):
    """The bundled encoder with its scale or bias set to something else (its weights as they are)."""
    return RetrievalEncoder.load(str(shifted_encoder(folder, **settings)))


# -- the rules, on arrays ---------------------------------------------------------------------------
def test_a_threshold_in_the_gap_keeps_every_positive_and_lets_no_negative_through():
    rng = np.random.default_rng(0)
    truth = rng.random((200, 6)) < 0.2
    cosines = np.where(truth, rng.uniform(0.4, 0.6, truth.shape), rng.uniform(-0.2, 0.2, truth.shape))
    calibration = fit(cosines, truth)
    assert 0.2 < calibration.threshold < 0.4 and calibration.trusted
    assert check(cosines, truth, calibration.threshold) == (1.0, 0.0, 1.0)


def test_an_encoder_whose_scores_do_not_tell_positives_from_negatives_is_not_trusted():
    rng = np.random.default_rng(1)
    truth = rng.random((200, 6)) < 0.2
    calibration = fit(rng.normal(size=truth.shape), truth)
    assert calibration.recall >= RECALL_TARGET and calibration.false_yes > FALSE_YES_LIMIT
    assert not calibration.trusted


def test_one_identity_it_cannot_find_is_enough_not_to_trust_it():
    rng = np.random.default_rng(2)
    truth = rng.random((400, 6)) < 0.2
    cosines = np.where(truth, rng.uniform(0.4, 0.6, truth.shape), rng.uniform(-0.2, 0.2, truth.shape))
    cosines[:, 5] = rng.uniform(-0.2, 0.2, 400)  # the last identity's frames look like any other
    calibration = fit(cosines, truth)
    assert calibration.worst_recall < 0.9 and not calibration.trusted


# -- real encoders on the shipped calibration set ---------------------------------------------------
def test_the_bundled_encoder_keeps_its_own_numbers_and_is_trusted_on_the_shape_world(calibration_set):
    encoder = RetrievalEncoder.load(str(BUNDLED))
    calibration = encoder.calibrate(calibration_set, shape_world=True)
    assert calibration.source == "own" and encoder.trusted and calibration.recall >= RECALL_TARGET
    assert "trusted" in encoder.describe() and encoder.identity.startswith("world-retrieval@")
    # the same encoder behind a real model's cameras: the shape world says little of those
    other = RetrievalEncoder.load(str(BUNDLED))
    other.calibrate(calibration_set, shape_world=False)
    assert not other.trusted and "not trusted" in other.describe()


@pytest.mark.parametrize("settings", [{"bias": -20.0}, {"bias": 5.0}, {"scale": 2.0}, {"scale": 400.0, "bias": -200.0}])
def test_a_bias_or_temperature_set_far_off_is_fitted_back_and_ranks_as_before(settings, calibration_set, tmp_path):
    own = RetrievalEncoder.load(str(BUNDLED))
    own.calibrate(calibration_set, shape_world=True)
    off = shifted(tmp_path / "shifted", **settings)
    calibration = off.calibrate(calibration_set, shape_world=True)
    assert calibration.source == "fitted" and off.trusted and calibration.replaced
    # the same weights: the same vectors, the same index, whatever the folder's name
    assert off.identity.split("@")[1] == own.identity.split("@")[1]
    vectors = off.embed_frames(calibration_set.frames[:40])
    query = off.embed_texts(calibration_set.texts)
    said = off.probability(vectors @ query.T) >= 0.5
    assert (said == (own.probability(vectors @ query.T) >= 0.5)).mean() >= 0.98


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_a_tiny_random_encoder_is_not_trusted(kind, calibration_set, tmp_path):
    encoder = RetrievalEncoder.load(str(tiny_dual_encoder(kind, tmp_path / kind)))
    encoder.calibrate(calibration_set, shape_world=True)
    assert not encoder.trusted and encoder.calibration.source == "fitted"


def test_two_encoders_in_folders_of_one_name_are_two_indexes(tmp_path):
    import torch
    from transformers import CLIPModel

    first = tiny_dual_encoder("clip", tmp_path / "a" / "retrieval")
    second = tmp_path / "b" / "retrieval"
    shutil.copytree(first, second)
    model = CLIPModel.from_pretrained(second)
    with torch.no_grad():
        model.visual_projection.weight.mul_(-1.0)  # other weights, other vectors
    model.save_pretrained(second)
    one, other = RetrievalEncoder.load(str(first)), RetrievalEncoder.load(str(second))
    assert one.identity != other.identity and one.model_id == other.model_id == "retrieval"


def test_a_folder_whose_weights_do_not_fit_its_config_is_refused_naming_the_parameter(tmp_path):
    from streamcache_ros.engine.errors import ConfigError

    folder = tiny_dual_encoder("clip", tmp_path / "clip")
    config = json.loads((folder / "config.json").read_text())
    config["projection_dim"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="retrieval_model_path.*cannot be loaded"):
        RetrievalEncoder.load(str(folder))


@pytest.mark.parametrize("off", ["off", "none", "OFF", "", "false"])
def test_the_index_turns_off_by_a_word_a_shell_can_pass(off, tmp_path):
    assert resolve_retrieval_path(off, "world-qwen2_5_vl") == ""
    session = build_session({"model_path": "world-qwen2_5_vl", "archive_path": str(tmp_path), "retrieval_model_path": off})
    assert session.status().index is None
    session.close_archive()


# -- an index that cannot be trusted never answers "not found" silently -----------------------------
@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


@pytest.mark.parametrize("walk_chunks", [16, 3])
def test_an_untrusted_index_walks_and_says_what_it_did_not_read(walk_chunks, stream, tmp_path):
    encoder = RetrievalEncoder.load(str(tiny_dual_encoder("clip", tmp_path / "clip")))
    session = archived(tmp_path / "archive", encoder)
    assert session.status().index is not None and not session.status().index.trusted
    session.desk.moment.walk_chunks = walk_chunks
    for i in range(FRAMES):
        session.add_frame(stream.frame(i), stream.stamp(i))
    session.flush()
    seen = sorted({v.identity for views in stream.truth for v in views})
    incomplete = 0
    for identity in seen[:4]:
        truth = stream.identity_frames(identity, FRAMES)
        found = session.when(probe(identity), "last")
        incomplete += not found.search_complete
        if found.found:
            assert found.found_by in ("index", "walk")
        else:  # never silent: what could hold it and was not read is said
            assert found.found_by == "index_unsure" and not found.search_complete, found
            assert walk_chunks < FRAMES // 8
        if found.found and found.search_complete:
            assert abs(found.stamp - stream.stamp(truth[-1])) <= 8.0  # the newest chunk that shows it
    assert session.status().index.incomplete_answers == incomplete  # counted for /diagnostics
    if walk_chunks >= FRAMES // 8:  # a walk that reaches every chunk reads the whole window
        assert incomplete == 0
    session.close_archive()


def test_the_search_bounds_are_parameters_checked_at_start(tmp_path):
    from streamcache_ros.engine.errors import ConfigError

    session = build_session({"model_path": "world-qwen2_5_vl", "archive_path": str(tmp_path / "a"),
                             "when_verify_chunks": 2, "when_walk_chunks": 5})
    assert (session.desk.moment.verify_chunks, session.desk.moment.walk_chunks) == (2, 5)
    session.close_archive()
    for name, value in (("when_verify_chunks", 0), ("when_walk_chunks", -1)):
        with pytest.raises(ConfigError, match=name):
            build_session({"model_path": "world-qwen2_5_vl", "archive_path": "off", name: value})


def test_what_a_walk_has_left_is_read_off_the_scores_in_the_search_order():
    """moment._beyond on plain arrays: the window's chunks not yet read, newer (last) / older (first)
    than the moment found, the first ``limit`` in order and how many there are."""
    from streamcache_ros.engine.memory.ledger import Window
    from streamcache_ros.engine.questions.moment import _beyond, _Search
    from streamcache_ros.engine.recall.index import FrameScores
    from streamcache_ros.engine.status import WhenAnswer

    stamps = np.arange(40.0)
    scores = FrameScores(stamps, np.repeat(np.arange(1, 6), 8), np.zeros(40), np.array(["/cam"] * 40, dtype=object))
    inside = np.ones(40, bool)
    found = WhenAnswer(True, 12.0, "/cam", 0.9, [], [], 1, 0.0, 40)
    last = _Search(Window(), "last", 0.0)
    rows, total = _beyond(scores, inside, found, {2}, last, limit=2)
    assert [r.chunk_id for r in rows] == [5, 4] and total == 3 and rows[0].stamps == list(range(32, 40))
    first = _Search(Window(), "first", 0.0)
    rows, total = _beyond(scores, inside, WhenAnswer(True, 20.0, "/cam", 0.9, [], [], 1, 0.0, 40), {1}, first, 10)
    assert [r.chunk_id for r in rows] == [2, 3] and total == 2  # older than 20: chunks 1 (read), 2, and 3 (16..23)
    rows, total = _beyond(scores, inside, None, set(), last, limit=10, only={1, 3})
    assert [r.chunk_id for r in rows] == [3, 1] and total == 2
