"""The evidence scripts run on toy settings and write what the docs read (so they do not rot):
bench/evidence_layers.py, bench/evidence_cost.py, bench/retention_map.py. No time is asserted."""
from test_bench_smoke import load, run_script


def test_evidence_layers_chooses_a_contiguous_range(tmp_path):
    run_script("evidence_layers.py", "--model", "tiny-qwen2_5_vl", "--streams", "1", "--frames", "24",
               "--size", "160x120", "--out", str(tmp_path))
    data = load(tmp_path / "evidence_layers-tiny-qwen2_5_vl.json")
    assert data["questions"] == data["chosen"]["n"] > 0 and data["seeds"][0] == 100_000_000
    layers = data["chosen"]["layers"]
    assert layers == list(range(layers[0], layers[-1] + 1)) and len(data["per_layer"]) == 4
    assert data["chosen"]["hits"] == max(r["hits"] for r in data["ranges"])


def test_evidence_cost_compares_answers_with_and_without(tmp_path):
    run_script("evidence_cost.py", "--models", "tiny-llava_onevision", "--lengths", "16", "--questions", "1",
               "--new-tokens", "4", "--real-lengths", "256", "--repeats", "2", "--out", str(tmp_path))
    data = load(tmp_path / "evidence_cost.json")
    assert {r["policy"] for r in data["tiny"]} == {"full", "fifo", "uniform", "hermes", "h2svc"}
    assert all(r["ratio_default"] > 0 and r["ratio_all"] > 0 and len(r["answer_tokens"]) == 1 for r in data["tiny"])
    assert data["real_shapes"][0]["cached_tokens"] == 256 and data["real_shapes"][0]["ratio"] > 0


def test_retention_map_draws_every_policy(tmp_path):
    figure = tmp_path / "map.png"
    run_script("retention_map.py", "--frames", "24", "--size", "160x120", "--figure", str(figure), "--out",
               str(tmp_path))
    data = load(tmp_path / "retention_map.json")
    assert figure.stat().st_size > 0
    panels = data["panels"]
    assert {"full", "fifo", "uniform", "hermes", "h2svc"} <= set(panels)
    assert panels["full"]["frames_held"][-1] == 24 and panels["full"]["mean_kept"][-1] == 1.0
    assert len(data["looked_at"]) == 3 and all(len(p["last"]) == 24 for p in panels.values())


def test_accuracy_scores_last_seen_by_when_and_the_evidence_beside_it(tmp_path):
    run_script("accuracy.py", "--model", "tiny-qwen2_5_vl", "--lengths", "32", "--short-streams", "2",
               "--per-kind", "1", "--max-new-tokens", "3", "--no-node", "--windowed", "0", "--policies", "full", "h2svc",
               "--out", str(tmp_path), timeout=900)
    data = load(tmp_path / "accuracy-tiny-qwen2_5_vl.json")
    assert all(r["kind"] not in ("last_seen", "first_seen") for r in data["records"])  # apart from the option kinds
    timed = data["time_records"]
    by_when = [r for r in timed if r["kind"] == "last_seen"]
    by_evidence = [r for r in timed if r["kind"] == "last_seen_evidence"]
    assert by_when and len(by_evidence) == len(by_when)  # every last_seen asked both ways
    assert {r["policy"] for r in by_when} == {"full", "h2svc"}
    for r in by_when + by_evidence:
        said = r["said_stamp"]
        assert r["correct"] == (said is not None and abs(said - r["truth_stamp"]) <= 2.0)
    assert all(r["questions_asked"] >= 1 for r in by_when)
    assert data["time"]["32|full|full|last_seen"]["n"] == len(by_when) // 2
