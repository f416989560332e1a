"""``hermes``: layer-managed KV cache (hermes_spec; the rules themselves are in hermes_rules.py).

After every chunk, when the cache holds more than ``budget_tokens`` (prefix included, §2), each
layer keeps the system prefix plus its top-M video tokens by a score that mixes recency (shallow
layers), the attention of a guidance prompt (deep layers) or both (middle layers), smoothed from
deep to shallow. Deep layers fold what they drop into one summary token. Positions are per layer
(§3); they are renumbered (and the kept keys rotated by the delta) when they near the model's range
(lazy) or at every shrink (eager).

Modes (CLARIFICATIONS, Specs): ``qwen_rope`` per_layer (default; fixes D1) | layer0 (reference);
``qwen_reindex`` shift (default) | dense_rank (reference D5); ``guidance_queries`` embedding
(reference D3, default) | hidden.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import PREFIX_UNIT, SUMMARY_UNIT, CacheStats, ChunkContext, LayerStore, LayerwisePolicy, NewTokens
from .hermes_rules import (DEEP, GLOBAL_PROMPT, LOCAL_PROMPT, MID, ROLE_PROMPT, SHALLOW, dense_rank_positions,
                           guidance_attention, guidance_prompts, keep_indices, layer_budget, layer_roles,
                           layer_split, mid_progress, pruned_indices, raw_scores, recency_norm,
                           recency_weight_and_rate, sanitize_keep, smooth_scores, summary_token)
from .rope import apply_rotary, rotate_by_delta


def _pair(name: str, value) -> list[float]:
    values = [float(v) for v in value]
    if len(values) != 2:
        raise ValueError(f"{name} must be two numbers [value at p=0, drop over p 0->1], got {value!r}")
    return values


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got '{value}'")
    return value


class HermesPolicy(LayerwisePolicy):
    name = "hermes"

    def __init__(self, budget_tokens: int = 6000, reindex: str = "lazy", reindex_margin: int = 1024,
                 qwen_reindex: str = "shift", qwen_rope: str = "per_layer", guidance_queries: str = "embedding",
                 shallow_end_ratio: float = 0.1, deep_start_ratio: float = 0.7,
                 shallow_omega: float = 1.0, shallow_k: float = 20.0, deep_omega: float = 0.0, deep_k: float = 0.0,
                 llava_mid_omega: list = [1.0, 0.9], llava_mid_k: list = [20.0, 19.5],  # noqa: B006
                 qwen_mid_omega: list = [0.75, 0.6], qwen_mid_k: list = [20.0, 12.0],  # noqa: B006
                 lambda_shallow: float = 0.1, lambda_mid: float = 0.3, lambda_deep: float = 0.4,
                 norm_eps: float = 1e-6, summary: bool = True, score_dtype: str = "float32",
                 local_prompt: str = LOCAL_PROMPT, global_prompt: str = GLOBAL_PROMPT):
        if budget_tokens < 1:
            raise ValueError(f"hermes needs budget_tokens >= 1, got {budget_tokens}")
        super().__init__(budget_tokens, reindex, reindex_margin, qwen_reindex)
        if not 0.0 <= shallow_end_ratio <= deep_start_ratio <= 1.0:
            raise ValueError(f"need 0 <= shallow_end_ratio <= deep_start_ratio <= 1, got {shallow_end_ratio}, "
                             f"{deep_start_ratio}")
        lambdas = {SHALLOW: float(lambda_shallow), MID: float(lambda_mid), DEEP: float(lambda_deep)}
        for role, value in lambdas.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"lambda_{role} must be in [0, 1], got {value}")
        if norm_eps < 0:
            raise ValueError(f"norm_eps must be >= 0, got {norm_eps}")
        self.params: dict[str, Any] = {
            "qwen_rope": _choice("qwen_rope", qwen_rope, ("per_layer", "layer0")),
            "guidance_queries": _choice("guidance_queries", guidance_queries, ("embedding", "hidden")),
            "score_dtype": _choice("score_dtype", score_dtype, ("float32", "model")),
            "shallow_end_ratio": float(shallow_end_ratio), "deep_start_ratio": float(deep_start_ratio),
            "shallow": [float(shallow_omega), float(shallow_k)], "deep": [float(deep_omega), float(deep_k)],
            "llava_mid_omega": _pair("llava_mid_omega", llava_mid_omega),
            "llava_mid_k": _pair("llava_mid_k", llava_mid_k),
            "qwen_mid_omega": _pair("qwen_mid_omega", qwen_mid_omega),
            "qwen_mid_k": _pair("qwen_mid_k", qwen_mid_k),
            "lambdas": lambdas, "norm_eps": float(norm_eps), "summary": bool(summary),
            "local_prompt": str(local_prompt), "global_prompt": str(global_prompt),
        }
        self.roles: list[str] = []
        self.schedule: list[tuple[float, float]] = []  # (ω, k) per layer
        self._layer0_offset = 0.0
        self.dense_fallbacks = 0  # shift re-indexes that did not fit and were ranked densely

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), **self.params}

    def setup(self, geometry) -> None:
        super().setup(geometry)
        p = self.params
        layers = geometry.num_layers
        shallow_end, deep_start = layer_split(layers, p["shallow_end_ratio"], p["deep_start_ratio"])
        self.roles = layer_roles(layers, shallow_end, deep_start)
        family = "qwen" if geometry.model_family.startswith("qwen") else "llava"
        self.schedule = [
            recency_weight_and_rate(role, mid_progress(i, shallow_end, deep_start) if role == MID else 0.0,
                                    p["shallow"], p[f"{family}_mid_omega"], p[f"{family}_mid_k"], p["deep"])
            for i, role in enumerate(self.roles)]

    def reset(self) -> None:
        super().reset()
        self.dense_fallbacks = 0

    # -- positions ------------------------------------------------------------------------------
    def rotary_positions(self, layer: int, positions: torch.Tensor, new: NewTokens) -> torch.Tensor:
        if self.params["qwen_rope"] != "layer0" or self.geometry.rotary.axes != 3:
            return positions
        # D1 (reference): every layer's new tokens rotated at layer 0's positions, while each layer
        # records its own; layer 0 is called first in every forward pass, before it appends
        if layer == 0:
            self._layer0_offset = self.layers[0].next_offset()
        return new.rel_positions.to(positions.device) + self._layer0_offset

    def compacted_positions(self, store: LayerStore) -> torch.Tensor:
        if self.geometry.rotary.axes == 1:
            return super().compacted_positions(store)
        if self.qwen_reindex == "shift":
            new = super().compacted_positions(store)
            # a shifted chunk keeps its whole t/h/w span, so tokens kept from many chunks can span more
            # than the range allows; then the layer is ranked densely (the reference's re-index, which
            # needs at most one position per token)
            if float(new.max()) <= self.reindex_threshold():
                return new
            self.dense_fallbacks += 1
        return dense_rank_positions(store.positions, int((store.units == PREFIX_UNIT).sum().item()))

    def guidance_positions(self, layer: int, count: int) -> torch.Tensor:
        """§6: guidance tokens sit at the layer's own next positions (all M-RoPE axes equal)."""
        store = self.layers[layer]
        return self.geometry.rotary.text_positions(store.next_offset(), count, store.positions.device)

    def prefix_len(self) -> int:
        return int((self.layers[0].units == PREFIX_UNIT).sum().item())

    # -- compression ----------------------------------------------------------------------------
    @torch.inference_mode()
    def after_chunk(self, context: ChunkContext) -> dict[str, Any]:
        report: dict[str, Any] = {"evicted_tokens": 0, "summary_tokens": 0, "guidance_passes": 0}
        reindex_events = self.reindex_events
        if len(self.layers[0]) > self.budget_tokens:  # §2: layer 0's length, prefix included
            # §10: the re-index decision is taken once, on the positions before the shrink
            compact = self.reindex_mode == "eager" or self.max_position() > self.reindex_threshold()
            keep = self.select(context, report)
            self.shrink(keep, compact, report)
        elif self.max_position() > self.reindex_threshold():
            self.reindex()  # positions still have to stay in range (not reached with the defaults)
        report["reindexed"] = self.reindex_events > reindex_events
        return report

    def slots(self, prefix_len: int) -> list[int]:
        return [layer_budget(role, self.budget_tokens, len(store) - prefix_len, self.params["summary"])
                for role, store in zip(self.roles, self.layers)]

    def select(self, context: ChunkContext, report: dict[str, Any] | None = None) -> list[torch.Tensor]:
        """Keep indices per layer (§6-§9)."""
        prefix_len = self.prefix_len()
        slots = self.slots(prefix_len)
        if all(s == len(store) - prefix_len for s, store in zip(slots, self.layers)):
            # D15: nothing will be pruned, so the guidance passes cannot change the selection
            return [torch.arange(len(store)) for store in self.layers]
        attention = self.layer_attention(context, prefix_len, report)
        return self.plan(attention, prefix_len)

    def plan(self, attention: list[torch.Tensor | None], prefix_len: int) -> list[torch.Tensor]:
        """§7-§9 from each layer's pooled guidance attention (None where a layer's ω = 1 makes it unused)."""
        eps = self.params["norm_eps"]
        raw = []
        for store, (omega, k), attn in zip(self.layers, self.schedule, attention):
            if attn is None:  # ω = 1: the reference's 0·attention + 1·recency is the recency term exactly
                count = len(store) - prefix_len
                raw.append(recency_norm(count, k, eps, store.keys.device) if count else torch.empty(0))
            else:
                raw.append(raw_scores(attn, omega, k, eps))
        refined = smooth_scores(raw, self.roles, self.params["lambdas"])
        return [keep_indices(score, slots, prefix_len) for score, slots in zip(refined, self.slots(prefix_len))]

    def layer_attention(self, context: ChunkContext, prefix_len: int,
                        report: dict[str, Any] | None = None) -> list[torch.Tensor | None]:
        """§5-§6: each layer's guidance attention on its candidates. A layer with ω = 1 gives its
        attention weight 0 (D2: the local prompt of the shallow layers), so it is not computed."""
        provider = context.guidance
        if provider is None:
            raise ValueError("hermes needs the model adapter's guidance provider (ChunkContext.guidance)")
        p = self.params
        prompts = guidance_prompts(context.history, p["local_prompt"], p["global_prompt"])
        rotary = self.geometry.rotary
        dtype = self.geometry.dtype
        reference_rounding = p["score_dtype"] == "model"
        # §6 precision: LLaVA rounds the fp32 softmax to the model dtype, Qwen rounds the logits first
        softmax_dtype = dtype if reference_rounding and rotary.axes == 3 else torch.float32
        weights_dtype = dtype if reference_rounding else torch.float32
        attention: list[torch.Tensor | None] = [None] * len(self.layers)
        passes = {}
        for prompt in ("local", "global", "mixed"):
            layers = [i for i, role in enumerate(self.roles)
                      if ROLE_PROMPT[role] == prompt and self.schedule[i][0] != 1.0]
            if layers:
                passes[prompt] = (layers, provider.token_ids(prompts[prompt]))
        if passes:
            # the guidance tokens take positions after the cache too: keep them in the model's range
            self.ensure_room(max(len(ids) for _, ids in passes.values()))
        for layers, ids in passes.values():
            if p["guidance_queries"] == "hidden":
                qk = provider.hidden_qk(ids, self)
            else:
                qk = provider.embedding_qk(ids)
            if report is not None:
                report["guidance_passes"] += 1
            for i in layers:
                store = self.layers[i]
                q, k = qk[i]
                cos, sin = rotary.cos_sin(self.guidance_positions(i, len(ids)), q.dtype)
                attention[i] = guidance_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), store.keys,
                                                  prefix_len, softmax_dtype, weights_dtype)
        return attention

    def shrink(self, keep: list[torch.Tensor], compact: bool, report: dict[str, Any] | None = None) -> None:
        """§10: gather the kept tokens, re-index them when ``compact``, fold the pruned ones of deep
        layers into a summary token. Every layer is replaced at once (the cache is never half-done)."""
        rotary = self.geometry.rotary
        shrunk = []
        for role, store, indices in zip(self.roles, self.layers, keep):
            safe = sanitize_keep(indices.to(store.units.device), len(store))
            kept = store.select(safe)
            if compact:
                new = self.compacted_positions(kept)
                kept.keys = rotate_by_delta(kept.keys, rotary, new - kept.positions)  # §10.3
                kept.positions = new
            pruned = pruned_indices(safe, len(store))
            if role == DEEP and self.params["summary"] and pruned.numel() > 0:
                # §10.1: LLaVA's target is the last kept position + 1; §10.2: Qwen's is max + 1 on all axes
                target = (kept.positions[0, -1] if rotary.axes == 1 else kept.positions.max()).item() + 1.0
                key, value = summary_token(store.keys, store.values, store.positions, pruned, target, rotary)
                kept.append(key, value, torch.full((rotary.axes, 1), target, device=kept.positions.device),
                            torch.tensor([SUMMARY_UNIT]), torch.tensor([-1]))
                if report is not None:
                    report["summary_tokens"] += 1
            if report is not None:
                report["evicted_tokens"] += int(pruned.numel())
            shrunk.append(kept)
        self.layers = shrunk
        if compact:
            self.reindex_events += 1

    def stats(self) -> CacheStats:
        stats = super().stats()
        stats.extra["summary_tokens"] = [int((s.units == SUMMARY_UNIT).sum().item()) for s in self.layers]
        stats.extra["dense_fallbacks"] = self.dense_fallbacks
        return stats
