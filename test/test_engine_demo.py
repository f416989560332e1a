"""streamcache-demo (the engine alone): the demo's world stream through a session, the world's
questions answered beside the truth (docs/interfaces.md)."""
from streamcache_ros.tools import engine_demo


def test_the_engine_demo_answers_the_worlds_questions(capsys):
    assert engine_demo.main(["--frames", "16", "--model", "tiny-qwen2_5_vl", "--policy", "fifo"]) == 0
    out = capsys.readouterr().out
    assert "world seed" in out and "16 frames" in out
    asked = out.count("\nQ: ") + out.startswith("Q: ")
    assert asked >= 1 and out.count("truth: ") == asked
    assert f"/{asked} of the world's questions" in out


def test_a_stream_length_the_world_refuses_is_an_error(capsys):
    assert engine_demo.main(["--frames", "4000", "--model", "tiny-qwen2_5_vl"]) == 2
    assert "1..3600 frames" in capsys.readouterr().err
