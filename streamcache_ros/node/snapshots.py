"""The memory kept across restarts: parameter ``memory_snapshot_path``, set by the operator (any
path); and the one folder the save_memory / load_memory services may touch, ``snapshot_dir``: any
participant on the ROS domain can call them, so they take names inside it only (no rclpy here).

Rule (docs/reliability.md, "Memory across restarts"): with a path set, the node restores the snapshot there at configure
when the file exists, and writes its memory there (atomically: a temporary file, then a rename) at
shutdown / cleanup, every ``memory_snapshot_period_s`` seconds of ingest when that is > 0, and on
``save_memory`` with an empty path. A snapshot of another model, policy or policy configuration is
refused with an error naming both; the node then starts with an empty memory and does not write
over that file in this run (it is another model's or policy's memory): the memory diagnostic stays
WARN and says so; ``save_memory`` with a path still works.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..engine.errors import ConfigError, SnapshotError
from ..engine.parameters import archive_off


def ros_home() -> str:
    """$ROS_HOME, or ~/.ros, as ROS 2 places its own files."""
    return os.path.expanduser(os.environ.get("ROS_HOME") or os.path.join("~", ".ros"))


def archive_folder(value: str, node_name: str) -> str:
    """The archive's folder for the parameter ``value``: '' when off ('' or 'off'); "default" is
    ``<ROS home>/streamcache/archive/<the node's full name>``, so two nodes never share one."""
    if archive_off(value):
        return ""
    if value != DEFAULT_ARCHIVE:
        return os.path.expanduser(value)
    return os.path.join(ros_home(), "streamcache", "archive", node_name.strip("/").replace("/", "__"))


DEFAULT_ARCHIVE = "default"


def default_snapshot_dir() -> str:
    """``<ROS home>/streamcache/snapshots``: $ROS_HOME, or ~/.ros, as ROS 2 places its own files."""
    home = os.environ.get("ROS_HOME") or os.path.join("~", ".ros")
    return os.path.abspath(os.path.expanduser(os.path.join(home, "streamcache", "snapshots")))


def snapshot_dir(path: str) -> str:
    """The snapshot_dir parameter as the node uses it ('' = the default); ConfigError when it names
    something that is not a directory. It is made (owner-only) at the first save_memory."""
    path = os.path.abspath(os.path.expanduser(path)) if path else default_snapshot_dir()
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("snapshot_dir", f"'{path}' is not a directory")
    return path


def in_snapshot_dir(name: str, folder: str) -> str:
    """The file ``name`` names inside ``folder``, for save_memory / load_memory (docs/interfaces.md,
    "ResetMemory, SaveMemory, LoadMemory"): a relative name with no '..', that no symbolic link
    leads out of ``folder``. ValueError saying why otherwise."""
    where = f"save_memory and load_memory take a file name relative to snapshot_dir ({folder})"
    if os.path.isabs(name):
        raise ValueError(f"'{name}' is an absolute path: {where}")
    if ".." in name.replace("\\", "/").split("/"):
        raise ValueError(f"'{name}' contains '..': {where}")
    path = os.path.join(folder, name)
    real, root = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([real, root]) != root:
        raise ValueError(f"'{name}' leads out of snapshot_dir through a symbolic link: {where}")
    return path


def check_path(path: str) -> str:
    """The path as the node will use it; ConfigError when its directory cannot take a file."""
    if not path:
        return ""
    path = os.path.abspath(os.path.expanduser(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise ConfigError("memory_snapshot_path", f"'{path}' is a directory: name a file in it")
    if not os.path.isdir(folder):
        raise ConfigError("memory_snapshot_path", f"directory '{folder}' does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError("memory_snapshot_path", f"directory '{folder}' is not writable")
    return path


@dataclass
class SnapshotKeeper:
    path: str  # "" = no snapshot kept
    period_s: float = 0.0
    state: str = "none"  # none | restored | started empty | refused
    detail: str = ""  # the log line of the last event
    writable: bool = True  # False once the file at path was refused
    last_write: float = 0.0  # time.monotonic() of the last write

    def restore(self, session) -> str:
        """Load the snapshot into ``session`` when there is one; returns a line for the log."""
        self.last_write = time.monotonic()
        if not self.path:
            return ""
        if not os.path.exists(self.path):
            self.state, self.detail = "started empty", f"no memory snapshot at {self.path} yet: starting empty"
            return self.detail
        try:
            frames = session.load(self.path)
        except SnapshotError as err:
            self.state, self.writable = "refused", False
            self.detail = (f"memory snapshot refused: {err}. Starting with an empty memory; {self.path} is kept "
                           "as it is and will not be written (set memory_snapshot_path to another file)")
            return self.detail
        self.state, self.detail = "restored", f"memory restored from {self.path}: {frames} frames"
        return self.detail

    def due(self) -> bool:
        return bool(self.path) and self.writable and self.period_s > 0 and \
            time.monotonic() - self.last_write >= self.period_s

    def write(self, session, reason: str) -> str:
        """Write ``session``'s memory to the path; returns a line for the log ('' when not written)."""
        if not self.path or not self.writable:
            return ""
        written = session.save(self.path)
        self.last_write = time.monotonic()
        self.detail = f"memory written to {self.path} ({reason}): {written} bytes"
        return self.detail

    def summary(self) -> str:
        if not self.path:
            return "off (memory_snapshot_path is empty)"
        return f"{self.path}: {self.state}" + ("" if self.writable else " (not written: refused at start)")
