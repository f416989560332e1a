"""``streamcache-archive`` (tools/archive_cli.py; docs/show.md) on a real archive written by
ArchiveStore, read while the store still holds it open (the node's WAL writer): ls, show, sheet,
backup and check; it writes nothing unless asked, and refuses what is not an archive with one line."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from streamcache_ros.engine.recall.archive import DB_NAME
from streamcache_ros.engine.recall.archive.thumbnails import decode
from streamcache_ros.tools.archive_cli import main
from test_archive_store import open_store
from test_thumbnails import with_thumbnails

QUESTION = "Did you see a red circle?"


@pytest.fixture
def live(tmp_path):
    """An archive of 4 chunks (frames 0..31, thumbnails 64 px, standing answers) whose store stays
    open, as a running node's does."""
    store = open_store(tmp_path / "archive")
    originals = []
    for i in range(4):
        original = with_thumbnails(i)
        originals.append(original)
        chunk_id = store.append(original)
        store.note_watch(chunk_id, {QUESTION: 0.2 * i + 0.1})
    yield store, originals
    store.close()


def run(folder, *argv) -> int:
    return main(["--archive", str(folder), *argv])


def files_of(folder) -> dict[str, float]:
    return {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)}


def test_ls_lists_chunks_with_their_standing_answers(live, capsys):
    store, _ = live
    assert run(store.folder, "ls", "--since", "10", "--until", "20", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["first_stamp"], r["last_stamp"], r["camera"]) for r in rows] == [(8.0, 15.0, "/cam"), (16.0, 23.0, "/cam")]
    assert rows[0]["watch"] == {QUESTION: 0.3} and rows[0]["frames"] == 6
    assert run(store.folder, "ls") == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 4 and f"'{QUESTION}' 0.70" in out.out and "4 chunk(s)" in out.err
    # over one second: the frame inside it, the chunk's own span beside; --archive after the command too
    assert main(["ls", "--archive", str(store.folder), "--since", "12", "--until", "12.5"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "12.00 .. 12.00  1 frame(s) (of a chunk 8.00 .. 15.00)" in line, line
    assert main(["check", "--archive", str(store.folder)]) == 0 and "integrity: ok" in capsys.readouterr().out


def test_show_writes_the_frame_nearest_the_stamp_beside_the_writer(live, tmp_path, capsys):
    store, originals = live
    before = files_of(store.folder)
    out = tmp_path / "frame.jpg"
    assert run(store.folder, "show", "13.2", str(out), "--camera", "/cam") == 0
    assert out.read_bytes() == originals[1].thumbnails[5]  # frame 13: the stored JPEG, as it is
    assert "stamp 13.00" in capsys.readouterr().out
    png = tmp_path / "frame.png"
    assert run(store.folder, "show", "0", str(png)) == 0
    assert Image.open(png).format == "PNG" and Image.open(png).size == (64, 48)
    assert run(store.folder, "show", "5", str(out), "--camera", "/nowhere") == 1
    # the writer goes on: a chunk appended after the reads is seen by the next one
    store.append(with_thumbnails(9))
    assert run(store.folder, "show", "75", str(out)) == 0 and out.read_bytes() == with_thumbnails(9).thumbnails[3]
    assert set(files_of(store.folder)) == set(before)  # no file made beside the archive


def test_sheet_draws_the_span_with_a_strip_of_p_yes(live, tmp_path, capsys):
    store, _ = live
    out = tmp_path / "sheet.png"
    assert run(store.folder, "sheet", "--since", "0", "--until", "31", "--columns", "8", str(out)) == 0
    sheet = np.asarray(Image.open(out).convert("RGB"))
    assert sheet.shape[1] == 8 * (64 + 4) + 4 and sheet.shape[0] > 4 * (48 + 14)
    assert "32 frame(s)" in capsys.readouterr().out
    # the last chunk's answer (0.7) is a green bar in the strip, the first's (0.1) a short red one
    strip = sheet[-40:]
    assert (strip[..., 1] > strip[..., 0] + 60).any() and (strip[..., 0] > strip[..., 1] + 80).any()
    assert run(store.folder, "sheet", "--since", "0", "--until", "31", "--max-frames", "5", str(out)) == 0
    assert "5 frame(s)" in capsys.readouterr().out
    assert run(store.folder, "sheet", "--since", "500", str(out)) == 1


def test_backup_copies_the_archive_while_it_is_written(live, tmp_path, capsys):
    store, originals = live
    dest = tmp_path / "copy"
    assert run(store.folder, "backup", str(dest)) == 0
    assert "4 chunk(s)" in capsys.readouterr().out
    copy = open_store(dest)  # a whole archive another node (or this tool) opens
    assert [r.stamps for r in copy.rows()] == [o.stamps for o in originals]
    assert copy.thumbnail_near(30.0).jpeg == originals[3].thumbnails[6]
    copy.close()
    assert run(store.folder, "backup", str(dest)) == 2  # never over a file unless asked
    assert "exists" in capsys.readouterr().err
    store.append(with_thumbnails(4))
    assert run(store.folder, "backup", str(dest), "--force") == 0 and "5 chunk(s)" in capsys.readouterr().out


def test_check_reports_integrity_sizes_and_the_holes_table(live, capsys):
    store, originals = live
    assert run(store.folder, "check", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["integrity"] == ["ok"] and report["chunks"] == 4
    assert report["thumbnail_bytes"] == sum(len(j) for o in originals for j in o.thumbnails)
    assert report["payload_bytes"] == store.stats()["bytes"] and DB_NAME in report["files"]
    assert report["meta"]["model_id"] == "world-test"
    assert run(store.folder, "check") == 0
    text = capsys.readouterr().out
    assert "integrity: ok" in text and "chunks: 4 (/cam: 4)" in text


def test_check_lists_holes_when_the_archive_records_them(tmp_path, capsys):
    store = open_store(tmp_path)
    store.append(with_thumbnails(0))
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute("CREATE TABLE IF NOT EXISTS holes (id INTEGER PRIMARY KEY, camera TEXT NOT NULL, since REAL NOT NULL, "
               "until REAL NOT NULL, reason TEXT NOT NULL, chunks INTEGER NOT NULL DEFAULT 0)")
    db.execute("INSERT INTO holes (camera, since, until, reason, chunks) VALUES ('/cam', 8.0, 40.0, 'bound', 4)")
    db.commit()
    db.close()
    assert run(tmp_path, "check") == 0
    assert "8.00 .. 40.00  bound, 4 chunk(s)" in capsys.readouterr().out


def test_what_is_not_an_archive_is_refused_with_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / DB_NAME).write_bytes(b"not a database at all" * 100)
    (tmp_path / "other").mkdir()
    other = sqlite3.connect(tmp_path / "other" / DB_NAME)
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    for folder in ("empty", "junk", "other", "missing"):
        before = sorted(os.listdir(tmp_path / folder)) if (tmp_path / folder).exists() else None
        result = subprocess.run([sys.executable, "-m", "streamcache_ros.tools.archive_cli", "--archive",
                                 str(tmp_path / folder), "check"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, (folder, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "is not a streamcache archive" in result.stderr
        assert result.stdout == ""
        after = sorted(os.listdir(tmp_path / folder)) if (tmp_path / folder).exists() else None
        assert after == before  # nothing made, not even a folder


def test_the_default_folder_is_the_nodes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROS_HOME", str(tmp_path))
    folder = tmp_path / "streamcache" / "archive" / "robot__streamcache_node"
    store = open_store(folder)
    store.append(with_thumbnails(0))
    assert main(["--node", "/robot/streamcache_node", "ls", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert main(["ls"]) == 2  # the launch files' node has no archive here
    assert "streamcache__streamcache_node" in capsys.readouterr().err
    store.close()


def test_a_thumbnail_read_back_decodes_to_its_frame_size(live, tmp_path):
    store, _ = live
    out = tmp_path / "f.jpg"
    assert run(store.folder, "show", "31", str(out)) == 0
    assert decode(out.read_bytes()).shape == (48, 64, 3)
