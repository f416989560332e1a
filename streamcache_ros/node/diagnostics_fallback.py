"""A small stand-in for the ``diagnostic_updater`` Python module, used only where it is not importable
(a machine with neither the ROS 2 CLI wheelhouse nor a system ROS 2): the same classes the node uses
(Updater, FrequencyStatus, TimeStampStatus, CompositeDiagnosticTask, FunctionDiagnosticTask) with the
same behaviour, levels, messages and keys as upstream diagnostic_updater 3.2, so /diagnostics looks
the same either way. Written from upstream's documented behaviour; nothing else is supported.
"""
from __future__ import annotations

import threading

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR


class DiagnosticStatusWrapper(DiagnosticStatus):
    def summary(self, *args):
        level, message = (args[0].level, args[0].message) if len(args) == 1 else args
        self.level, self.message = level, str(message)

    def mergeSummary(self, *args):  # noqa: N802 - upstream's name
        level, message = (args[0].level, args[0].message) if len(args) == 1 else args
        if (level > OK) == (self.level > OK):
            self.message = self.message + "; " + message if self.message else message
        elif level > self.level:
            self.message = message
        self.level = max(self.level, level)

    def add(self, key, value):
        self.values.append(KeyValue(key=key, value=value))


class DiagnosticTask:
    def __init__(self, name):
        self.name = name

    def getName(self):  # noqa: N802
        return self.name

    def run(self, stat):
        return stat


class FunctionDiagnosticTask(DiagnosticTask):
    def __init__(self, name, fn):
        super().__init__(name)
        self.fn = fn

    def run(self, stat):
        return self.fn(stat)


class CompositeDiagnosticTask(DiagnosticTask):
    """Runs each child on the same status; the result has the highest level and the merged messages."""

    def __init__(self, name):
        super().__init__(name)
        self.tasks = []

    def addTask(self, task):  # noqa: N802
        self.tasks.append(task)

    def run(self, stat):
        combined, original = DiagnosticStatusWrapper(), DiagnosticStatusWrapper()
        original.summary(stat)
        for task in self.tasks:
            stat.summary(original)
            stat = task.run(stat)
            combined.mergeSummary(stat)
        stat.summary(combined)
        return stat


class FrequencyStatusParam:
    def __init__(self, freq_bound, tolerance=0.1, window_size=5):
        self.freq_bound, self.tolerance, self.window_size = freq_bound, tolerance, window_size


class FrequencyStatus(DiagnosticTask):
    """Rate of tick() calls over the last ``window_size`` updates: ERROR with no events, WARN outside
    the bounds (with tolerance)."""

    def __init__(self, params, name="FrequencyStatus"):
        super().__init__(name)
        self.params = params
        self.lock = threading.Lock()
        self.count = 0
        now = Clock(clock_type=ClockType.ROS_TIME).now()
        self.times = [now] * params.window_size
        self.seq_nums = [0] * params.window_size
        self.hist_indx = 0

    def tick(self):
        with self.lock:
            self.count += 1

    def run(self, stat):
        with self.lock:
            now = Clock(clock_type=ClockType.ROS_TIME).now()
            events = self.count - self.seq_nums[self.hist_indx]
            window = (now - self.times[self.hist_indx]).nanoseconds * 1e-9
            freq = events / window if window > 0 else 0.0
            self.seq_nums[self.hist_indx], self.times[self.hist_indx] = self.count, now
            self.hist_indx = (self.hist_indx + 1) % self.params.window_size
            bound, tol = self.params.freq_bound, self.params.tolerance
            if events == 0:
                stat.summary(ERROR, "No events recorded.")
            elif freq < bound["min"] * (1 - tol):
                stat.summary(WARN, "Frequency too low.")
            elif "max" in bound and freq > bound["max"] * (1 + tol):
                stat.summary(WARN, "Frequency too high.")
            else:
                stat.summary(OK, "Desired frequency met")
            stat.add("Events in window", "%d" % events)
            stat.add("Events since startup", "%d" % self.count)
            stat.add("Duration of window (s)", "%f" % window)
            stat.add("Actual frequency (Hz)", "%f" % freq)
            if "max" in bound and bound["min"] == bound["max"]:
                stat.add("Target frequency (Hz)", "%f" % bound["min"])
            if bound["min"] > 0:
                stat.add("Minimum acceptable frequency (Hz)", "%f" % (bound["min"] * (1 - tol)))
            if "max" in bound:
                stat.add("Maximum acceptable frequency (Hz)", "%f" % (bound["max"] * (1 + tol)))
        return stat


