"""Rotary position embedding (1D RoPE and Qwen2.5-VL's 3D M-RoPE) and turning cached keys by a delta.

Keys are cached post-RoPE. When tokens leave the cache and positions are renumbered (positions.py),
the kept keys are rotated by the position *delta* instead of being recomputed (docs/hermes.md
§10.3): RoPE is a rotation per channel pair, so R(new) = R(new - old) · R(old).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RotarySpec:
    """What a model's RoPE needs: inverse frequencies and, for M-RoPE, the channel split per axis."""

    inv_freq: torch.Tensor  # [head_dim / 2], float32
    mrope_section: tuple[int, ...] | None = None  # None: 1D RoPE; else (t, h, w) channel counts
    attention_scaling: float = 1.0

    @property
    def axes(self) -> int:
        """Rows of a position tensor: 1 (1D RoPE) or 3 (t, h, w)."""
        return 1 if self.mrope_section is None else 3

    @property
    def head_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """[axes, T] positions -> [T, head_dim] angles in the HF layout ``cat(freqs, freqs)``."""
        if positions.dim() != 2 or positions.shape[0] != self.axes:
            raise ValueError(f"positions must be [{self.axes}, T], got {tuple(positions.shape)}")
        inv_freq = self.inv_freq.to(device=positions.device, dtype=torch.float32)
        freqs = positions.to(torch.float32)[..., None] * inv_freq  # [axes, T, D/2]
        if self.mrope_section is None:
            freqs = freqs[0]
        else:
            # M-RoPE: channel chunk i of the half-dim takes axis i mod 3 (t, h, w, t, h, w ...)
            chunks = freqs.split(list(self.mrope_section), dim=-1)
            freqs = torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)
        return torch.cat((freqs, freqs), dim=-1)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ang = self.angles(positions)
        cos = ang.cos() * self.attention_scaling
        sin = ang.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def text_positions(self, start: float, count: int, device=None) -> torch.Tensor:
        """Positions of ``count`` text tokens from ``start`` (every M-RoPE axis equal)."""
        row = torch.arange(count, dtype=torch.float32, device=device) + start
        return row.expand(self.axes, count).clone()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, D]; cos/sin broadcastable to it (e.g. [T, D])."""
    return x * cos + rotate_half(x) * sin


def rotate_by_delta(keys: torch.Tensor, rotary: RotarySpec, delta: torch.Tensor) -> torch.Tensor:
    """Move post-RoPE keys [..., T, D] by ``delta`` positions, exactly, in float32: ``delta`` is
    [axes, T] (every head alike) or [rows, axes, T] (one row per head of keys [1, rows, T, D]).

    docs/hermes.md §10.3: k' = k·cos Δ + rotate_half(k)·sin Δ with Δ = (new − old)·θ. The angle of
    the delta is formed directly (not via the cos/sin product identities) to avoid extra rounding.
    A new tensor is returned; ``keys`` is never edited in place.
    """
    if delta.numel() == 0 or not torch.any(delta != 0):
        return keys
    if delta.dim() == 3:  # per row: the angles of every row's deltas at once
        rows, axes, length = delta.shape
        ang = rotary.angles(delta.transpose(0, 1).reshape(axes, rows * length)).view(rows, length, -1)
    else:
        ang = rotary.angles(delta)
    rotated = apply_rotary(keys.to(torch.float32), ang.cos(), ang.sin())
    return rotated.to(keys.dtype)
