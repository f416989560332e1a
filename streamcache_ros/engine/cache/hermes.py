"""``hermes``: layer-managed KV cache (docs/hermes.md; the rules themselves are in hermes_rules.py).

After every chunk, when the cache holds more than ``budget_tokens`` (prefix included, §2), each
layer keeps the system prefix plus its top-M video tokens by a score that mixes recency (shallow
layers), the attention of a guidance prompt (deep layers) or both (middle layers), smoothed from
deep to shallow. Deep layers fold what they drop into one summary token. Positions are per layer
(§3); they are renumbered (and the kept keys rotated by the delta) when they near the model's range
(lazy) or at every shrink (eager).

The guidance prompts' queries come from the model: the policy says which prompts and layers it needs
(``guidance_request``) and the session passes the un-rotated q/k tensors in (``ChunkContext``).
The mid-layer schedule and where the reference rounds the guidance attention differ by model
family: the adapter's ``FamilyTraits`` presets fill them in. Modes (docs/hermes.md): ``mrope_rotation``
per_layer (default; fixes D1) | layer0 (reference); ``mrope_reindex`` shift (default) | dense_rank
(reference, D5); ``guidance_queries`` embedding (reference, D3, default) | hidden.

With ``instant_frames`` the instant window's tokens are taken out of every layer while HERMES
decides (instant.py, ``LayerwisePolicy.instant_aside``): the budget, the scores, the guidance and
the summary token are those of the past alone, as if the window's frames had not come yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .types import ChunkContext, ChunkOutcome, GuidancePass, GuidancePrompt, GuidanceRequest, NewTokens
from .clocks import NO_CLOCK, camera_share_setting, clocks_held, fair_shares, on_clock
from .hermes_rules import (DEEP, GLOBAL_PROMPT, LOCAL_PROMPT, MID, ROLE_PROMPT, SHALLOW, frame_keep_indices,
                           guidance_attention, guidance_prompts, keep_indices, layer_budget, layer_roles, layer_split,
                           mid_progress, pruned_indices, raw_scores, recency_norm, recency_weight_and_rate,
                           sanitize_keep, smooth_scores, summary_token)
from .instant import instant_setting
from .layerwise import LayerwisePolicy, LayerwiseSettings, budget_setting
from .rope import apply_rotary
from .settings import SettingError, setting
from .units import SUMMARY_UNIT

UNIT_RANGE = {"low": 0.0, "high": 1.0}


@dataclass(frozen=True)
class HermesSettings(LayerwiseSettings):
    budget_tokens: int = budget_setting()
    camera_budget_share: str = camera_share_setting()
    instant_frames: int = instant_setting()
    mrope_rotation: str = setting("per_layer", "M-RoPE models: per_layer (each layer's keys rotated at its own "
                                               "positions; fixes D1) | layer0 (the reference: at layer 0's)",
                                  choices=("per_layer", "layer0"), aliases=("qwen_rope",))
    guidance_queries: str = setting("embedding", "Guidance queries: embedding (the reference, D3: each layer's q/k "
                                                 "from the token embeddings) | hidden (from the layer's own input)",
                                    choices=("embedding", "hidden"))
    shallow_end_ratio: float = setting(0.1, "Shallow layers: l < int(ratio * L)", **UNIT_RANGE)
    deep_start_ratio: float = setting(0.7, "Deep layers: l >= int(ratio * L)", **UNIT_RANGE)
    shallow_omega: float = setting(1.0, "Recency weight of shallow layers", **UNIT_RANGE)
    shallow_k: float = setting(20.0, "Forgetting rate of shallow layers")
    deep_omega: float = setting(0.0, "Recency weight of deep layers", **UNIT_RANGE)
    deep_k: float = setting(0.0, "Forgetting rate of deep layers")
    mid_omega: list = setting([], "Mid layers' recency weight omega = a - b*p as [a, b] (p: 0 at the first mid "
                                  "layer); [] = the model family's preset", preset=True, fallback=[1.0, 0.9])
    mid_k: list = setting([], "Mid layers' forgetting rate k = a - b*p as [a, b]; [] = the model family's preset",
                          preset=True, fallback=[20.0, 19.5])
    lambda_shallow: float = setting(0.1, "Cross-layer smoothing weight of a shallow layer", **UNIT_RANGE)
    lambda_mid: float = setting(0.3, "Cross-layer smoothing weight of a mid layer", **UNIT_RANGE)
    lambda_deep: float = setting(0.4, "Cross-layer smoothing weight of a deep layer", **UNIT_RANGE)
    norm_eps: float = setting(1e-6, "Min-max normalisation guard", low=0.0)
    summary: bool = setting(True, "Deep layers fold the tokens they prune into one summary token")
    selection: str = setting("tokens", "tokens (§9: each layer's top-M tokens) | frames (whole stream units ranked "
                                       "by their tokens' mean score, docs/hermes.md \"Selection by frames\")",
                             choices=("tokens", "frames"))
    score_dtype: str = setting("float32", "float32 | model (round the guidance attention to the model's dtype "
                                          "where the fp16 reference does)", choices=("float32", "model"))
    score_rounding: str = setting("", "With score_dtype model: round after the float32 softmax (softmax) or the "
                                      "logits before it (logits); '' = the model family's preset",
                                  choices=("softmax", "logits"), preset=True, fallback="softmax")
    local_prompt: str = setting(LOCAL_PROMPT, "Guidance text of the shallow layers")
    global_prompt: str = setting(GLOBAL_PROMPT, "Guidance text of the deep layers")

    def validate(self) -> None:
        if not self.shallow_end_ratio <= self.deep_start_ratio:
            raise SettingError("shallow_end_ratio", f"must be <= deep_start_ratio, got {self.shallow_end_ratio} "
                                                    f"and {self.deep_start_ratio}")
        for name in ("mid_omega", "mid_k"):
            value = getattr(self, name)
            if value and len(value) != 2:
                raise SettingError(name, f"must be two numbers [value at p=0, drop over p 0->1], got {value!r}")

    @property
    def lambdas(self) -> dict[str, float]:
        return {SHALLOW: self.lambda_shallow, MID: self.lambda_mid, DEEP: self.lambda_deep}


class HermesPolicy(LayerwisePolicy):
    name = "hermes"
    settings_class = HermesSettings
    needs_guidance = True

    def __init__(self, settings: HermesSettings | None = None, **params):
        super().__init__(settings, **params)
        self.roles: list[str] = []
        self.schedule: list[tuple[float, float]] = []  # (ω, k) per layer
        self._layer0_offset = 0.0

    def setup(self, geometry) -> None:
        super().setup(geometry)  # fills the family's presets (mid schedule, rounding) into the settings
        s = self.settings
        layers = geometry.num_layers
        shallow_end, deep_start = layer_split(layers, s.shallow_end_ratio, s.deep_start_ratio)
        self.roles = layer_roles(layers, shallow_end, deep_start)
        self.schedule = [
            recency_weight_and_rate(role, mid_progress(i, shallow_end, deep_start) if role == MID else 0.0,
                                    (s.shallow_omega, s.shallow_k), s.mid_omega, s.mid_k, (s.deep_omega, s.deep_k))
            for i, role in enumerate(self.roles)]

    # -- positions ------------------------------------------------------------------------------
    def rotary_positions(self, layer: int, positions: torch.Tensor, new: NewTokens) -> torch.Tensor:
        if self.settings.mrope_rotation != "layer0" or self.geometry.traits.rope_layout != "mrope":
            return positions
        # D1 (reference): every layer's new tokens rotated at layer 0's positions, while each layer
        # records its own; layer 0 is called first in every forward pass, before it appends
        if layer == 0:
            self._layer0_offset = self.layers[0].next_offset(new.clock)
        return new.rel_positions.to(positions.device) + self._layer0_offset

    def guidance_positions(self, layer: int, count: int, clock: int | None = None) -> torch.Tensor:
        """§6: guidance tokens sit at the layer's own next positions (all M-RoPE axes equal): after
        every position held, or on a camera's ``clock`` when it scores that camera alone."""
        store = self.layers[layer]
        return self.geometry.rotary.text_positions(store.next_offset(clock), count, store.positions.device)

    # -- compression ----------------------------------------------------------------------------
    def guidance_request(self, history: list, context: ChunkContext | None = None) -> GuidanceRequest | None:
        """§5: the prompts whose attention the next compression reads, and the layers reading each.
        None when nothing will be pruned (D15) or no layer reads attention (ω = 1 everywhere, D2).
        With an instant window, decided on the past alone, as the compression will be: ``context``
        gives the new units' frames (a unit no context named counts one frame)."""
        if context is not None:
            self.window.record(context.unit_frames)
        with self.instant_aside():
            if len(self.layers[0]) <= self.budget_tokens or self._nothing_pruned(self.prefix_len()):
                return None
        return self.guidance_for(history)

    def guidance_for(self, history: list) -> GuidanceRequest | None:
        """The prompts and layers of a compression that prunes (None where no layer reads attention)."""
        s = self.settings
        texts = guidance_prompts(history, s.local_prompt, s.global_prompt)
        prompts = []
        for prompt in ("local", "global", "mixed"):
            layers = [i for i, role in enumerate(self.roles)
                      if ROLE_PROMPT[role] == prompt and self.schedule[i][0] != 1.0]
            if layers:
                prompts.append(GuidancePrompt(texts[prompt], layers))
        return GuidanceRequest(prompts, s.guidance_queries) if prompts else None

    @torch.inference_mode()
    def compress(self, context: ChunkContext) -> ChunkOutcome:
        outcome = ChunkOutcome(details={"summary_tokens": 0, "guidance_passes": 0})
        reindex_events = self.reindex_events
        self.window.record(context.unit_frames)
        with self.instant_aside() as aside:
            pruning = len(self.layers[0]) > self.budget_tokens  # §2: layer 0's length, prefix included
            if pruning:
                # §10: the re-index decision is taken once, on the positions before the shrink
                changed = self.shrinking_clocks()
                compact = [] if aside else self.due_clocks(changed)  # (every camera's clock decides for itself)
                keep = self.select(context.guidance, outcome)
                self.shrink(keep, compact, outcome)
        if pruning and aside:
            # with the instant window back, so that a re-index renumbers it with the past (the
            # lazy decision reads the positions after the shrink: the window still holds the largest)
            due = self.due_clocks(changed)
            if due:
                self.reindex(clocks=due)
        elif not pruning and self.max_position() > self.rule.threshold:
            # positions still have to stay in range (not reached with the defaults)
            self.reindex(clocks=[c for c in self.clock_ids() if self.max_position(c) > self.rule.threshold])
        outcome.reindexed = self.reindex_events > reindex_events
        self.arriving = None
        self.window.forget(self.layers[0].units)
        return outcome

    def slots(self, prefix_len: int) -> list[int]:
        """§9: the video tokens each layer keeps."""
        return [sum(lanes.values()) for lanes in self.lane_slots(prefix_len)]

    def lane_slots(self, prefix_len: int) -> list[dict[int, int]]:
        """§9 per layer and camera clock: the video tokens each keeps (docs/hermes.md "Cameras").

        One camera, or ``camera_budget_share: shared``: one entry for every clock, M (deep layers
        M − 1, less one more for each further camera, whose summary needs a slot too).

        ``equal``: each camera keeps what it would alone with its budget M_c, the fair share of M by
        its tokens in layer 0 plus one (so that a camera that fits keeps everything, its deep layers
        too, and makes no summary). A camera is compressed when its chunk just came in (as it would
        be alone) or when it holds more than M_c (another camera took part of its share); any other
        keeps what it holds, so a busy camera's chunks do not wear a quiet camera's memory down."""
        lanes = self.lanes(self.layers[0])
        if len(lanes) <= 1:
            out = []
            for role, store in zip(self.roles, self.layers):
                clocks = len(clocks_held(store.units, store.clocks))
                extra = max(clocks - 1, 0) if role == DEEP and self.settings.summary else 0
                out.append({lanes[0] if lanes else NO_CLOCK: layer_budget(
                    role, self.budget_tokens - extra, len(store) - prefix_len, self.settings.summary)})
            return out
        first = self.layers[0].clocks[prefix_len:]
        held = {c: int((first == c).sum()) for c in lanes}
        budgets = fair_shares({c: n + int(self.settings.summary) for c, n in held.items()}, self.budget_tokens)
        due = {c for c in lanes if c == self.arriving or held[c] > budgets[c]}
        out = []
        for role, store in zip(self.roles, self.layers):
            candidates = store.clocks[prefix_len:]
            counts = {c: int((candidates == c).sum()) for c in lanes}
            out.append({c: layer_budget(role, budgets[c], counts[c], self.settings.summary) if c in due else counts[c]
                        for c in lanes})
        return out

    def shrinking_clocks(self) -> list[int]:
        """The clocks the coming shrink changes: every clock, but with a share each
        (``camera_budget_share: equal``) only the chunk's own and those that lose tokens."""
        prefix_len = self.prefix_len()
        slots = self.lane_slots(prefix_len)
        if all(len(lanes) == 1 for lanes in slots) or self.arriving is None:
            return self.clock_ids()
        losing = {c for store, lanes in zip(self.layers, slots) for c, n in lanes.items()
                  if n < int((store.clocks[prefix_len:] == c).sum())}
        return sorted(losing | {self.arriving})

    def _nothing_pruned(self, prefix_len: int) -> bool:
        return all(s == len(store) - prefix_len for s, store in zip(self.slots(prefix_len), self.layers))

    def select(self, guidance: list[GuidancePass] | None, outcome: ChunkOutcome | None = None) -> list[torch.Tensor]:
        """Keep indices per layer (§6-§9)."""
        prefix_len = self.prefix_len()
        if self._nothing_pruned(prefix_len):
            # D15: nothing will be pruned, so the guidance passes cannot change the selection
            return [torch.arange(len(store)) for store in self.layers]
        if outcome is not None:
            outcome.details["guidance_passes"] = len(guidance or [])
        clocks = self.clock_ids()
        if len(clocks) <= 1:
            return self.plan(self.layer_attention(guidance, prefix_len), prefix_len)
        return self.plan_per_camera(guidance, prefix_len, clocks)

    def plan(self, attention: list[torch.Tensor | None], prefix_len: int) -> list[torch.Tensor]:
        """§7-§9 from each layer's pooled guidance attention (None where a layer's ω = 1 makes it unused)."""
        refined = self.refine(attention, [len(store) - prefix_len for store in self.layers])
        if self.settings.selection == "frames":
            return [frame_keep_indices(score, store.units[prefix_len:].to(score.device), slots, prefix_len)
                    for score, slots, store in zip(refined, self.slots(prefix_len), self.layers)]
        return [keep_indices(score, slots, prefix_len) for score, slots in zip(refined, self.slots(prefix_len))]

    def refine(self, attention: list[torch.Tensor | None], counts: list[int]) -> list[torch.Tensor]:
        """§7-§8: each layer's raw scores of its ``counts`` candidates, smoothed across layers."""
        eps = self.settings.norm_eps
        raw = []
        for store, (omega, k), attn, count in zip(self.layers, self.schedule, attention, counts):
            if attn is None:  # ω = 1: the reference's 0·attention + 1·recency is the recency term exactly
                raw.append(recency_norm(count, k, eps, store.keys.device) if count else torch.empty(0))
            else:
                raw.append(raw_scores(attn, omega, k, eps))
        return smooth_scores(raw, self.roles, self.settings.lambdas)

    def plan_per_camera(self, guidance: list[GuidancePass] | None, prefix_len: int,
                        clocks: list[int]) -> list[torch.Tensor]:
        """§6-§9 with several cameras, each scored on its own as if it were alone (docs/hermes.md
        "Cameras"): the guidance attends over the prefix and that camera's tokens from its clock,
        recency ranks, min-max and the smoothing run over its candidates. ``equal`` shares: each
        camera keeps its top slots; ``shared``: the top M over every camera's scores."""
        scores = [torch.zeros(len(store) - prefix_len) for store in self.layers]
        for clock in clocks:
            columns = [torch.nonzero(store.clocks[prefix_len:] == clock).flatten().cpu() for store in self.layers]
            refined = self.refine(self.layer_attention(guidance, prefix_len, clock), [len(c) for c in columns])
            for score, cols, mine in zip(scores, columns, refined):
                if len(cols):
                    score[cols] = mine.float().cpu()
        out = []
        for score, lanes, store in zip(scores, self.lane_slots(prefix_len), self.layers):
            if len(lanes) == 1:
                slots = next(iter(lanes.values()))
                out.append(frame_keep_indices(score, store.units[prefix_len:].cpu(), slots, prefix_len)
                           if self.settings.selection == "frames" else keep_indices(score, slots, prefix_len))
                continue
            candidates = store.clocks[prefix_len:].cpu()
            kept = [torch.nonzero(candidates == c).flatten()[torch.topk(score[candidates == c], n, sorted=False).indices]
                    for c, n in lanes.items() if n]
            kept = torch.sort(torch.cat(kept)).values if kept else torch.empty(0, dtype=torch.long)
            out.append(torch.cat((torch.arange(prefix_len), kept + prefix_len)))
        return out

    def layer_attention(self, guidance: list[GuidancePass] | None, prefix_len: int,
                        clock: int | None = None) -> list[torch.Tensor | None]:
        """§5-§6: each layer's guidance attention on its candidates, from the un-rotated guidance
        q/k the session computed. A layer with ω = 1 gives its attention weight 0 (D2: the local
        prompt of the shallow layers), so none is asked for it. With ``clock``: over the prefix
        and that camera's tokens only, the guidance on its clock (docs/hermes.md "Cameras")."""
        if guidance is None and any(omega != 1.0 for omega, _ in self.schedule):
            raise ValueError("hermes needs the guidance q/k its guidance_request asked for (ChunkContext.guidance)")
        rotary = self.geometry.rotary
        dtype = self.geometry.dtype
        reference_rounding = self.settings.score_dtype == "model"
        # §6 precision: the LLaVA reference rounds the fp32 softmax to the model dtype, the Qwen one the logits
        logits_first = reference_rounding and self.settings.score_rounding == "logits"
        softmax_dtype = dtype if logits_first else torch.float32
        weights_dtype = dtype if reference_rounding else torch.float32
        attention: list[torch.Tensor | None] = [None] * len(self.layers)
        for guidance_pass in guidance or []:
            for i, (q, k) in zip(guidance_pass.layers, guidance_pass.qk):
                store = self.layers[i]
                at = (self.guidance_positions(i, guidance_pass.length) if clock is None
                      else self.guidance_positions(i, guidance_pass.length, clock))
                cos, sin = rotary.cos_sin(at, q.dtype)
                keys = store.keys
                if clock is not None:
                    keys = keys.index_select(2, torch.nonzero(on_clock(store.units, store.clocks, clock)).flatten())
                attention[i] = guidance_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin),
                                                  keys, prefix_len, softmax_dtype, weights_dtype)
        return attention

    def shrink(self, keep: list[torch.Tensor], compact: bool | list[int],
               outcome: ChunkOutcome | None = None) -> None:
        """§10: keep the kept tokens (in place, store.py), re-index them when ``compact``, fold the
        pruned ones of deep layers into a summary token, one per camera clock that lost tokens
        (docs/hermes.md "Cameras"); layer after layer, each whole. ``compact``: re-index every
        clock (True) or those listed."""
        rotary = self.geometry.rotary
        for role, store, indices in zip(self.roles, self.layers, keep):
            length = len(store)
            safe = sanitize_keep(indices.to(store.units.device), length)
            fold = role == DEEP and self.settings.summary and safe.numel() < length
            if fold:  # the pruned tokens, read before the kept ones move over them (about a chunk)
                pruned = pruned_indices(safe, length)
                gone = (store.keys.index_select(2, pruned), store.values.index_select(2, pruned),
                        store.positions.index_select(1, pruned))
                gone_clocks = store.clocks.index_select(0, pruned)
            store.keep(safe)
            if compact:
                store.reindex(rotary, self.renumber, clocks=None if compact is True else list(compact))  # §10.3
            if fold:
                for clock in torch.unique(gone_clocks).tolist():
                    # §10.1/§10.2: the summary sits at max + 1 on every axis of its clock (with 1D
                    # positions, which only grow along the cache, that is the last kept position + 1)
                    target = store.next_offset(clock)
                    mine = torch.nonzero(gone_clocks == clock).flatten().to(pruned.device)
                    key, value = summary_token(*gone, mine, target, rotary)
                    store.append(key, value, torch.full((rotary.axes, 1), target, device=store.positions.device),
                                 torch.tensor([SUMMARY_UNIT]), torch.tensor([-1]), clock)
                    if outcome is not None:
                        outcome.details["summary_tokens"] += 1
            if outcome is not None:
                outcome.evicted_tokens += length - int(safe.numel())
        if compact:
            self.reindex_events += 1

    def stats(self):
        stats = super().stats()
        stats.extra["summary_tokens"] = [int((s.units == SUMMARY_UNIT).sum().item()) for s in self.layers]
        return stats
