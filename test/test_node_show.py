"""Answers that show their evidence, through streamcache_node over DDS (docs/show.md): a node restarted
on an archive with thumbnails answers `when` and Ask with ``with_images`` with the frames as JPEGs
(stamp, camera, pixels within JPEG error of the rendered frame), nothing without it; ``~/shown``
carries the frame each `when` found (and ``~/shown/compressed``, where image viewers look); ``streamcache-ask --save-images`` and ``--plot`` write pictures
that open. The bundled world model and its index, real DDS between processes."""
import subprocess

import numpy as np
import pytest
from PIL import Image

from node_procs import HANG_GUARD_S, ROOT, Proc, Probe, child_env, client_of, python_module, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.client import evidence_images
from streamcache_ros.engine import build_session
from streamcache_ros.tools import bagfile

NS = "/sc_show"
CAM = "/show/cam"
SEED = 800_000_777  # the tests' seed range: no training run draws it
FRAMES = 48
PX = 96
S = 1_000_000_000
START = bagfile.DEFAULT_START_NS / S
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
PARAMS = {"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48, "chunk_frames": 4,
          "archive_thumbnail_px": PX}


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    """An archive of 48 frames with 96 px thumbnails, written by the engine as the node writes it."""
    folder = tmp_path_factory.mktemp("show") / "archive"
    stream = world.make_stream(SEED, FRAMES, look=LOOK)
    session = build_session({**PARAMS, "archive_path": str(folder), "camera_topics": [CAM]})
    for i in range(FRAMES):
        session.add_frame(stream.frame(i), stream.stamp(i) + START, camera=CAM)
    session.flush()
    session.close_archive()
    return folder, stream


def matches_frame(image, stream) -> None:
    """``image`` (client EvidenceImage) is the thumbnail of the rendered frame at its stamp."""
    index = round(image.stamp - START)
    assert abs(image.stamp - START - stream.stamp(index)) < 1e-3 and image.camera == CAM
    assert image.rgb.shape == (72, PX, 3)
    ideal = np.asarray(Image.fromarray(stream.frame(index)).resize((PX, 72), Image.BOX)).astype(float)
    assert np.abs(image.rgb.astype(float) - ideal).mean() < 6.0


def test_answers_show_their_frames_only_when_asked(domain, archived, tmp_path):
    folder, stream = archived
    identity = next(v.identity for views in stream.truth[FRAMES // 2:] for v in views)
    question = world.SEEN_PROBE.format(shape=identity[0], colour=identity[1])
    with Proc(tiny_node(NS, [CAM], **PARAMS, archive_path=str(folder)), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as client:
            probe = Probe(domain)
            try:
                from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415
                from sensor_msgs.msg import CompressedImage  # noqa: PLC0415

                shown = probe.collect(CompressedImage, f"{NS}/streamcache_node/shown",
                                      QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                                                 durability=QoSDurabilityPolicy.TRANSIENT_LOCAL), matched=True)
                # the name rqt_image_view and Foxglove offer a CompressedImage under
                compressed = probe.collect(CompressedImage, f"{NS}/streamcache_node/shown/compressed",
                                           QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE), matched=True)
                plain = client.when(question, "last")
                assert plain.success and plain.found and list(plain.evidence_images) == []
                found = client.when(question, "last", with_images=True)
                assert found.success and found.found and stamp_ns(found.stamp) == stamp_ns(plain.stamp)
                (image,) = evidence_images(found)
                assert abs(image.stamp - stamp_ns(found.stamp) / S) < 1e-6
                assert found.evidence_images[0].format == "jpeg"
                matches_frame(image, stream)
                # ~/shown: the frame each when found, to a subscriber (rqt_image_view, Foxglove)
                probe.wait_for(lambda: len(shown) >= 1, what="a frame on ~/shown")
                assert stamp_ns(shown[-1].header.stamp) == stamp_ns(found.stamp) and shown[-1].header.frame_id == CAM
                assert bytes(shown[-1].data) == image.jpeg
                probe.wait_for(lambda: len(compressed) >= 1, what="a frame on ~/shown/compressed")
                assert compressed[-1].format == "jpeg" and bytes(compressed[-1].data) == image.jpeg
                assert stamp_ns(compressed[-1].header.stamp) == stamp_ns(found.stamp)
                assert compressed[-1].header.frame_id == CAM
            finally:
                probe.close()
            answer = client.ask(question, ["yes", "no"], evidence_k=3, with_images=True)
            # "did you see": the moment when found first, then the index's likeliest other sightings
            assert answer.success and answer.answer == "yes" and 1 <= len(answer.evidence_stamps) <= 3
            assert stamp_ns(answer.evidence_stamps[0]) == stamp_ns(found.stamp)
            images = evidence_images(answer)
            assert [round(i.stamp, 3) for i in images] == [round(stamp_ns(t) / S, 3) for t in answer.evidence_stamps]
            for image in images:
                matches_frame(image, stream)
            bare = client.ask(question, ["yes", "no"], evidence_k=3)
            assert bare.success and list(bare.evidence_images) == []
        # the CLI: the frame written as a file, the timeline drawn with its peaks' frames
        frames, plot = tmp_path / "frames", tmp_path / "timeline.png"
        for argv in (["--when", "last", "--save-images", str(frames)], ["--when", "timeline", "--plot", str(plot)]):
            done = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, *argv, question),
                                  cwd=ROOT, env=child_env(domain), capture_output=True, text=True, timeout=HANG_GUARD_S)
            assert done.returncode == 0, done.stdout + done.stderr + proc.output()
        (written,) = frames.iterdir()
        assert written.name == f"{image_stamp(found):.3f}_show_cam.jpg" and Image.open(written).size == (PX, 72)
        drawn = Image.open(plot)
        assert drawn.format == "PNG" and drawn.size == (960, 420)
        assert "peak frame(s)" in done.stderr and not done.stderr.startswith("wrote 0")


def image_stamp(reply) -> float:
    return stamp_ns(reply.stamp) / S