class TimeStampStatusParam:
    def __init__(self, min_acceptable=-1, max_acceptable=5):
        self.min_acceptable, self.max_acceptable = min_acceptable, max_acceptable


class TimeStampStatus(DiagnosticTask):
    """How far behind (or ahead of) now the stamps ticked since the last update were."""

    def __init__(self, params=None, name="Timestamp Status"):
        super().__init__(name)
        self.params = params or TimeStampStatusParam()
        self.lock = threading.Lock()
        self.early_count = self.late_count = self.zero_count = 0
        self.zero_seen = self.deltas_valid = False
        self.max_delta = self.min_delta = 0.0

    def tick(self, stamp):
        if not isinstance(stamp, float):
            stamp = stamp.nanoseconds * 1e-9
        with self.lock:
            if stamp == 0:
                self.zero_seen = True
                return
            delta = (Clock(clock_type=ClockType.ROS_TIME).now().nanoseconds - stamp * 1e9) * 1e-9
            if not self.deltas_valid or delta > self.max_delta:
                self.max_delta = delta
            if not self.deltas_valid or delta < self.min_delta:
                self.min_delta = delta
            self.deltas_valid = True

    def run(self, stat):
        with self.lock:
            stat.summary(OK, "Timestamps are reasonable.")
            if not self.deltas_valid:
                stat.summary(WARN, "No data since last update.")
            else:
                if self.min_delta < self.params.min_acceptable:
                    stat.summary(ERROR, "Timestamps too far in future seen.")
                    self.early_count += 1
                if self.max_delta > self.params.max_acceptable:
                    stat.summary(ERROR, "Timestamps too far in past seen.")
                    self.late_count += 1
                if self.zero_seen:
                    stat.summary(ERROR, "Zero timestamp seen.")
                    self.zero_count += 1
            stat.add("Earliest timestamp delay:", "%f" % self.min_delta)
            stat.add("Latest timestamp delay:", "%f" % self.max_delta)
            stat.add("Earliest acceptable timestamp delay:", "%f" % self.params.min_acceptable)
            stat.add("Latest acceptable timestamp delay:", "%f" % self.params.max_acceptable)
            stat.add("Late diagnostic update count:", "%i" % self.late_count)
            stat.add("Early diagnostic update count:", "%i" % self.early_count)
            stat.add("Zero seen diagnostic update count:", "%i" % self.zero_count)
            self.deltas_valid = self.zero_seen = False
            self.min_delta = self.max_delta = 0.0
        return stat


class Updater:
    """Runs its tasks every ``diagnostic_updater.period`` seconds (a node parameter, default 1.0) and
    publishes them on /diagnostics as "<node_name>: <task name>" (the node's name unless set)."""

    def __init__(self, node, period=1.0):
        self.node = node
        self.node_name = node.get_name()
        self.tasks: list[DiagnosticTask] = []
        self.lock = threading.Lock()
        self.hwid = ""
        self.publisher = node.create_publisher(DiagnosticArray, "/diagnostics", 1)
        self.period = node.declare_parameter("diagnostic_updater.period", period).value
        self.timer = node.create_timer(self.period, self.update)

    def add(self, *args):
        task = args[0] if len(args) == 1 else FunctionDiagnosticTask(*args)
        with self.lock:
            self.tasks.append(task)
        starting = DiagnosticStatusWrapper(name=task.getName())
        starting.summary(OK, "Node starting up")
        self.publish([starting])

    def removeByName(self, name):  # noqa: N802
        with self.lock:
            for i, task in enumerate(self.tasks):
                if task.getName() == name:
                    del self.tasks[i]
                    return True
        return False

    def setHardwareID(self, hwid):  # noqa: N802
        self.hwid = hwid

    def update(self):
        statuses = []
        with self.lock:
            for task in self.tasks:
                stat = DiagnosticStatusWrapper(name=task.getName(), hardware_id=self.hwid)
                stat.summary(ERROR, "No message was set")
                statuses.append(task.run(stat))
        self.publish(statuses)

    def force_update(self):
        self.update()

    def publish(self, statuses):
        array = DiagnosticArray()
        array.header.stamp = self.node.get_clock().now().to_msg()
        for stat in statuses:
            array.status.append(DiagnosticStatus(level=stat.level, name=f"{self.node_name}: {stat.name}",
                                                 message=stat.message, hardware_id=stat.hardware_id,
                                                 values=list(stat.values)))
        self.publisher.publish(array)
