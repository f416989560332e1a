"""The soak (bench/soak.py), short: 160 frames replayed lock-step into a real node while two client
processes (the Ask service and the Ask action) ask a question about every second. Nothing lost,
nothing answered twice, every frame taken before a question is in memory for it, a due chunk never
waits for more than the question in progress, the cache flat once full, every process gone after SIGINT.
(The long run, thousands of frames, gives the README's figures.) Timeouts only guard against hangs."""
import json
import subprocess
import sys

from node_procs import ROOT, child_env, new_domain


def test_a_short_soak_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--frames", "160", "--question-period", "1",
                           "--budget-units", "16", "--json", str(out)], cwd=ROOT, env=child_env(new_domain()),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ok"] and result["failures"] == []
    frames, questions, ingest, memory = result["frames"], result["questions"], result["ingest"], result["memory"]
    assert (frames["published"], frames["sampled"], frames["dropped"], frames["rejected"]) == (160, 160, 0, 0)
    assert frames["chunks_failed"] == 0 and frames["acknowledged"] >= 160
    assert all(n >= 3 for n in questions["per_client"].values()), questions
    assert questions["sent"] == questions["answered"] == questions["node_answered"]
    assert (questions["refused"], questions["lost"], questions["answered_twice"]) == (0, 0, 0)
    assert questions["history_ids_checked"] >= 1
    assert ingest["order_violations"] == 0 and 0 <= ingest["most_questions_a_chunk_waited_for"] <= 1
    assert ingest["acks_while_a_question_ran"] > 0  # frames kept coming in while questions were answered
    assert memory["kv_slope_bytes_per_1000_frames"] == 0  # the budget is full after 32 frames: flat
    assert result["processes"]["node_exit_after_sigint"] == 0 and result["processes"]["processes_left"] == []
    assert "| questions sent / answered / refused / lost / answered twice |" in done.stdout


def test_a_short_hour_through_the_launch(tmp_path):
    """bench/hour_soak.py, short: a world stream in bags of 32 frames replayed into the node that
    `ros2 launch` started (console entries where it cannot run this checkout), questions after each
    bag scored against the truth, the when service among them; memory flat, no chunk failed, a clean
    exit, the plot written."""
    out, figure = tmp_path / "hour.json", tmp_path / "hour.png"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "hour_soak.py"), "--frames", "96", "--segment", "32",
                           "--json", str(out), "--figure", str(figure)], cwd=ROOT, env=child_env(new_domain()),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert all(result["checks"].values()) and result["exit_code"] == 0
    assert [p["frames"] for p in result["points"]] == [32, 64, 96]
    assert all(p["chunks_failed"] == 0 and p["process_rss_bytes"] > 0 for p in result["points"])
    kinds = {a["kind"] for a in result["answers"]}
    assert kinds & {"last_seen", "first_seen"} and kinds - {"last_seen", "first_seen"}  # when and Ask both asked
    assert all(a["correct"] == (a["said"] == a["truth"]) for a in result["answers"] if a["kind"] not in
               ("last_seen", "first_seen"))
    assert figure.stat().st_size > 0
