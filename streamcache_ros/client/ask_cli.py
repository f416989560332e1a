"""``streamcache-ask``: ask streamcache_node a question from a shell or a script.

    streamcache-ask "what is on the table?"
    streamcache-ask --stream "describe what you saw"                     # the action: text as it comes
    streamcache-ask "which shape moved left?" --option "red circle" --option "green square"
    streamcache-ask --camera /camera/image_raw --max-new-tokens 32 --json "how many boxes?"
    streamcache-ask --evidence "when did you last see the red circle?"    # and the frames it drew on
    streamcache-ask --since 1700000000 --until 1700000300 "what was on the table?"   # a time window
    streamcache-ask --when last "Did you see a red circle?"        # when: last | first | timeline
    streamcache-ask --when last --save-images frames/ "Did you see a red circle?"   # and the frame it found
    streamcache-ask --when timeline --plot day.png "Did you see a red circle?"      # P(yes), its peaks' frames
    streamcache-ask --place kitchen "Is the door open?"            # only frames taken there (docs/places.md)
    streamcache-ask --when last --place-at 1.5 -2.0 2.0 "Did you see a red circle?"   # x y radius, metres
    streamcache-ask --all "Did you see a red circle?"        # every node on the domain: which robot saw it last
    streamcache-ask --status | --reset | --save kitchen.pt | --load kitchen.pt | --timeline

JSON (``--json``, and ``--status`` and ``--timeline`` always) is printed the same way, indented. ``--save`` and
``--load`` take a file name inside the node's ``snapshot_dir`` (on the node's machine).
Without ``--namespace`` it answers only when exactly one node serves on the domain, after discovery
has settled (about 2 s); with several it names them all and exits 3.
A ``--when`` prints the pose of the frame found, and ``--evidence`` each evidence frame's pose, where
the node has one. ``--all`` asks ``when`` (``--mode`` last or first) of every node at once and prints
one line per robot, the newest (oldest) sighting first, then the nodes that did not answer in time.
Exit codes: 0 success, 1 the node refused or failed the request, or is not active (the reason on
stderr), 3 no node found / no reply in time, 130 interrupted (a streamed question is cancelled first).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading

from .fleet import pose_text
from .replies import frame_pose

EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 1, 3, 130
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _print_json(fields: dict) -> None:
    print(json.dumps(fields, indent=2))


def _time(t) -> float:
    return t.sec + t.nanosec * 1e-9


def _matched(r, options: list[str]) -> str:
    """Which option the answer matched, in words ('' without options)."""
    if not options:
        return ""
    if 0 <= r.option_index < len(options):
        return f"option {LETTERS[r.option_index]} (index {r.option_index}): {options[r.option_index]}"
    return "no option matched (option_index -1)"


def _plain(value):
    """A reply field as JSON: a Time in seconds, an image by what it is (not its bytes), arrays as lists."""
    if hasattr(value, "sec") and hasattr(value, "nanosec"):
        return _time(value)
    if hasattr(value, "header") and hasattr(value, "format"):  # sensor_msgs/CompressedImage
        return {"stamp": _time(value.header.stamp), "camera": value.header.frame_id, "format": value.format,
                "bytes": len(value.data)}
    if hasattr(value, "get_fields_and_field_types"):
        return {name: _plain(getattr(value, name)) for name in value.get_fields_and_field_types()}
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _answer_dict(r, options: list[str]) -> dict:
    """Every field of an Ask reply (docs/interfaces.md), and the option it chose in words."""
    chosen = options[r.option_index] if 0 <= r.option_index < len(options) else None
    return {**_plain(r), "option": chosen}


def _reach_line(r) -> str:
    """A line when older frames were seen and are out of the answer's reach, or when the answer could
    not read every part of its window that could hold a yes ('' otherwise)."""
    if not r.success:
        return ""
    line = ""
    if r.evicted_before:
        line += f"\n(the memory searched reaches back to {_time(r.searched_since):.3f}; older frames were evicted)"
    holes = [f"{reason} {_time(a):.3f}..{_time(b):.3f}" for a, b, reason in zip(r.hole_since, r.hole_until,
                                                                              r.hole_reasons)]
    if holes:
        line += f"\n(holes in the window: {', '.join(holes)})"
    if getattr(r, "found_by", "") and not r.search_complete:
        read = getattr(r, "frames_searched", None)
        read = r.frames_in_memory if read is None else read
        line += (f"\n(search incomplete: the index could not settle the window, and {read} of its "
                 f"{r.frames_in_window} frames were read; 'not found' means not found in those)")
    elif getattr(r, "found_by", "") == "walk":
        line += "\n(found by a walk: chunks replayed one by one and asked, with no index to confirm it)"
    return line


def _when_dict(r) -> dict:
    """Every field of a When reply, the timeline as [stamp, P(yes)] pairs."""
    fields = _plain(r)
    fields["stamp"] = _time(r.stamp) if r.found else None
    fields["timeline"] = [[_time(t), round(float(p), 4)] for t, p in zip(r.timeline_stamps, r.timeline_yes_probability)]
    for name in ("timeline_stamps", "timeline_yes_probability"):
        fields.pop(name, None)
    return fields


def _when_text(r, mode: str, points: bool = True) -> str:
    if mode == "timeline":
        if not points:  # --plot draws them
            return f"{len(r.timeline_stamps)} point(s)" + _reach_line(r)
        lines = [f"{_time(t):.3f} {float(p):.3f}" for t, p in zip(r.timeline_stamps, r.timeline_yes_probability)]
        return "\n".join(lines) or "(no frames)"
    how = f"found by {r.found_by}; " if r.found_by else ""
    if not r.found:
        return (f"not found in the {r.frames_searched} frames searched ({how}{r.questions_asked} questions asked, "
                f"{r.recalled_chunks} chunks replayed)" + _reach_line(r))
    older = " (may be older: it lies at the edge of what the memory still holds)" if r.may_be_older else ""
    where = f"\nat {pose_text(frame_pose(r.pose))}" if getattr(r, "has_pose", False) else ""
    return (f"{_time(r.stamp):.3f} {r.camera or '-'} (P(yes) {r.yes_probability:.3f}; {how}{r.questions_asked} "
            f"questions, {r.total_ms:.0f} ms){older}" + where + _reach_line(r))


def _evidence_lines(r) -> str:
    """One line per evidence frame: stamp, camera, weight (strongest first), and where it was taken."""
    poses = [frame_pose(p) for p in getattr(r, "evidence_poses", [])]
    poses += [None] * (len(r.evidence_stamps) - len(poses))
    lines = [f"evidence: {_time(t):.3f} {c or '-'} {w:.3f}" + (f" at {pose_text(pose)}" if pose else "")
             for t, c, w, pose in zip(r.evidence_stamps, r.evidence_cameras, r.evidence_weights, poses)]
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
        if name.endswith("_stamp"):  # oldest, newest, archive_oldest, archive_newest: seconds
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
    parser.add_argument("--when", choices=("last", "first", "timeline"),
                        help="the when service: the last / first stamp the yes/no question holds, or its timeline")
    parser.add_argument("--place", metavar="NAME", default=None,
                        help="read only the frames taken within a place of the node's places_file (docs/places.md)")
    parser.add_argument("--place-at", metavar=("X", "Y", "R"), type=float, nargs=3, default=None,
                        help="read only the frames taken within R metres of (X, Y), in the pose frame")
    parser.add_argument("--all", action="store_true",
                        help="ask every streamcache node on the domain (when, --mode) and print one line per robot")
    parser.add_argument("--mode", choices=("last", "first"), default=None,
                        help="with --all: the newest (last, the default) or oldest (first) sighting first")
    parser.add_argument("--namespace", default=None,
                        help="the node's namespace, e.g. /streamcache (default: the one node on the domain, once "
                             "discovery has settled; several are refused, each named)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node to appear")
    parser.add_argument("--json", action="store_true", help="print the whole reply as JSON (indented, as --status)")
    parser.add_argument("--save-images", metavar="DIR",
                        help="ask for the evidence frames' thumbnails (with_images) and write them into DIR as "
                             "<stamp>_<camera>.jpg (docs/show.md)")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="with --when timeline: draw P(yes) over the window with the frames of its peaks")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="print the next MemoryStatus as JSON")
    what.add_argument("--reset", action="store_true", help="forget every frame")
    what.add_argument("--save", metavar="NAME", help="write the memory to NAME in the node's snapshot_dir")
    what.add_argument("--load", metavar="NAME", help="replace the memory with the snapshot NAME in the node's snapshot_dir")
    what.add_argument("--timeline", action="store_true",
                      help="print every frame in memory with the share of its tokens kept per layer (JSON)")
    args = parser.parse_args(argv)
    if not (args.status or args.reset or args.save or args.load or args.timeline) and not args.question:
        parser.error("a question is needed (or --status / --reset / --save / --load / --timeline)")
    if args.place and args.place_at:
        parser.error("--place and --place-at name the same thing: give one")
    if args.place_at is not None and args.place_at[2] <= 0:
        parser.error("--place-at's radius must be > 0 (metres)")
    if args.all:
        extra = [name for name in ("option", "stream", "status", "reset", "save", "load", "timeline", "namespace",
                                   "save_images", "plot", "evidence") if getattr(args, name)]
        if extra:
            parser.error(f"--all asks `when` of every node: no --{extra[0].replace('_', '-')}")
        if args.when == "timeline":
            parser.error("--all merges stamps: --when last or first (or --mode)")
        if args.when and args.mode and args.when != args.mode:
            parser.error("--when and --mode disagree")
        args.mode = args.mode or args.when or "last"
    elif args.mode:
        parser.error("--mode goes with --all (one node: --when last | first)")
    if args.when and (args.option or args.stream):
        parser.error("--when asks a yes/no question itself: no --option, no --stream")
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")
    if args.evidence_k < 0:
        parser.error("--evidence-k must be >= 0")
    if args.plot and args.when != "timeline":
        parser.error("--plot draws a timeline: give --when timeline")
    for name in ("since", "until"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0 (a stamp in seconds)")
    return args


def _report(args, reply, fields: dict, text: str) -> int:
    if args.json:
        _print_json(fields)
    elif reply.success:
        print(text)
    if not reply.success:
        print(f"streamcache-ask: {reply.error_message}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def run(args, client) -> int:
    if args.status:
        # an inactive node publishes no status: say so at once rather than time out on the topic
        state = client.node_state(timeout=min(args.wait, 5.0))
        if state and state != "active":
            name = client.node_name() or client.namespace
            print(f"streamcache-ask: {name} is {state}, not active: it publishes no memory status until it is "
                  f"activated (ros2 lifecycle set {name} activate)", file=sys.stderr)
            return EXIT_REFUSED
        _print_json(_status_dict(client.memory_status(timeout=args.wait)))
        return 0
    if args.reset:
        r = client.reset(timeout=args.timeout)
        return _report(args, r, _plain(r), f"forgot {r.frames_cleared} frames and {r.archived_chunks_cleared} "
                                           "archived chunks")
    if args.save:
        r = client.save(args.save, timeout=args.timeout)
        return _report(args, r, _plain(r),
                       f"saved {r.frames_in_memory} frames, {r.bytes_written} bytes to {args.save} in the node's "
                       "snapshot_dir")
    if args.load:
        r = client.load(args.load, timeout=args.timeout)
        return _report(args, r, _plain(r),
                       f"loaded {r.frames_in_memory} frames from {args.load}")
    if args.timeline:
        r = client.memory_timeline(args.camera, timeout=args.timeout)
        return _report(args, r, _timeline_dict(r), json.dumps(_timeline_dict(r), indent=2))
    if args.when:
        r = client.when(args.question, args.when, args.camera, since=args.since, until=args.until,
                        timeout=args.timeout, with_images=bool(args.save_images or args.plot), place=_place(args))
        code = _report(args, r, _when_dict(r), _when_text(r, args.when, points=not args.plot))
        return code or _pictures(args, r)
    window = {"since": args.since, "until": args.until, "evidence_k": args.evidence_k,
              "with_images": bool(args.save_images), "place": _place(args)}
    if not args.stream:
        r = client.ask(args.question, args.option, args.camera, args.max_new_tokens, timeout=args.timeout, **window)
        chosen = _matched(r, args.option)
        code = _report(args, r, _answer_dict(r, args.option),
                       r.answer + (f"\n({chosen})" if chosen else "") + (_evidence_lines(r) if args.evidence else "")
                       + _reach_line(r))
        return code or _pictures(args, r)
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
        print()
        if r.success and args.option:
            print(f"({_matched(r, args.option)})")
        if r.success and args.evidence:
            print(_evidence_lines(r).lstrip("\n"))
        if _reach_line(r):
            print(_reach_line(r).lstrip("\n"))
    if args.json:
        _print_json(_answer_dict(r, args.option))
    if not r.success:
        print(f"streamcache-ask: {r.error_message}", file=sys.stderr)
        return EXIT_REFUSED
    return _pictures(args, r)


def _place(args):
    """The request's place: a name, (x, y, radius), or None (anywhere)."""
    return args.place if args.place else (tuple(args.place_at) if args.place_at else None)


