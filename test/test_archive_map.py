"""``streamcache-archive map`` and the sheet limited to a place (tools/archive_map.py; docs/places.md
"A picture of where"): a patrol archived by the engine with every frame's pose, drawn as a path; with
a question the sightings the index finds lie where the truth says the identity was seen; a place
keeps only the frames taken inside it; what cannot be drawn is refused with one line."""
from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.places import Pose, PoseTrack
from streamcache_ros.tools.archive_cli import main
from streamcache_ros.tools.archive_map import NO_POSE
from streamcache_ros.world.patrol import places_yaml

SEED = 800_000_353  # the tests' seed range (docs/world-models.md)
FRAMES = 240
PARAMS = {"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48}


def archive(folder, stream, frames: int, posed: bool = True, **params) -> str:
    session = build_session({**PARAMS, **params, "archive_path": str(folder)})
    if posed:
        session.memory.poses = track = PoseTrack(tolerance=0.6)
    for i in range(frames):
        if posed:
            x, y, yaw = stream.pose(i)
            track.add(stream.stamp(i), Pose.planar(x, y, yaw, "map"))
        session.add_frame(stream.frame(i), stream.stamp(i))
    session.close_archive()
    return str(folder)


@pytest.fixture(scope="module")
def patrol(tmp_path_factory):
    root = tmp_path_factory.mktemp("map")
    stream = world.make_patrol_stream(SEED, FRAMES, question_points=[FRAMES])
    places = root / "places.yaml"
    places.write_text(places_yaml(stream.places))
    return archive(root / "archive", stream, FRAMES), stream, str(places)


def drawn(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def posed_count(out: str) -> int:
    return int(re.search(r"(\d+) posed frame\(s\)", out).group(1))


def near(image: Image.Image, colour: tuple[int, int, int], tolerance: int = 30) -> int:
    pixels = np.asarray(image.convert("RGB")).astype(int)
    return int((np.abs(pixels - np.array(colour)).max(axis=-1) <= tolerance).sum())


def test_map_draws_the_path_and_the_places(patrol, tmp_path, capsys):
    folder, _, places = patrol
    out = tmp_path / "path.png"
    code, said, err = drawn(capsys, "map", "--archive", folder, "--out", str(out), "--places", places)
    assert code == 0, err
    assert "frame 'map'" in said and 200 <= posed_count(said) <= FRAMES
    image = Image.open(out)
    assert image.format == "PNG" and image.size == (800, 800)
    assert near(image, (31, 119, 180)) > 300  # the path's line
    code, said, err = drawn(capsys, "map", "--archive", folder, "--out", str(out), "--size", "640", "480",
                            "--since", "20", "--until", "80")
    assert code == 0, err
    assert Image.open(out).size == (640, 480) and posed_count(said) == 61


def test_map_marks_the_sightings_where_the_truth_saw_the_identity(patrol, tmp_path, capsys):
    folder, stream, places = patrol
    code, said, err = drawn(capsys, "map", "--archive", folder, "--out", str(tmp_path / "p.png"))
    archived = posed_count(said)
    seen = {v.identity for views in stream.truth[:archived] for v in views}
    identity = next((i for i in sorted(seen) if sum(i in {v.identity for v in views} for views in
                                                     stream.truth[:archived]) >= 4), None)
    if identity is None:
        pytest.fail(f"stream {SEED} shows no identity in 4 frames: draw another seed")
    shape, colour = identity
    last = stream.last_seen(identity, archived)
    out = tmp_path / "seen.png"
    code, said, err = drawn(capsys, "map", "--archive", folder, "--out", str(out), "--identity", f"{colour} {shape}",
                            "--places", places)
    assert code == 0, err
    newest = float(re.search(r"newest sighting at ([0-9.]+)", said).group(1))
    assert abs(newest - stream.stamp(last)) <= 2.0, said
    x, y = (float(v) for v in re.search(r"newest sighting at [0-9.]+ \((-?[0-9.]+), (-?[0-9.]+)\)", said).groups())
    assert np.hypot(x - stream.pose(last)[0], y - stream.pose(last)[1]) < 1.0
    image = Image.open(out)
    assert image.size == (800, 800) and near(image, (0x7B, 0x2C, 0xBF), 20) > 20  # the sighting marks
    question = world.SEEN_PROBE.format(colour=colour, shape=shape)
    code, again, err = drawn(capsys, "map", "--archive", folder, "--out", str(out), "--question", question)
    assert code == 0 and f"newest sighting at {newest:.3f}" in again


def test_the_sheet_limited_to_a_place_holds_only_its_frames(patrol, tmp_path, capsys):
    folder, stream, places = patrol
    code, said, err = drawn(capsys, "map", "--archive", folder, "--out", str(tmp_path / "p.png"))
    archived = posed_count(said)

    def inside(place, i) -> bool:
        x, y, _ = stream.pose(i)
        return np.hypot(x - place.x, y - place.y) <= place.radius + 1e-6
    counts = {p.name: sum(inside(p, i) for i in range(archived)) for p in stream.places}
    place = next(p for p in stream.places if counts[p.name] == max(counts.values()))
    out = tmp_path / "sheet.png"
    for where in (["--place", place.name, "--places", places], ["--place-at", str(place.x), str(place.y),
                                                                  str(place.radius)]):
        code, said, err = drawn(capsys, "sheet", "--archive", folder, str(out), "--max-frames", "500", *where)
        assert code == 0, err
        assert "inside " in said and (f"'{place.name}'" in said) == (where[0] == "--place")
        stamps = [float(s) for s in re.search(r"^stamps: (.*)$", said, re.MULTILINE).group(1).split()]
        indices = [round(s - stream.stamp(0)) for s in stamps]
        assert len(stamps) == counts[place.name] and all(inside(place, i) for i in indices)
        assert Image.open(out).format == "PNG"


def test_what_cannot_be_drawn_is_refused_with_one_line(patrol, tmp_path, capsys):
    folder, stream, places = patrol
    out = str(tmp_path / "x.png")
    code, _, err = drawn(capsys, "map", "--archive", str(tmp_path), "--out", out)
    assert code == 2 and "not a streamcache archive" in err
    code, said, err = drawn(capsys, "sheet", "--archive", folder, out, "--place-at", "300", "300", "1")
    assert code == 2 and "never within 1 m of (300, 300)" in err and "nearest it came was" in err
    code, said, err = drawn(capsys, "sheet", "--archive", folder, out, "--place", "moon", "--places", places)
    assert code == 2 and "unknown place 'moon'" in err
    code, said, err = drawn(capsys, "sheet", "--archive", folder, out, "--place", stream.places[0].name)
    assert code == 2 and "needs --places" in err
    # an archive written with no pose source, and one with poses but no index
    unposed = archive(tmp_path / "unposed", stream, 16, posed=False)
    code, said, err = drawn(capsys, "map", "--archive", unposed, "--out", out)
    assert code == 1 and NO_POSE in err and len(err.strip().splitlines()) == 1
    code, said, err = drawn(capsys, "sheet", "--archive", unposed, out, "--place-at", "0", "0", "1")
    assert code == 2 and NO_POSE in err
    unindexed = archive(tmp_path / "unindexed", stream, 16, retrieval_model_path="off")
    code, said, err = drawn(capsys, "map", "--archive", unindexed, "--out", out)
    assert code == 0, err
    code, said, err = drawn(capsys, "map", "--archive", unindexed, "--out", out, "--identity", "red circle")
    assert code == 2 and "no index" in err and len(err.strip().splitlines()) == 1
