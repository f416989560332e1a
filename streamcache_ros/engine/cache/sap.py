"""Spatio-temporal Attention Profiling (SAP) for H2SVC, and the head map it writes (docs/h2svc.md §2).

Offline, the unmodified model reads a few sample videos and a question. For every query head:

    TAD_V2V = mean over frames i of  E_{q in frame i} Σ_{j<=i} (i - j)·A_{q,j}     (visual queries)
    TAD_T2V =                        E_{q in question} Σ_j (N_v - j)·A_{q,j}        (question tokens)

where A_{q,j} is the attention of query q on frame j renormalised over the visual keys it can see.
Query heads are pooled per KV head (GQA, mean by default), both metrics are min-max normalised over
all KV heads of the model, S(h) is their mean, and the heads split 10/40/50 by S into the
instantaneous, short-term and episodic banks. "Frame" is the stream unit (a temporal patch of 2
frames on Qwen2.5-VL). Everything here is torch on plain tensors; the command that drives a model
is ``streamcache_ros.tools.profile_heads``.
"""
from __future__ import annotations

import dataclasses

import hashlib
import json
import math
import pathlib
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

INSTANTANEOUS, SHORT_TERM, EPISODIC = 0, 1, 2
BANK_NAMES = ("instantaneous", "short_term", "episodic")
DEFAULT_RATIOS = (0.1, 0.4, 0.5)
HEAD_MAP_FORMAT = "streamcache_ros.h2svc_head_map"
HEAD_MAP_FILE = "h2svc_head_map.json"  # a model's folder may hold its head map under this name
HEAD_MAP_VERSION = 1


# -- attention on frames (§2.2) ------------------------------------------------------------------
def frame_attention(q: torch.Tensor, k: torch.Tensor, key_frame: torch.Tensor, num_frames: int,
                    block_rows: int = 256) -> torch.Tensor:
    """A [Hq, Q, num_frames]: each query's attention per frame, renormalised over visual keys.

    q [Hq, Q, D] and k [Hkv, T, D] are post-RoPE; the queries are the last Q keys (causal,
    bottom-right). ``key_frame`` [T] is each key's frame index, or < 0 for prefix/text keys.
    Renormalising the softmax over the visual keys equals a softmax restricted to them (the
    non-visual mass cancels), which is what is computed, a block of query rows at a time, so no
    [T, T] map is ever held. Rows that see no visual key are all zero.
    """
    hq, q_len, dim = q.shape
    hkv, k_len, _ = k.shape
    group = hq // hkv
    visual = key_frame >= 0
    onehot = torch.zeros(k_len, num_frames, dtype=torch.float32, device=k.device)
    onehot[visual.nonzero().flatten(), key_frame[visual]] = 1.0
    keys = k.float().transpose(1, 2)  # [Hkv, D, T]
    out = torch.zeros(hq, q_len, num_frames, dtype=torch.float32, device=q.device)
    cols = torch.arange(k_len, device=q.device)
    for start in range(0, q_len, block_rows):
        stop = min(q_len, start + block_rows)
        rows = torch.arange(start, stop, device=q.device)
        # grouped matmul: query heads of a KV head share its keys, no repeat of K
        logits = q[:, start:stop].float().reshape(hkv, group * (stop - start), dim) @ keys / math.sqrt(dim)
        logits = logits.view(hq, stop - start, k_len)
        allowed = (cols[None, :] <= rows[:, None] + (k_len - q_len)) & visual[None, :]
        logits = logits.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row with no visual key: 0
        out[:, start:stop] = weights @ onehot
    return out


def v2v_distance(attn: torch.Tensor, query_frame: torch.Tensor) -> torch.Tensor:
    """[Hq, Q]: Σ_j (i - j)·A_{q,j} for queries in frame i (causality makes A zero for j > i)."""
    frames = torch.arange(attn.shape[-1], device=attn.device, dtype=torch.float32)
    distance = (query_frame.to(attn.device, torch.float32)[:, None] - frames[None, :]).clamp_min(0)
    return (attn * distance[None]).sum(dim=-1)


def t2v_distance(attn: torch.Tensor) -> torch.Tensor:
    """[Hq, Q]: Σ_j (N_v - j)·A_{q,j} with 1-based j, so the newest frame is at distance 0."""
    num = attn.shape[-1]
    distance = num - 1 - torch.arange(num, device=attn.device, dtype=torch.float32)
    return (attn * distance).sum(dim=-1)


