"""Start and stop `ros2 launch` many times under load: does every SIGINT end it, with 0, in time?

    python bench/launch_cycles.py                     # 50 cycles
    python bench/launch_cycles.py --cycles 5 --json /tmp/c.json

Each cycle starts `ros2 launch streamcache_ros live.launch.py` (the bundled world model, an archive
of its own) in a session of its own, as a script would (docs/setup.md "From a script"), waits until
the node logs that it is active, sends SIGINT to the launch's pid alone, and waits up to
``--guard`` seconds. Recorded per cycle: the exit code, the seconds from SIGINT to exit, and whether
any process of the launch was left. Run it beside other work (a benchmark, the tests): the hour-long
run whose launch ignored SIGINT had the machine busy. Exits 1 unless every cycle ended with 0 and
left nothing.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

from streamcache_ros.tools.ros_install import ros2_launch_unavailable  # noqa: E402

ACTIVE = "active: listening on"


def one_cycle(i: int, env: dict, work: pathlib.Path, guard: float) -> dict:
    log = work / f"launch-{i}.log"
    command = ["ros2", "launch", "streamcache_ros", "live.launch.py", f"namespace:=cycle{i}",
               f"camera_topics:=['/cycle{i}/cam']"]
    launch = h.start(command, env, log)
    started = time.monotonic()
    while ACTIVE not in log.read_text(errors="replace"):
        if launch.poll() is not None or time.monotonic() - started > guard:
            h.stop(launch)
            return {"cycle": i, "started": False, "log_tail": log.read_text(errors="replace")[-400:]}
        time.sleep(0.2)
    up_s = time.monotonic() - started
    family = [launch.pid, *h.descendants(launch.pid)]
    os.kill(launch.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        code = launch.wait(guard)
    except subprocess.TimeoutExpired:
        code = f"no exit within {guard} s"
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()
    stop_s = time.monotonic() - sent
    time.sleep(0.5)
    left = [pid for pid in family if h.alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return {"cycle": i, "started": True, "up_s": round(up_s, 2), "exit_code": code, "stop_s": round(stop_s, 2),
            "left": left}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--guard", type=float, default=60.0)
    parser.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "launch_cycles.json")
    args = parser.parse_args(argv)
    unavailable = ros2_launch_unavailable(h.ROOT)
    if unavailable:
        print(f"ros2 launch cannot run this checkout: {unavailable}", file=sys.stderr)
        return 2
    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-cycles-"))
    env = h.child_env(h.new_domain())
    env["ROS_LOG_DIR"] = str(work / "ros-log")
    cycles = []
    for i in range(args.cycles):
        cycles.append(one_cycle(i, env, work, args.guard))
        print(f"[launch_cycles] {cycles[-1]}", flush=True)
    ok = [c for c in cycles if c["started"] and c["exit_code"] == 0 and not c["left"]]
    stops = sorted(c["stop_s"] for c in cycles if c["started"])
    summary = {"cycles": len(cycles), "clean": len(ok), "stop_s_median": stops[len(stops) // 2] if stops else None,
               "stop_s_max": stops[-1] if stops else None}
    print(summary)
    h.write_json(args.json, {"machine": h.machine(), "config": {**vars(args), "json": str(args.json)},
                             "summary": summary, "cycles": cycles})
    print(f"wrote {args.json}")
    return 0 if len(ok) == len(cycles) else 1


if __name__ == "__main__":
    sys.exit(main())