def run_fleet(args) -> int:
    """--all: ``when`` asked of every node at once (streamcache_ros.client.fleet)."""
    from .fleet import ask_fleet, fleet_dict, fleet_lines  # noqa: PLC0415

    try:
        answer = ask_fleet(args.question, args.mode, timeout_s=args.timeout, place=_place(args), since=args.since,
                           until=args.until, camera=args.camera, discover_s=args.wait)
    except LookupError as err:
        print(f"streamcache-ask: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if args.json:
        _print_json(fleet_dict(answer))
    else:
        print("\n".join(fleet_lines(answer, args.timeout)))
    if not answer.entries:  # no robot answered: every one refused or stayed silent
        return EXIT_REFUSED if answer.refused else EXIT_UNREACHABLE
    return 0


def _pictures(args, reply) -> int:
    """--save-images and --plot, from a reply asked with_images; said on stderr, so --json stays JSON."""
    if not (args.save_images or args.plot):
        return 0
    from .client import evidence_images  # noqa: PLC0415

    images = evidence_images(reply)
    if args.save_images:
        import pathlib  # noqa: PLC0415

        folder = pathlib.Path(args.save_images)
        folder.mkdir(parents=True, exist_ok=True)
        for image in images:
            camera = "".join(c if c.isalnum() or c in "-_" else "_" for c in image.camera.strip("/")) or "camera"
            (folder / f"{image.stamp:.3f}_{camera}.jpg").write_bytes(image.jpeg)
        print(f"wrote {len(images)} image(s) to {folder}" + ("" if images else " (the node keeps no thumbnails of "
              "those frames: archive_thumbnail_px 0, or no archive)"), file=sys.stderr)
    if args.plot:
        from ..tools.archive_pictures import timeline_plot  # noqa: PLC0415

        timeline_plot([_time(t) for t in reply.timeline_stamps], [float(p) for p in reply.timeline_yes_probability],
                      images, args.question).save(args.plot)
        print(f"wrote {args.plot}: {len(reply.timeline_stamps)} point(s), {len(images)} peak frame(s)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.all:
        return run_fleet(args)
    from .client import NodeNotConfigured, NodeNotFound, StreamCacheClient  # noqa: PLC0415

    try:
        client = StreamCacheClient(args.namespace, timeout=args.wait)
    except NodeNotConfigured as err:  # there, and says so at once: not active, as --status says of inactive
        print(f"streamcache-ask: {err}", file=sys.stderr)
        return EXIT_REFUSED
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