class TadAccumulator:
    """Sums the per-query distances of one video, then averages them into TAD_V2V / TAD_T2V
    [layers, Hq]: V2V as the mean over frames of the mean over each frame's tokens (§2.3)."""

    def __init__(self, num_layers: int, num_q_heads: int, num_frames: int):
        self.num_frames = num_frames
        self.v2v_sum = torch.zeros(num_layers, num_q_heads, num_frames, dtype=torch.float64)
        self.v2v_count = torch.zeros(num_frames, dtype=torch.float64)
        self.t2v_sum = torch.zeros(num_layers, num_q_heads, dtype=torch.float64)
        self.t2v_count = 0

    def add_visual(self, layer: int, attn: torch.Tensor, query_frame: torch.Tensor) -> None:
        dist = v2v_distance(attn, query_frame).double().cpu()
        frames = query_frame.cpu()
        self.v2v_sum[layer].index_add_(1, frames, dist)
        if layer == 0:  # every layer sees the same queries: count them once
            self.v2v_count.index_add_(0, frames, torch.ones(frames.numel(), dtype=torch.float64))

    def add_text(self, layer: int, attn: torch.Tensor) -> None:
        self.t2v_sum[layer] += t2v_distance(attn).double().sum(dim=1).cpu()
        if layer == 0:
            self.t2v_count += attn.shape[1]

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        seen = self.v2v_count > 0
        if not bool(seen.any()) or self.t2v_count == 0:
            raise ValueError("no visual or no question tokens were profiled")
        per_frame = self.v2v_sum[..., seen] / self.v2v_count[seen]
        return per_frame.mean(dim=-1), self.t2v_sum / self.t2v_count


def pool_query_heads(tad: torch.Tensor, group: int, mode: str = "mean") -> torch.Tensor:
    """[L, Hq] -> [L, Hkv]: a KV head's TAD from the query heads that share it (§2.4)."""
    grouped = tad.reshape(tad.shape[0], -1, group)
    if mode == "mean":
        return grouped.mean(dim=-1)
    if mode == "max":
        return grouped.amax(dim=-1)
    raise ValueError(f"gqa_pooling must be 'mean' or 'max', got '{mode}'")


# -- score and split (§2.5) ------------------------------------------------------------------------
def min_max(x: torch.Tensor) -> torch.Tensor:
    """(x - min) / (max - min) over every entry; all zeros when every entry is equal."""
    x = x.double()
    span = x.max() - x.min()
    return torch.zeros_like(x) if span <= 0 else (x - x.min()) / span


def head_scores(tad_v2v: torch.Tensor, tad_t2v: torch.Tensor) -> torch.Tensor:
    """S(h) = ½ (N(TAD_V2V) + N(TAD_T2V)), normalised over all heads at once (global)."""
    return 0.5 * (min_max(tad_v2v) + min_max(tad_t2v))


def check_ratios(ratios) -> tuple[float, float, float]:
    values = tuple(float(r) for r in ratios)
    if len(values) != 3 or any(r < 0 for r in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"ratios must be three non-negative numbers (instantaneous, short-term, episodic) "
                         f"that sum to 1, got {list(ratios)}")
    return values


def split_counts(total: int, ratios=DEFAULT_RATIOS) -> tuple[int, int, int]:
    """Heads per bank with round-half-up boundaries: 112 -> 11/45/56, 48 -> 5/19/24."""
    r0, r1, _ = check_ratios(ratios)
    b1 = math.floor(r0 * total + 0.5)
    b2 = max(b1, math.floor((r0 + r1) * total + 0.5))
    return b1, b2 - b1, total - b2


def split_banks(scores: torch.Tensor, ratios=DEFAULT_RATIOS) -> torch.Tensor:
    """bank_id [L, H] from scores [L, H]: rank by S ascending, ties by (layer, head) ascending."""
    flat = scores.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))  # i = layer·H + head: the tie order
    n0, n1, _ = split_counts(len(flat), ratios)
    bank = [0] * len(flat)
    for rank, index in enumerate(order):
        bank[index] = INSTANTANEOUS if rank < n0 else SHORT_TERM if rank < n0 + n1 else EPISODIC
    return torch.tensor(bank, dtype=torch.long).reshape(scores.shape)


def split_layers(tad_v2v: torch.Tensor, tad_t2v: torch.Tensor, ratios=DEFAULT_RATIOS) -> torch.Tensor:
    """Layer-wise ablation (§2.5): rank layers by their heads' mean TADs; a layer's heads share a bank."""
    layer_scores = head_scores(tad_v2v.double().mean(dim=1), tad_t2v.double().mean(dim=1))
    per_layer = split_banks(layer_scores[:, None], ratios)[:, 0]
    return per_layer[:, None].expand(tad_v2v.shape).clone()


