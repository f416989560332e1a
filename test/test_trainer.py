"""The world-model trainer's bookkeeping (scripts/train_world_model.py): a checkpoint resumes at its
point of the schedule on any device, and streams rendered by worker processes are the ones the
trainer would have rendered itself, in the same order."""
from __future__ import annotations

import importlib
import pathlib
import sys
import types

import numpy as np
import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "train_world_model.py"


@pytest.fixture(scope="module")
def trainer():
    # imported by name from sys.path, so worker processes (spawned) find the function they run
    sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("train_world_model")


def run_on(trainer, device: str, threads: int = 1):
    run = trainer.Run.__new__(trainer.Run)
    run.args = types.SimpleNamespace(threads=threads)
    run.on_gpu, run.deadline = device == "cuda", None
    return run


def test_a_checkpoint_resumes_at_its_progress_under_another_budget(trainer):
    """Saved at 60% of a 90-minute CPU schedule, resumed on a GPU given 10 minutes: 60% again,
    so the learning rate goes on from where it was."""
    budget = run_on(trainer, "cuda").budget(10.0, {"used": 0.6 * 90 * 60, "progress": 0.6})
    assert budget.progress == pytest.approx(0.6, abs=0.01)
    assert budget.seconds == 600


def test_an_old_checkpoint_without_progress_resumes_by_seconds(trainer):
    budget = run_on(trainer, "cpu", threads=2).budget(10.0, {"used": 300.0})
    assert budget.progress == pytest.approx(300 / 1200, abs=0.01)


def test_the_warm_up_starts_again_with_a_fresh_optimizer(trainer):
    """lr_at counts warm-up steps from where Adam started: a resumed run without its moments
    starts low again, one with them goes on at the schedule's rate."""
    assert trainer.lr_at(3e-4, 0, 0.6) < 0.02 * trainer.lr_at(3e-4, 5000, 0.6)


def test_the_long_curriculum_draws_long_streams_from_the_start(trainer):
    """At the start of a run "grow" stays at 16 frames or fewer; "long" draws half its streams from
    128-512 frames and never past 512."""
    rng = np.random.default_rng(0)
    grow = [trainer.stream_length(rng, 0.0, "grow") for _ in range(400)]
    long = [trainer.stream_length(rng, 0.0, "long") for _ in range(400)]
    assert max(grow) <= 16
    assert min(long) >= 4 and max(long) <= 512
    assert 0.4 < np.mean([n >= 128 for n in long]) < 0.75


def test_the_long_curriculum_asks_the_rare_kinds_more(trainer):
    """From one pool of questions, one of each kind, the kinds weighted up under "long" are picked
    more often than under "grow", and now_count less than the rest under both."""
    pool = [types.SimpleNamespace(kind=k) for k in trainer.TRAINED_KINDS]
    rare = ("before_color", "moved", "first_shape")

    def shares(curriculum):
        rng = np.random.default_rng(0)
        picked = [q.kind for _ in range(2000)
                  for q in trainer._pick(rng, pool, 3, trainer.KIND_WEIGHTS[curriculum])]
        return np.mean([k in rare for k in picked]), np.mean([k == "now_count" for k in picked])
    (rare_grow, count_grow), (rare_long, count_long) = shares("grow"), shares("long")
    assert rare_long > rare_grow + 0.05
    assert count_grow < 0.9 / len(pool) and count_long < 0.9 / len(pool)  # 1 / len(pool) if unweighted


@pytest.mark.timeout(300)
def test_workers_render_the_same_streams_in_the_same_order(trainer):
    serial = trainer.StreamFeed(trainer.TRAIN_SEED, 1, workers=0)
    parallel = trainer.StreamFeed(trainer.TRAIN_SEED, 1, workers=1)
    try:
        for _ in range(3):
            frames_a, asked_a, _ = serial.take(0.0)
            frames_b, asked_b, _ = parallel.take(0.0)
            assert serial.last_seed == parallel.last_seed
            assert len(frames_a) == len(frames_b)
            assert all(np.array_equal(a, b) for a, b in zip(frames_a, frames_b))
            assert [(q.after_frames, q.text, q.answer, q.window) for q in asked_a] == \
                   [(q.after_frames, q.text, q.answer, q.window) for q in asked_b]
    finally:
        parallel.close()


def test_a_slim_checkpoint_keeps_the_model_and_states_its_progress(tmp_path):
    """scripts/slim_checkpoint.py drops the optimizer and writes the progress the trainer resumes at."""
    import subprocess  # noqa: PLC0415

    model = {"w": torch.arange(6.0)}
    torch.save({"model": model, "head": {"h": torch.ones(2)}, "optimizer": {"state": {}, "param_groups": []},
                "state": {"step": 40, "streams": 80, "used": 1350.0}}, tmp_path / "full.pt")
    subprocess.run([sys.executable, str(SCRIPT.parent / "slim_checkpoint.py"), str(tmp_path / "full.pt"),
                    str(tmp_path / "slim.pt"), "--minutes", "90", "--threads", "1"], check=True)
    slim = torch.load(tmp_path / "slim.pt", weights_only=False)
    assert "optimizer" not in slim
    assert torch.equal(slim["model"]["w"], model["w"])
    assert slim["state"]["progress"] == pytest.approx(1350 / 5400)
