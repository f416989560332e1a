"""Where: poses read at a frame's stamp, places, and the poses the archive keeps with its frames
(docs/places.md). No model, no ROS."""
from __future__ import annotations

import dataclasses
import math
import sqlite3

import pytest
import torch

from streamcache_ros.engine.places import Place, PlaceError, Pose, PoseTrack, load_places
from streamcache_ros.engine.places.place import resolve_place
from streamcache_ros.engine.recall.archive import DB_NAME, Archive, ArchiveSettings, EncodedChunk
from streamcache_ros.engine.recall.archive.sqlite_file import SCHEMA

IDENTITY = {"model_id": "test/model", "layers": 2}


def posed_chunk(index: int, path, camera: str = "/cam", frames: int = 4) -> EncodedChunk:
    """A chunk of ``frames`` frames stamped index*frames.. whose poses ``path(stamp)`` gives (None: no pose)."""
    stamps = [float(index * frames + i) for i in range(frames)]
    poses = [None if path(s) is None else Pose.planar(*path(s)).as_list() for s in stamps]
    return EncodedChunk(camera, stamps, [(2 * u, 2 * u + 1) for u in range(frames // 2)], 2,
                        torch.zeros(frames, 8), torch.zeros(3, frames), poses=poses, pose_frame="map")


def walk_east(stamp):  # 1 m/s along x
    return stamp, 0.0, 0.0


def test_a_pose_between_two_is_interpolated_and_one_too_far_is_none():
    track = PoseTrack(tolerance=0.5)
    track.add(10.0, Pose.planar(0.0, 0.0, 0.0, "map"))
    track.add(10.4, Pose.planar(0.4, 0.2, math.pi / 2, "map"))
    half = track.at(10.2)
    assert half.x == pytest.approx(0.2) and half.y == pytest.approx(0.1)
    assert half.yaw == pytest.approx(math.pi / 4, abs=1e-6) and half.frame_id == "map"
    assert track.at(10.8).x == pytest.approx(0.4)  # the nearest within the tolerance
    assert track.at(11.0) is None and track.at(9.0) is None  # none close enough: the frame says so
    assert track.at(10.4).yaw == pytest.approx(math.pi / 2)


def test_yaw_interpolates_the_short_way_round():
    track = PoseTrack(tolerance=1.0)
    track.add(0.0, Pose.planar(0, 0, math.radians(170)))
    track.add(1.0, Pose.planar(0, 0, math.radians(-170)))
    assert abs(math.degrees(track.at(0.5).yaw)) == pytest.approx(180, abs=1e-4)


def test_a_late_pose_is_kept_in_order():
    track = PoseTrack(tolerance=1.0)
    for stamp in (0.0, 2.0, 1.0):
        track.add(stamp, Pose.planar(stamp, 0, 0))
    assert track.out_of_order == 1
    assert track.at(1.5).x == pytest.approx(1.5)


def test_places_file_and_requests(tmp_path):
    path = tmp_path / "places.yaml"
    path.write_text("frame_id: map\nplaces:\n  kitchen: {x: 1.5, y: -2, radius: 2}\n  dock: {x: 0, y: 0}\n")
    places = load_places(path)
    assert places["kitchen"] == Place(1.5, -2.0, 2.0, "kitchen", "map") and places["dock"].radius == 1.0
    assert resolve_place("kitchen", None, 0.0, places) is places["kitchen"]
    assert resolve_place("", (0.0, 0.0), 0.0, places) is None  # no place asked: today's reply
    assert resolve_place("", (3.0, 4.0), 1.5, places) == Place(3.0, 4.0, 1.5)
    with pytest.raises(PlaceError, match="unknown place 'attic'.*dock, kitchen"):
        resolve_place("attic", None, 0.0, places)
    for radius in (-1.0, math.nan, math.inf):
        with pytest.raises(PlaceError, match="place_radius"):
            resolve_place("", (1.0, 1.0), radius, places)
    path.write_text("places:\n  hall: {x: one, y: 2}\n")
    with pytest.raises(ValueError, match="'hall' needs numbers"):
        load_places(path)
    with pytest.raises(ValueError, match="does not exist"):
        load_places(tmp_path / "none.yaml")


def open_archive(folder, **kw) -> Archive:
    return Archive.open(ArchiveSettings(str(folder), dtype="float32", **kw), IDENTITY, owner="/test/node")


def test_poses_go_in_with_their_frames_and_the_rtree_follows_every_delete(tmp_path):
    archive = open_archive(tmp_path)
    for index in range(5):  # frames 0..19, the robot at x = stamp
        archive.add(posed_chunk(index, walk_east), None)
    kitchen = Place(10.0, 0.0, 1.5, "kitchen")
    inside = archive.frames_in_place(kitchen)
    assert inside.stamps.tolist() == [9.0, 10.0, 11.0] and inside.frame_id == "map"
    assert archive.frames_in_place(kitchen, since=10.5).stamps.tolist() == [11.0]
    assert len(archive.frames_in_place(Place(10.0, 5.0, 1.0))) == 0
    assert archive.nearest_pass(Place(10.0, 5.0, 1.0)) == (pytest.approx(5.0), 10.0)
    pose = archive.poses_at([13.0, 99.0])
    assert pose[0].x == pytest.approx(13.0) and pose[0].frame_id == "map" and pose[1] is None
    db = sqlite3.connect(tmp_path / DB_NAME)
    assert db.execute("SELECT count(*) FROM chunk_extent").fetchone()[0] == 5
    archive.clear()
    assert db.execute("SELECT count(*) FROM chunk_extent").fetchone()[0] == 0
    archive.close()


def test_frames_without_a_pose_say_so_and_an_old_archive_opens_as_it_is(tmp_path):
    archive = open_archive(tmp_path)
    archive.add(posed_chunk(0, lambda s: None if s < 2 else walk_east(s)), None)
    archive.add(dataclasses.replace(posed_chunk(1, walk_east), poses=None), None)  # no pose source
    assert archive.posed_frames().stamps.tolist() == [2.0, 3.0]
    assert archive.poses_at([0.0, 5.0]) == [None, None]
    archive.close()
    # an archive written before poses: no poses column, no R*Tree; opened, it gains both, empty
    new = tmp_path / DB_NAME
    old = tmp_path / "old" / DB_NAME
    old.parent.mkdir()
    schema = SCHEMA.replace("    frame_sizes TEXT,", "    frame_sizes TEXT")
    schema = "\n".join(line for line in schema.splitlines() if not line.lstrip().startswith(("poses", "pose_frame")))
    db = sqlite3.connect(old)
    db.executescript(schema)
    db.execute("ATTACH ? AS new", (str(new),))
    columns = ", ".join(row[1] for row in db.execute("PRAGMA main.table_info(chunks)"))
    db.execute(f"INSERT INTO main.chunks ({columns}) SELECT {columns} FROM new.chunks")
    db.execute("INSERT INTO main.meta SELECT * FROM new.meta")
    db.commit()
    db.close()
    assert "poses" not in columns
    tmp_path = old.parent
    archive = open_archive(tmp_path)
    assert len(archive.rows()) == 2 and len(archive.posed_frames()) == 0
    archive.add(posed_chunk(2, walk_east), None)
    assert archive.frames_in_place(Place(9.0, 0.0, 0.5)).stamps.tolist() == [9.0]
    archive.close()


def test_poses_count_in_the_bound(tmp_path):
    archive = open_archive(tmp_path)
    archive.add(posed_chunk(0, walk_east), None)
    archive.add(dataclasses.replace(posed_chunk(1, walk_east), poses=None), None)
    first, second = archive.rows()
    assert first.bytes > second.bytes
    posed, size = archive.pose_counts()
    assert posed == 4 and 0 < size == first.bytes - second.bytes
    archive.close()


def test_a_pose_that_comes_after_its_chunk_was_written_is_filled_in(tmp_path):
    from streamcache_ros.engine.recall.late_poses import LatePoses

    archive = open_archive(tmp_path)
    track = PoseTrack(tolerance=0.5)
    for t in (0.0, 0.5, 1.0):  # odometry behind the camera: frames 2 and 3 not yet covered
        track.add(t, Pose.planar(t, 0.0, 0.0, "map"))
    late = LatePoses()
    chunk = posed_chunk(0, walk_east)
    chunk = dataclasses.replace(chunk, poses=track.for_frames(chunk.stamps, chunk.camera))
    assert [p is None for p in chunk.poses] == [False, False, True, True] and track.frames_without == 2
    chunk_id = archive.add(chunk, None)
    late.note(chunk_id, chunk)
    late.retry(archive, track)  # nothing new yet: still waiting
    assert len(late.waiting) == 1 and len(archive.frames_in_place(Place(3.0, 0.0, 0.2))) == 0
    bytes_before = archive.rows()[0].bytes
    for t in (1.5, 2.0, 2.5, 3.0, 3.5):
        track.add(t, Pose.planar(t, 0.0, 0.0, "map"))
    late.retry(archive, track)
    assert not late.waiting and late.filled == 2 and track.frames_without == 0 and track.frames_posed == 4
    assert archive.frames_in_place(Place(3.0, 0.0, 0.2)).stamps.tolist() == [3.0]  # the R*Tree followed
    assert archive.rows()[0].bytes > bytes_before
    assert archive.poses_at([0.0])[0].x == pytest.approx(0.0)  # a pose it had is kept as it was
    archive.clear()
    late.note(chunk_id, chunk)
    late.retry(archive, track)  # the chunk is gone: it stops waiting
    assert not late.waiting
    archive.close()


def test_the_schema_with_the_rtree_still_fits_page_one(tmp_path):
    # a damaged file's rows are told apart by the schema read from page 1 alone (archive/salvage.py)
    open_archive(tmp_path).close()
    page_one = (tmp_path / DB_NAME).read_bytes()[:4096]
    assert page_one[100] == 0x0D  # a table leaf: the whole schema is on it