# -- the head map file -----------------------------------------------------------------------------
@dataclass
class HeadMap:
    """What SAP found for one model: per KV head TADs [L][Hkv], their normalised values, S, banks."""

    model_id: str
    config_hash: str
    num_layers: int
    num_kv_heads: int
    tad_v2v: list[list[float]]
    tad_t2v: list[list[float]]
    norm_v2v: list[list[float]] = field(default_factory=list)
    norm_t2v: list[list[float]] = field(default_factory=list)
    score: list[list[float]] = field(default_factory=list)
    bank_id: list[list[int]] = field(default_factory=list)
    split: list[int] = field(default_factory=list)
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    gqa_pooling: str = "mean"
    tad_v2v_std: list[list[float]] = field(default_factory=list)  # over videos: SAP's sanity check
    tad_t2v_std: list[list[float]] = field(default_factory=list)
    query_tad_v2v: list[list[float]] = field(default_factory=list)  # per query head, before pooling
    query_tad_t2v: list[list[float]] = field(default_factory=list)
    profile: dict[str, Any] = field(default_factory=dict)  # videos, frames, question, source, ...
    format: str = HEAD_MAP_FORMAT
    version: int = HEAD_MAP_VERSION

    @classmethod
    def build(cls, model_id: str, config_hash: str, tad_v2v: torch.Tensor, tad_t2v: torch.Tensor,
              ratios=DEFAULT_RATIOS, **extra) -> "HeadMap":
        """From per KV head TADs [L, Hkv]: normalise, score and split."""
        v2v, t2v = tad_v2v.double(), tad_t2v.double()
        score = head_scores(v2v, t2v)
        banks = split_banks(score, ratios)
        return cls(model_id=model_id, config_hash=config_hash, num_layers=v2v.shape[0], num_kv_heads=v2v.shape[1],
                   tad_v2v=v2v.tolist(), tad_t2v=t2v.tolist(), norm_v2v=min_max(v2v).tolist(),
                   norm_t2v=min_max(t2v).tolist(), score=score.tolist(), bank_id=banks.tolist(),
                   split=[int((banks == b).sum()) for b in range(3)], ratios=list(check_ratios(ratios)), **extra)

    def bank_ids(self, ratios=DEFAULT_RATIOS, granularity: str = "head") -> torch.Tensor:
        """bank_id [L, Hkv] for the given split (the file's scores are re-split, so the ratios
        parameter works without profiling again)."""
        if granularity == "head":
            return split_banks(torch.tensor(self.score, dtype=torch.float64), ratios)
        if granularity == "layer":
            return split_layers(torch.tensor(self.tad_v2v), torch.tensor(self.tad_t2v), ratios)
        raise ValueError(f"granularity must be 'head' or 'layer', got '{granularity}'")

    def resplit(self, ratios) -> "HeadMap":
        """The same profile split by other ratios (its banks and split made again); what the policy
        uses where its ``ratios`` setting is empty (docs/h2svc.md "Bank ratios chosen by data")."""
        ratios = list(check_ratios(ratios))
        banks = split_banks(torch.tensor(self.score, dtype=torch.float64), ratios)
        return dataclasses.replace(self, bank_id=banks.tolist(), split=[int((banks == b).sum()) for b in range(3)],
                                   ratios=ratios)

    def digest(self) -> str:
        """A short hash of the scores: two caches built from different maps are not comparable."""
        text = json.dumps([self.model_id, self.score], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "HeadMap":
        """Read a head map; raises ValueError saying what is wrong with the file."""
        try:
            data = json.loads(pathlib.Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"no head map at '{path}'") from None
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"'{path}' is not a readable head map: {err}") from None
        if not isinstance(data, dict) or data.get("format") != HEAD_MAP_FORMAT:
            raise ValueError(f"'{path}' is not an H2SVC head map (no \"format\": \"{HEAD_MAP_FORMAT}\")")
        known = {f for f in cls.__dataclass_fields__}
        try:
            head_map = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as err:
            raise ValueError(f"head map '{path}' is incomplete: {err}") from None
        shape = (head_map.num_layers, head_map.num_kv_heads)
        for name in ("tad_v2v", "tad_t2v", "score"):
            value = getattr(head_map, name)
            if len(value) != shape[0] or any(len(row) != shape[1] for row in value):
                raise ValueError(f"head map '{path}': '{name}' is not [{shape[0]}][{shape[1]}]")
        try:
            check_ratios(head_map.ratios)
        except ValueError as err:
            raise ValueError(f"head map '{path}': {err}") from None
        return head_map
