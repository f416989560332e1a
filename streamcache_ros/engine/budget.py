"""What a token budget means on one model: the budget ``budget_tokens`` stands for, and whether it
holds one frame. Read by the factory at build time and by the Session for a runtime change."""
from __future__ import annotations

import numpy as np

from .adapters import ModelAdapter, VisionInputs
from .errors import ConfigError
from .parameters import ENGINE_PARAMETERS, REFERENCE_FRAME


def resolved_budget_tokens(budget: int, adapter: ModelAdapter) -> int:
    """The budget ``budget_tokens`` stands for: itself, or for 0 the model folder's own (the bundled
    world models carry one that binds within the demo's stream), else the declaration's fallback."""
    return (budget or int(getattr(adapter, "model_settings", {}).get("budget_tokens", 0))
            or ENGINE_PARAMETERS["budget_tokens"].fallback)


# A budget this many times the model folder's own is all but a full cache on that model: said, in
# case a YAML meant for another model set it (docs/interfaces.md "Parameters").
FAR_ABOVE_MODEL_BUDGET = 8


def far_above_model_budget(budget: int, adapter: ModelAdapter) -> str:
    """'' unless ``budget_tokens`` (as given, 0 = the model's own) is more than FAR_ABOVE_MODEL_BUDGET
    times the model folder's own budget; then a line naming both."""
    own = int(getattr(adapter, "model_settings", {}).get("budget_tokens", 0))
    if not budget or not own or budget <= FAR_ABOVE_MODEL_BUDGET * own:
        return ""
    return (f"budget_tokens {budget} is {budget / own:.0f} times the budget of {adapter.model_id} ({own}, from its "
            f"folder's streamcache.json): on this model that is all but a full cache; budget_tokens 0 takes the "
            f"model's own")


def reference_unit(adapter: ModelAdapter) -> VisionInputs:
    """One stream unit of REFERENCE_FRAME-sized frames, preprocessed: what budgets are checked against."""
    return adapter.preprocess([np.zeros((*REFERENCE_FRAME, 3), np.uint8)] * adapter.frames_per_unit)


def check_budget(adapter: ModelAdapter, budget: int, per_unit: int) -> None:
    if budget < per_unit:
        raise ConfigError("budget_tokens", f"{budget} cannot hold one frame: a {REFERENCE_FRAME[1]}x"
                                           f"{REFERENCE_FRAME[0]} frame is {per_unit} tokens on {adapter.model_id}")
