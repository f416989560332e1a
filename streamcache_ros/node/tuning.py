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
from ..engine.factory import check_budget, reference_unit, resolved_budget_tokens
from ..engine.parameters import RUNTIME, takes_budget
from . import params

# why a parameter is fixed once configured, by what is built from it
BUILT_FROM = {
    "the model is loaded with it": ("model_path", "device", "dtype", "attention", "vision_backend",
                                    "vision_onnx_path", "vision_onnx_providers"),
    "the session is built with it": ("chunk_frames", "max_question_tokens", "repetition_penalty", "reindex",
                                     "reindex_margin"),
    "the cameras are set up with it": ("camera_topics", "frame_queue_size", "max_image_pixels"),
    "the memory snapshot rules are read with it": ("memory_snapshot_path", "memory_snapshot_period_s", "snapshot_dir"),
}
HOW = ("change it with a lifecycle reconfigure (ros2 lifecycle set <node> deactivate, then cleanup; ros2 param set; "
       "then configure, activate: the memory starts again from memory_snapshot_path, or empty) or restart the node "
       "with the new value in its params_file (the launch files layer policy_params_file on top of params_file, "
       "then the non-empty override arguments)")


class RuntimeTuning:
    """Mixed into the node (node.py), which owns ``session``, ``values``, ``cameras``, ``diagnostics``."""

    def _watch_parameters(self) -> None:
        self._budget_shown: int | None = None  # the model's own budget, shown for budget_tokens 0
        self._budget_changed = False  # budget_tokens was set at runtime ...
        self._chunk_before_budget = None  # ... after this chunk: the memory comes to it at the next one
        self.add_pre_set_parameters_callback(self._model_budget_for_zero)
        self.add_on_set_parameters_callback(self._check_parameter_changes)
        self.add_post_set_parameters_callback(self._on_parameters_set)

    def _show_budget_in_force(self, session) -> None:
        """At configure, before ``session`` is the node's (so nothing is tuned): budget_tokens 0
        shows the model's own budget, the one the policy took."""
        self._budget_changed = False
        if int(self.values["budget_tokens"]) == 0 and takes_budget(session.info().policy):
            self._budget_shown = resolved_budget_tokens(0, session.adapter)
            self.set_parameters([Parameter("budget_tokens", value=self._budget_shown)])

    def _show_budget_given(self) -> None:
        """Unconfigured again: budget_tokens shows 0 where that stood for the model's own budget."""
        shown, self._budget_shown = self._budget_shown, None
        if shown is not None and self.get_parameter("budget_tokens").value == shown:
            self.set_parameters([Parameter("budget_tokens", value=0)])

    def _model_budget_for_zero(self, changed: list) -> list:
        """rclpy's pre-set callback: budget_tokens 0 set while configured is the model's own budget,
        as at configure, and the parameter shows that."""
        if self.session is None or self.info is None or not takes_budget(self.info.policy):
            return changed
        out = []
        for parameter in changed:
            if parameter.name == "budget_tokens" and parameter.type_ == Parameter.Type.INTEGER and parameter.value == 0:
                self._budget_shown = resolved_budget_tokens(0, self.session.adapter)
                parameter = Parameter("budget_tokens", value=self._budget_shown)
            out.append(parameter)
        return out

    def budget_pending(self, status) -> bool:
        """A budget set at runtime and no chunk compressed since (``status``: the session's)."""
        return self._budget_changed and status.last_chunk is self._chunk_before_budget

    def _refusal(self, name: str, value) -> str:
        """Why ``name`` cannot take ``value`` now ('' = it can)."""
        specs = params.all_specs()
        if name == "watch_questions":
            return self._watch_questions_changed(value)  # time_questions.py
        if name not in specs or (specs[name].runtime and name != "budget_tokens"):
            return ""  # not ours (use_sim_time, qos_overrides.*), or free to change
        policy = self.info.policy
        if name == "budget_tokens":  # configured 0: the model folder's budget, the one the policy took
            configured = resolved_budget_tokens(int(self.values["budget_tokens"]), self.session.adapter)
            if not takes_budget(policy):
                return (f"budget_tokens cannot change: policy {policy} keeps no token budget; "
                        f"to run another policy, {HOW}")
            if int(value) > configured:
                return (f"budget_tokens {value} is above the budget configured ({configured}): a larger budget is "
                        f"checked against the model's position range at configure; {HOW}")
            try:
                adapter = self.session.adapter
                check_budget(adapter, int(value), reference_unit(adapter).tokens_per_unit)
            except ConfigError as err:
                return str(err)
            return ""
        why = next((text for text, names in BUILT_FROM.items() if name in names),
                   "the cache policy is built with it" if name == "policy" or "." in name else "it is read at configure")
        return f"{name} cannot change while {self.get_name()} is configured ({why}): {HOW}"

    def _check_parameter_changes(self, changed) -> SetParametersResult:
        """rclpy's on-set callback: refuse, saying why and how, what the running node cannot take."""
        if self.session is None or self.info is None:  # unconfigured: taken, checked at configure
            return SetParametersResult(successful=True)
        for parameter in changed:
            reason = self._refusal(parameter.name, parameter.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def _on_parameters_set(self, changed) -> None:
        """rclpy's post-set callback: apply what was accepted."""
        names = {p.name: p.value for p in changed}
        session = self.session
        if session is not None:
            tuned = {name: names[name] for name in RUNTIME if name in names}
            if tuned:
                self._tune(session, tuned)
        if "watch_questions" in names and session is not None:
            self.set_watch_questions(names["watch_questions"])
            self.get_logger().info(f"standing questions now: {list(names['watch_questions']) or 'none'}")
        if self.diagnostics is not None and {"camera_min_rate", "max_frame_delay", "sample_fps"} & set(names):
            self.diagnostics.set_limits(*self._diagnostic_limits())

    def _tune(self, session, tuned: dict) -> None:
        try:
            session.tune(**tuned)
        except ChunkError as err:  # the frames waiting for their chunk failed; the new rate applies
            self.get_logger().error(str(err))
        if "sample_fps" in tuned:
            self.sample_fps = float(tuned["sample_fps"])
            for camera in list(self.cameras.values()):
                camera.counters.restart_sampling(self.sample_fps)
        self._refresh_status(budget_changed="budget_tokens" in tuned)  # self.values keeps the configured ceiling
        self.get_logger().info("changed at runtime: " + ", ".join(f"{k} {v}" for k, v in tuned.items()) +
                               (" (from the next chunk)" if set(tuned) - {"max_new_tokens"} else ""))

    def _diagnostic_limits(self) -> tuple[float, float]:
        min_rate = float(self.get_parameter("camera_min_rate").value) or self.sample_fps
        return min_rate, float(self.get_parameter("max_frame_delay").value)
