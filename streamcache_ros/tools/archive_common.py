"""What streamcache-archive's subcommands share (archive_cli.py, archive_map.py): exit codes, the
one-line refusal, how stamps, cameras and --since/--until read."""
from __future__ import annotations

import datetime
import math

EXIT_NOTHING, EXIT_REFUSED = 1, 2


class Refused(Exception):
    """One line for stderr, and exit code 2."""


def _stamp(value: float) -> str:
    """A stamp as seconds, and as a UTC time when it looks like wall-clock time."""
    if value > 1e9:
        when = datetime.datetime.fromtimestamp(value, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        return f"{value:.2f} ({when} UTC)"
    return f"{value:.2f}"


def _camera(name: str) -> str:
    return name or "(default camera)"  # a single-camera node names its camera ''


def _span(args) -> tuple[float, float]:
    since = -math.inf if args.since is None else args.since
    until = math.inf if args.until is None else args.until
    if since > until:
        raise Refused(f"--since {args.since} is after --until {args.until}")
    return since, until
