"""Camera transport: how many 640x480 bgr8 frames published at 10 Hz reach streamcache_node.

    python bench/camera_qos.py                         # 300 frames per case, every case
    python bench/camera_qos.py --frames 100 --cases adaptive pinned-best-effort

Real processes on a ROS domain of their own (localhost): the node (tiny Qwen2.5-VL, sampling at its
default 1 fps: every arriving frame is counted, few are encoded) and a publisher process sending
``--frames`` frames of 640x480 bgr8 (0.9 MB) at ``--rate`` Hz. Frames received are the node's own
count (MemoryStatus ``frames_received``), before and after. Cases:

- ``adaptive``: a reliable publisher, the node as shipped (its camera QoS matched to the publishers:
  reliable); the aim is 99 % or more;
- ``pinned-best-effort``: the same publisher, the node pinned to best effort with a qos_overrides
  parameter (the node's behaviour before the match: sensor-data QoS, best effort);
- ``best-effort-publisher``: a best-effort publisher (a camera driver with sensor-data QoS); the node
  matches it with best effort;
- ``best-effort-publisher+profile``: the same with config/fastdds_large_images.xml given to both
  processes (launch argument fastdds_profile).

Prints a table; writes bench/results/camera_qos.json (``--json``) with the machine, date and commit.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402
import node_harness as h  # noqa: E402

NS = "/qos_bench"
CAM = "/qos_bench/camera/image_raw"
PROFILE = common.ROOT / "config" / "fastdds_large_images.xml"
CASES = {  # name -> (publisher reliable, node pinned best effort, Fast DDS profile)
    "adaptive": (True, False, False),
    "pinned-best-effort": (True, True, False),
    "best-effort-publisher": (False, False, False),
    "best-effort-publisher+profile": (False, False, True),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--rate", type=float, default=10.0, help="frames per second published")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--json", type=pathlib.Path, default=common.RESULTS / "camera_qos.json")
    p.add_argument("--publish", choices=["reliable", "best_effort"], help=argparse.SUPPRESS)  # the publisher process
    return p.parse_args(argv)


def publish(args) -> int:
    """The publisher process: wait for the node's subscription, 2 s more for it to settle on its QoS,
    then publish the frames at the rate; prints how many it published."""
    import numpy as np  # noqa: PLC0415
    import rclpy  # noqa: PLC0415
    from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415
    from sensor_msgs.msg import Image  # noqa: PLC0415

    rclpy.init()
    node = rclpy.create_node("qos_bench_camera")
    reliability = QoSReliabilityPolicy.RELIABLE if args.publish == "reliable" else QoSReliabilityPolicy.BEST_EFFORT
    pub = node.create_publisher(Image, CAM, QoSProfile(depth=5, reliability=reliability))
    deadline = time.monotonic() + h.GUARD_S
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.0)
    pixels = np.random.default_rng(0).integers(0, 255, (args.height, args.width, 3), np.uint8)
    msg = Image(height=args.height, width=args.width, encoding="bgr8", step=args.width * 3, data=pixels.tobytes())
    start = time.monotonic()
    for i in range(args.frames):
        due = start + i / args.rate
        time.sleep(max(0.0, due - time.monotonic()))
        stamp = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
        pub.publish(msg)
    time.sleep(2.0)  # the last frames on their way (reliable: acknowledged)
    print(f"published {args.frames} in {time.monotonic() - start:.1f} s", flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def received(monitor) -> int:
    return monitor.latest().frames_received


def measure(name: str, args, work: pathlib.Path) -> dict:
    reliable, pinned, profile = CASES[name]
    params = {"camera_topics": f"['{CAM}']", "policy": "fifo", "budget_tokens": 480, "model_path": "tiny-qwen2_5_vl",
              "device": "cpu", "dtype": "float32"}
    if pinned:
        params[f"qos_overrides.{CAM}.subscription.reliability"] = "best_effort"
    domain = h.new_domain()
    env = h.child_env(domain)
    if profile:
        env.update(FASTDDS_DEFAULT_PROFILES_FILE=str(PROFILE), FASTRTPS_DEFAULT_PROFILES_FILE=str(PROFILE))
    node = h.start(h.node_command(NS, params), env, work / f"node-{name}.log")
    monitor = h.Monitor(domain, NS, node.pid)
    try:
        monitor.wait_for(lambda: monitor.statuses, h.GUARD_S, "the node's first memory_status")
        before = received(monitor)
        cmd = [sys.executable, __file__, "--publish", "reliable" if reliable else "best_effort",
               "--frames", str(args.frames), "--rate", str(args.rate), "--width", str(args.width),
               "--height", str(args.height)]
        done = subprocess.run(cmd, env=env, cwd=common.ROOT, capture_output=True, text=True, timeout=h.GUARD_S)
        if done.returncode != 0:
            raise RuntimeError(f"publisher failed: {done.stderr[-2000:]}")
        got = received(monitor) - before
    finally:
        h.stop(node)
        monitor.close()
    # every subscription the node made, in order: the first before the publisher came, the last after
    # it left (both best effort), the one between is the QoS the frames travelled with
    subscribed = [line.split("subscribed ", 1)[1].split(":")[0] for line in
                  (work / f"node-{name}.log").read_text().splitlines() if f"camera {CAM}: subscribed " in line]
    return {"case": name, "publisher": "reliable" if reliable else "best effort",
            "node QoS": " -> ".join(subscribed), "profile": profile, "published": args.frames,
            "received": got, "received %": round(100.0 * got / args.frames, 1)}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.publish:
        return publish(args)
    import tempfile  # noqa: PLC0415

    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-qos-"))
    rows = []
    for name in args.cases:
        rows.append(measure(name, args, work))
        print(f"[camera_qos] {rows[-1]}", flush=True)
    columns = [(k, k) for k in rows[0]]
    print(common.table(rows, columns))
    config = {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items() if k != "publish"}
    out = common.write_json(args.json.stem, {"config": config, "rmw": os.environ.get("RMW_IMPLEMENTATION", "default"),
                                             "rows": rows}, args.json.parent)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
