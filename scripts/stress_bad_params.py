"""Start streamcache_node with a bad parameter many times, several at once, and count the crashes.

    python scripts/stress_bad_params.py                          # 300 starts, 6 at once, "budget below one frame"
    python scripts/stress_bad_params.py --runs 100 --parallel 4 --case all --json /tmp/stress.json
    python scripts/stress_bad_params.py --root /tmp/old-checkout    # the same against another checkout

Every start must end with exit code 2 and one line naming the parameter (docs/reliability.md, "Bad
configuration"). A start that ends otherwise is counted by its exit code; a negative code is a
signal (-11: SIGSEGV). Each child runs with PYTHONFAULTHANDLER=1, so a crash prints every thread's
Python stack to its stderr; the stderr of every start that did not exit 2 is kept in the JSON.
Evidence for docs/reliability.md ("A crash at exit"): a crash once in a hundred starts has no test
that fails every time.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import pathlib
import random
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# ROS domains the starts pick from (STREAMCACHE_TEST_DOMAINS, e.g. 60-69: the tests' variable)
_LOW, _, _HIGH = os.environ.get("STREAMCACHE_TEST_DOMAINS", "10-230").partition("-")
DOMAINS = (int(_LOW), int(_HIGH or _LOW))
# name -> the node's arguments; the first is the case seen to crash once (docs/reliability.md, "Bad configuration")
CASES = {
    "budget below one frame": ["--ros-args", "-p", "budget_tokens:=1", "-p", "policy:=fifo"],
    "unknown policy": ["--ros-args", "-p", "policy:=nosuch"],
    "h2svc head map missing": ["--ros-args", "-p", "policy:=h2svc", "-p", "h2svc.head_map_path:=/no/map.json"],
    "bad QoS override": ["--ros-args", "-p", "qos_overrides./camera/image_raw.subscription.reliability:=sometimes"],
    "snapshot directory missing": ["--ros-args", "-p", "memory_snapshot_path:=/no/such/dir/m.pt"],
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--parallel", type=int, default=6, help="starts running at once")
    p.add_argument("--case", default="budget below one frame", choices=[*CASES, "all"],
                   help="which bad parameter ('all': each in turn)")
    p.add_argument("--root", type=pathlib.Path, default=ROOT, help="the checkout whose node is started")
    p.add_argument("--json", type=pathlib.Path, default=None, help="write the counts and crash outputs here")
    p.add_argument("--every", type=int, default=25, help="print the count every this many starts")
    return p.parse_args(argv)


def start(root: pathlib.Path, args: list[str], index: int) -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p),
               ROS_DOMAIN_ID=str(random.SystemRandom().randint(*DOMAINS)), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONFAULTHANDLER="1")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamcache_ros.node.main", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    clean = done.returncode == 2 and len(lines) == 1 and not done.stdout
    return {"index": index, "code": done.returncode, "clean": clean, "seconds": round(time.monotonic() - started, 2),
            "stderr": "" if clean else done.stderr[-20000:], "stdout": "" if clean else done.stdout[-2000:]}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = list(CASES) if args.case == "all" else [args.case]
    results = []
    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel)
    futures = {pool.submit(start, args.root, CASES[names[i % len(names)]], i): names[i % len(names)]
               for i in range(args.runs)}
    try:
        for n, future in enumerate(concurrent.futures.as_completed(futures), 1):
            result = {"case": futures[future], **future.result()}
            results.append(result)
            if not result["clean"]:
                print(f"[stress] start {result['index']} ({result['case']}): exit {result['code']}\n"
                      f"{result['stderr'][-3000:]}", flush=True)
            if n % args.every == 0:
                print(f"[stress] {n}/{args.runs} done, {n - len([r for r in results if r['clean']])} not clean",
                      flush=True)
    except KeyboardInterrupt:  # Ctrl-C: the starts so far are counted (the ones running are let finish)
        print(f"[stress] interrupted after {len(results)} starts", flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    codes = collections.Counter(r["code"] for r in results)
    unclean = [r for r in results if not r["clean"]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.root, capture_output=True, text=True)
    summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit.stdout.strip(),
               "machine": f"{os.cpu_count()} CPU cores", "runs": len(results), "asked": args.runs,
               "parallel": args.parallel, "cases": names, "root": str(args.root),
               "exit_codes": {str(k): v for k, v in sorted(codes.items())},
               "crashes": sum(v for k, v in codes.items() if k < 0), "not_clean": len(unclean),
               "wall_s": round(time.monotonic() - started, 1)}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**summary, "failures": unclean}, indent=2) + "\n")
    return 0 if not unclean else 1


if __name__ == "__main__":
    sys.exit(main())
