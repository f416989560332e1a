"""``streamcache-ask``: ask streamcache_node a question from a shell or a script.

    streamcache-ask "what is on the table?"
    streamcache-ask --stream "describe what you saw"                     # the action: text as it comes
    streamcache-ask "which shape moved left?" --option "red circle" --option "green square"
    streamcache-ask --camera /camera/image_raw --max-new-tokens 32 --json "how many boxes?"
    streamcache-ask --evidence "when did you last see the red circle?"    # and the frames it drew on
    streamcache-ask --since 1700000000 --until 1700000300 "what was on the table?"   # a time window
    streamcache-ask --status | --reset | --save /tmp/memory.pt | --load /tmp/memory.pt | --timeline

Exit codes: 0 success, 1 the node refused or failed the request (its error message on stderr),
3 no node found / no reply in time, 130 interrupted (a streamed question is cancelled first).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading

EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 1, 3, 130


def _time(t) -> float:
    return t.sec + t.nanosec * 1e-9


def _answer_dict(r) -> dict:
    return {"success": r.success, "answer": r.answer, "option_index": r.option_index,
            "error_message": r.error_message, "frames_in_memory": r.frames_in_memory,
            "oldest_stamp": _time(r.oldest_stamp), "newest_stamp": _time(r.newest_stamp),
            "newest_frame_age_s": r.newest_frame_age_s, "kv_tokens": r.kv_tokens, "ttft_ms": r.ttft_ms, "total_ms": r.total_ms,
            "answer_tokens": r.answer_tokens, "method": r.method, "model_id": r.model_id,
            "evidence_stamps": [_time(t) for t in r.evidence_stamps], "evidence_cameras": list(r.evidence_cameras),
            "evidence_weights": [float(w) for w in r.evidence_weights],
            "evidence_summary_share": float(r.evidence_summary_share)}


def _evidence_lines(r) -> str:
    """One line per evidence frame: stamp, camera, weight (strongest first)."""
    lines = [f"evidence: {_time(t):.3f} {c or '-'} {w:.3f}"
             for t, c, w in zip(r.evidence_stamps, r.evidence_cameras, r.evidence_weights)]
    if r.evidence_summary_share:
        lines.append(f"evidence: summary tokens {r.evidence_summary_share:.3f}")
    return "".join("\n" + line for line in lines)


def _timeline_dict(r) -> dict:
    return {"success": r.success, "error_message": r.error_message, "policy": r.policy, "num_layers": r.num_layers,
            "bank_names": list(r.bank_names),
            "frames": [{"stamp": _time(f.stamp), "camera": f.camera, "unit": f.unit,
                        "layer_kept": [round(float(x), 4) for x in f.layer_kept],
                        "bank_kept": [round(float(x), 4) for x in f.bank_kept]} for f in r.frames]}


def _status_dict(m) -> dict:
    plain = {}
    for name in m.get_fields_and_field_types():
        value = getattr(m, name)
        if name in ("oldest_stamp", "newest_stamp"):
            value = _time(value)
        elif name == "header":
            value = _time(value.stamp)
        elif hasattr(value, "tolist"):
            value = value.tolist()
        elif isinstance(value, (list, tuple)):
            value = list(value)
        plain[name] = value
    return plain


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="streamcache-ask", description="Ask streamcache_node about what its cameras saw.")
    parser.add_argument("question", nargs="?", help="the question")
    parser.add_argument("--option", action="append", default=[], help="a multiple-choice option (repeatable)")
    parser.add_argument("--camera", default="", help="a topic from the node's camera_topics (default: all cameras)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="answer length (0: the node's default)")
    parser.add_argument("--since", type=float, default=None,
                        help="answer only from frames stamped at or after this time (seconds, as the camera stamps)")
    parser.add_argument("--until", type=float, default=None,
                        help="answer only from frames stamped at or before this time (seconds)")
    parser.add_argument("--evidence-k", type=int, default=0, help="evidence frames wanted (0: the node's evidence_k)")
    parser.add_argument("--evidence", action="store_true",
                        help="after the answer, print the frames it drew on: stamp, camera, weight")
    parser.add_argument("--stream", action="store_true", help="use the ask_action: print the answer as it is generated")
    parser.add_argument("--namespace", default=None,
                        help="the node's namespace, e.g. /streamcache (default: find the one node)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node to appear")
    parser.add_argument("--json", action="store_true", help="print the whole reply as JSON")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="print the next MemoryStatus")
    what.add_argument("--reset", action="store_true", help="forget every frame")
    what.add_argument("--save", metavar="PATH", help="write the memory to PATH (on the node's machine)")
    what.add_argument("--load", metavar="PATH", help="replace the memory with the snapshot at PATH")
    what.add_argument("--timeline", action="store_true",
                      help="print every frame in memory with the share of its tokens kept per layer (JSON)")
    args = parser.parse_args(argv)
    if not (args.status or args.reset or args.save or args.load or args.timeline) and not args.question:
        parser.error("a question is needed (or --status / --reset / --save / --load / --timeline)")
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")
    if args.evidence_k < 0:
        parser.error("--evidence-k must be >= 0")
    for name in ("since", "until"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0 (a stamp in seconds)")
    return args


def _report(args, reply, fields: dict, text: str) -> int:
    if args.json:
        print(json.dumps(fields, indent=2))
    elif reply.success:
        print(text)
    if not reply.success:
        print(f"streamcache-ask: {reply.error_message}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def run(args, client) -> int:
    if args.status:
        status = client.memory_status(timeout=args.wait)
        print(json.dumps(_status_dict(status), indent=None if not args.json else 2))
        return 0
    if args.reset:
        r = client.reset(timeout=args.timeout)
        return _report(args, r, {"success": r.success, "error_message": r.error_message,
                                 "frames_cleared": r.frames_cleared}, f"forgot {r.frames_cleared} frames")
    if args.save:
        r = client.save(args.save, timeout=args.timeout)
        return _report(args, r, {"success": r.success, "error_message": r.error_message, "bytes_written": r.bytes_written,
                                 "frames_in_memory": r.frames_in_memory},
                       f"saved {r.frames_in_memory} frames, {r.bytes_written} bytes to {args.save}")
    if args.load:
        r = client.load(args.load, timeout=args.timeout)
        return _report(args, r, {"success": r.success, "error_message": r.error_message,
                                 "frames_in_memory": r.frames_in_memory},
                       f"loaded {r.frames_in_memory} frames from {args.load}")
    if args.timeline:
        r = client.memory_timeline(args.camera, timeout=args.timeout)
        return _report(args, r, _timeline_dict(r), json.dumps(_timeline_dict(r)))
    window = {"since": args.since, "until": args.until, "evidence_k": args.evidence_k}
    if not args.stream:
        r = client.ask(args.question, args.option, args.camera, args.max_new_tokens, timeout=args.timeout, **window)
        chosen = f"\n(option {r.option_index}: {args.option[r.option_index]})" if r.option_index >= 0 else ""
        return _report(args, r, _answer_dict(r), r.answer + chosen + (_evidence_lines(r) if args.evidence else ""))
    cancel = threading.Event()

    def show(partial: str, new_text: str) -> None:
        if not args.json:
            print(new_text, end="", flush=True)

    try:
        r = client.ask_streaming(args.question, args.option, args.camera, args.max_new_tokens, on_text=show,
                                 cancel=cancel, timeout=args.timeout, **window)
    except KeyboardInterrupt:
        cancel.set()
        print("\nstreamcache-ask: interrupted (question cancelled)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.json:
        print(_evidence_lines(r) if args.evidence and r.success else "")
    if args.json:
        print(json.dumps(_answer_dict(r), indent=2))
    if not r.success:
        print(f"streamcache-ask: {r.error_message}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from .client import NodeNotFound, StreamCacheClient  # noqa: PLC0415

    try:
        client = StreamCacheClient(args.namespace, timeout=args.wait)
    except (NodeNotFound, LookupError) as err:
        print(f"streamcache-ask: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    try:
        return run(args, client)
    except TimeoutError as err:
        print(f"streamcache-ask: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
