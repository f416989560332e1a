"""Parameters changed while the node runs (`ros2 param set`): what may change takes effect, the rest
is refused with the reason and the way (docs/interfaces.md, "Changing parameters at runtime").

May change while configured: ``max_new_tokens`` (the next answer's default), ``sample_fps`` (the
frames waiting for their chunk are encoded at the old rate, then sampling and Qwen2.5-VL's time
stride follow the new one from the next chunk), ``budget_tokens`` of the policies that keep one up
to the budget configured (the next chunk's compression brings the cache to a smaller one, and the
memory diagnostic says the change is pending until then; a larger one than configured is checked
against the model's position range at configure), and the diagnostics' ``camera_min_rate``,
``max_frame_delay`` and ``reset_on_time_jump``, and ``watch_questions`` (asked from the next chunk on).
Everything else is read at configure: a change while
configured is refused, naming a lifecycle reconfigure or a restart; while the node is unconfigured
every change is taken, and checked at the next configure.

``budget_tokens`` 0 stands for the model's own budget: while the node is configured the parameter
shows the budget in force (the model's own for 0, at configure and when 0 is set at runtime), and
shows 0 again once unconfigured, so the next configure takes the model's own again.
"""
from __future__ import annotations

from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from ..engine.errors import ChunkError, ConfigError
from ..engine.parameters import RUNTIME, takes_budget
from ..engine.status import EngineInfo
from . import params
from .cameras import Cameras
from .status import StatusReports
from .standing_questions import StandingQuestions
from .time_questions import watch_questions_refusal

# why a parameter is fixed once configured, by what is built from it
BUILT_FROM = {
    "the model is loaded with it": ("model_path", "device", "dtype", "attention", "vision_backend",
                                    "vision_onnx_path", "vision_onnx_providers"),
    "the session is built with it": ("chunk_frames", "max_question_tokens", "repetition_penalty", "reindex",
                                     "reindex_margin"),
    "the cameras are set up with it": ("camera_topics", "frame_queue_size", "max_image_pixels"),
    "the memory snapshot rules are read with it": ("memory_snapshot_path", "memory_snapshot_period_s", "snapshot_dir"),
    "the cache policy is built with it": ("camera_budget_share", "instant_frames"),
}
HOW = ("change it with a lifecycle reconfigure (ros2 lifecycle set <node> deactivate, then cleanup; ros2 param set; "
       "then configure, activate: the memory starts again from memory_snapshot_path, or empty) or restart the node "
       "with the new value in its params_file (the launch files layer policy_params_file on top of params_file, "
       "then the non-empty override arguments)")


def diagnostic_limits(node, sample_fps: float) -> tuple[float, float]:
    """The cameras' diagnostics' minimum rate (``camera_min_rate``, 0 = ``sample_fps``) and ``max_frame_delay``."""
    min_rate = float(node.get_parameter("camera_min_rate").value) or sample_fps
    return min_rate, float(node.get_parameter("max_frame_delay").value)


class ShownBudget:
    """``budget_tokens`` 0 stands for the model's own budget: while the node is configured the
    parameter shows the budget in force; once unconfigured, 0 again. Lives as long as the node."""

    def __init__(self, node):
        self.node = node
        self.value: int | None = None  # the model's own budget, shown for budget_tokens 0

    def show_in_force(self, session, configured: int, policy: str) -> None:
        """At configure, before anything is tuned: budget_tokens 0 shows the model's own budget, the
        one the policy took."""
        if configured == 0 and takes_budget(policy):
            self.value = session.budget_in_force(0)
            self.node.set_parameters([Parameter("budget_tokens", value=self.value)])

    def show_given(self) -> None:
        """Unconfigured again: budget_tokens shows 0 where that stood for the model's own budget."""
        shown, self.value = self.value, None
        if shown is not None and self.node.get_parameter("budget_tokens").value == shown:
            self.node.set_parameters([Parameter("budget_tokens", value=0)])


