"""``streamcache_node``: start the node (configure + activate unless autostart is false) and spin.

    streamcache_node                                   # bundled tiny model, /camera/image_raw
    streamcache_node --params-file config/streamcache.yaml --namespace streamcache
    streamcache_node --ros-args -p policy:=fifo -p camera_topics:="['/cam_front', '/cam_rear']"

``--params-file`` / ``--namespace`` / ``--name`` are shorthands for the usual ``--ros-args`` rules;
``ros2 launch`` passes ``--ros-args`` itself. A bad parameter (or a model that cannot be loaded) ends
the process with exit code 2 and one line naming the parameter.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# A robot's CPU is shared with other nodes: OpenMP threads that spin while they wait for a core made
# blocked prefill and HERMES compression several times slower on a loaded CPU (docs/performance.md
# "Prefill in blocks"); passive waiting costs nothing on an idle one. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

EXIT_CONFIG = 2
PROG = "streamcache_node"
SPIN_CHECK_S = 0.2  # how often the spin loop looks for a stop request


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return EXIT_CONFIG


def ros_arguments(argv: list[str]) -> list[str]:
    """Our shorthands turned into --ros-args rules; the command line's own --ros-args come after
    (so they win)."""
    from rclpy.utilities import remove_ros_args  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog=PROG, description="The streamcache_ros node.")
    parser.add_argument("--params-file", action="append", default=[], help="a ROS 2 parameters YAML (repeatable)")
    parser.add_argument("--namespace", help="the node's namespace (the launch files use 'streamcache')")
    parser.add_argument("--name", help="the node's name (default streamcache_node)")
    try:
        own = remove_ros_args(argv)[1:]
    except Exception as err:  # noqa: BLE001 - rcl's RCLInvalidROSArgsError: say it in one line
        raise ValueError(f"bad --ros-args: {str(err).split(', at ')[0]}") from None
    args = parser.parse_args(own)
    rules = []
    for path in args.params_file:
        check_params_file(path)
        rules += ["--params-file", path]
    if args.namespace:
        rules += ["-r", f"__ns:={'/' + args.namespace.lstrip('/')}"]
    if args.name:
        rules += ["-r", f"__node:={args.name}"]
    return [argv[0]] + (["--ros-args", *rules, "--"] if rules else []) + argv[1:]


def check_params_file(path: str) -> None:
    """What rcl would refuse (with a log line of its own before the error) said in one line here."""
    import yaml  # noqa: PLC0415

    if not os.path.isfile(path):
        raise ValueError(f"parameters file '{path}' does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            content = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"parameters file '{path}' is not readable YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(content, dict) or not all(
            isinstance(section, dict) and isinstance(section.get("ros__parameters"), dict)
            for section in content.values()):
        raise ValueError(f"parameters file '{path}' is not a ROS 2 parameters file "
                         "(<node name or /**>: ros__parameters: {...})")


class StopSignals:
    """SIGINT and SIGTERM while the node runs: a stop request, nothing more.

    rclpy's own handlers shut the ROS context down at once and then raise KeyboardInterrupt wherever the
    main thread happens to be: everything logged afterwards (the memory snapshot written at stop) failed
    with "Failed to publish log message to rosout: publisher's context is invalid", and an interrupt
    landing in a finaliser printed a traceback (docs/reliability.md, "Lifecycle"). Here a signal only
    asks the spin loop to end; the node stops, logs and is destroyed while the context is valid, then
    the context is shut down. While the node is still starting (a model loading) a signal interrupts
    that at once, as before: a stop, not a failed start.
    """

    def __init__(self):
        self.requested = threading.Event()
        self.starting = True
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)
        # a finaliser (a logger's __del__) interrupted while starting: a stop, nothing to print
        previous_hook = sys.unraisablehook
        sys.unraisablehook = lambda args: None if isinstance(args.exc_value, KeyboardInterrupt) else previous_hook(args)

    def _handle(self, signum, frame) -> None:
        self.requested.set()
        if self.starting:
            self.starting = False
            raise KeyboardInterrupt


def spin(node, stop: StopSignals) -> None:
    """Serve until a stop signal or the lifecycle shutdown transition."""
    from .executor import NodeExecutor  # noqa: PLC0415

    # cameras (one thread each) + questions + action + timers + diagnostics, none waiting on another
    executor = NodeExecutor(num_threads=len(node.values["camera_topics"]) + 6)
    executor.add_node(node)
    try:
        while not stop.requested.is_set() and not node.finalized:
            executor.spin_once(timeout_sec=SPIN_CHECK_S)
    finally:
        executor.shutdown(timeout_sec=5.0)  # callbacks in progress end first


def main(argv: list[str] | None = None) -> int:
    """The process's entry point: runs the node, then ends the process at once with its exit code
    (``end_process``); it does not return."""
    end_process(run(argv))


def end_process(code: int) -> None:
    """End the process now, with ``code``, once everything of ours is closed (the node destroyed,
    the ROS context shut down, the log flushed), without the interpreter's teardown.

    That teardown frees torch's and rclpy's / Fast DDS's native objects (thread pools, the DDS
    participant's factory, their static singletons) in an order neither library controls, while their
    threads may still run; on a bad parameter (model loaded, exit code 2) it once ended in a SIGSEGV
    with no output instead of exit code 2 (docs/reliability.md, "Bad configuration"). Nothing is left
    for it to do: every file we write is closed and renamed before this point (the memory snapshot), and
    the C and Python output buffers are flushed here.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more can be said
            pass
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None).fflush(None)  # rcutils may log through C stdio (RCUTILS_LOGGING_BUFFERED_STREAM)
    except Exception:  # noqa: BLE001 - no libc to flush: nothing buffered there
        pass
    os._exit(code)


def run(argv: list[str] | None = None) -> int:
    """Start the node, serve until a stop, and clean up; returns the exit code (0, or 2 for a bad
    parameter)."""
    argv = list(sys.argv if argv is None else argv)
    try:
        args = ros_arguments(argv)
    except ValueError as err:
        return _fail(str(err))

    import rclpy  # noqa: PLC0415
    from rclpy.lifecycle import TransitionCallbackReturn  # noqa: PLC0415
    from rclpy.signals import SignalHandlerOptions  # noqa: PLC0415

    from ..engine.errors import ConfigError  # noqa: PLC0415
    from .node import StreamCacheNode  # noqa: PLC0415

    stop = StopSignals()
    node = None
    try:
        try:
            rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        except Exception as err:  # noqa: BLE001 - rcl's parser: a malformed --params-file or rule
            return _fail(f"cannot start ROS 2: {str(err).splitlines()[0]}")
        try:
            node = StreamCacheNode()
        except ConfigError as err:
            return _fail(str(err))
        if node.autostart:
            for transition, name in ((node.trigger_configure, "configure"), (node.trigger_activate, "activate")):
                if transition() != TransitionCallbackReturn.SUCCESS:
                    if stop.requested.is_set():  # SIGINT / SIGTERM while starting: a stop, not a bad parameter
                        return 0
                    return _fail(node.configure_error or f"{name} failed")
        stop.starting = False
        if not stop.requested.is_set():
            spin(node, stop)
    except KeyboardInterrupt:
        pass  # a signal while starting: a clean exit
    finally:
        stop.starting = False
        if node is not None:
            node.stop()  # questions and ingest end, the snapshot is written and logged
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    main()