class RuntimeTuning:
    """Takes runtime parameter changes into a configured node: rclpy's pre-set, on-set and post-set
    callbacks (the node registers them and hands them here while configured). Given the ``session``
    and its ``info``, the ``configured`` parameter values, ``node`` (its name and parameters),
    ``shown`` (the budget budget_tokens shows), and the parts a change reaches: ``cameras`` (the
    sampling rate), ``status`` (a budget pending), ``questions`` (the standing ones, and who holds them) and
    ``diagnostics`` (their limits)."""

    def __init__(self, session, info: EngineInfo, configured: dict, node, shown: ShownBudget, cameras: Cameras,
                 status: StatusReports, questions: StandingQuestions, diagnostics):
        self.session = session
        self.info = info
        self.configured = configured  # keeps the configured budget: the ceiling of a runtime one
        self.node = node
        self.log = node.get_logger()
        self.shown = shown
        self.cameras = cameras
        self.status = status
        self.questions = questions
        self.diagnostics = diagnostics

    def model_budget_for_zero(self, changed: list) -> list:
        """rclpy's pre-set callback: budget_tokens 0 set while configured is the model's own budget,
        as at configure, and the parameter shows that."""
        if not takes_budget(self.info.policy):
            return changed
        out = []
        for parameter in changed:
            if parameter.name == "budget_tokens" and parameter.type_ == Parameter.Type.INTEGER and parameter.value == 0:
                self.shown.value = self.session.budget_in_force(0)
                parameter = Parameter("budget_tokens", value=self.shown.value)
            out.append(parameter)
        return out

    def refusal(self, name: str, value) -> str:
        """Why ``name`` cannot take ``value`` now ('' = it can)."""
        specs = params.all_specs()
        if name == "watch_questions":
            return watch_questions_refusal(value, self.session)
        if name not in specs or (specs[name].runtime and name != "budget_tokens"):
            return ""  # not ours (use_sim_time, qos_overrides.*), or free to change
        policy = self.info.policy
        if name == "budget_tokens":  # configured 0: the model folder's budget, the one the policy took
            configured = self.session.budget_in_force(int(self.configured["budget_tokens"]))
            if not takes_budget(policy):
                return (f"budget_tokens cannot change: policy {policy} keeps no token budget; "
                        f"to run another policy, {HOW}")
            if int(value) > configured:
                return (f"budget_tokens {value} is above the budget configured ({configured}): a larger budget is "
                        f"checked against the model's position range at configure; {HOW}")
            try:
                self.session.check_runtime(name, int(value))
            except ConfigError as err:
                return str(err)
            return ""
        why = next((text for text, names in BUILT_FROM.items() if name in names),
                   "the cache policy is built with it" if name == "policy" or "." in name else "it is read at configure")
        return f"{name} cannot change while {self.node.get_name()} is configured ({why}): {HOW}"

    def check_changes(self, changed) -> SetParametersResult:
        """rclpy's on-set callback: refuse, saying why and how, what the running node cannot take."""
        for parameter in changed:
            reason = self.refusal(parameter.name, parameter.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def apply(self, changed) -> None:
        """rclpy's post-set callback: apply what was accepted."""
        names = {p.name: p.value for p in changed}
        tuned = {name: names[name] for name in RUNTIME if name in names}
        if tuned:
            self._tune(tuned)
        if "watch_questions" in names:
            self.questions.set_watch_questions(names["watch_questions"])
            self.log.info(f"standing questions now: {list(names['watch_questions']) or 'none'}")
        if {"camera_min_rate", "max_frame_delay", "sample_fps"} & set(names):
            self.diagnostics.set_limits(*diagnostic_limits(self.node, self.cameras.sample_fps))

    def _tune(self, tuned: dict) -> None:
        try:
            self.session.tune(**tuned)
        except ChunkError as err:  # the frames waiting for their chunk failed; the new rate applies
            self.log.error(str(err))
        if "sample_fps" in tuned:
            self.cameras.set_sample_fps(float(tuned["sample_fps"]))
        self.status.refresh(budget_changed="budget_tokens" in tuned)  # configured keeps the ceiling
        self.log.info("changed at runtime: " + ", ".join(f"{k} {v}" for k, v in tuned.items()) +
                      (" (from the next chunk)" if set(tuned) - {"max_new_tokens"} else ""))
