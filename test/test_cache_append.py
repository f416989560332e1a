"""``CachePolicy.append`` (store without attending) against ``attend``, for every policy.

Two policies of the same kind read the same stream: one through ``attend``, one through ``append``.
After every step their states must be identical, and the attention ``attend`` returned must equal
attention computed here, from scratch, over what the ``append`` twin holds: queries rotated at the
positions it recorded for the new tokens, bottom-right causal, over the keys each KV head may see
(docs/h2svc.md §3.2: a FIFO head does not see units <= f - W; an episodic head sees the frames STCE keeps).
"""
import math

import pytest
import torch

from streamcache_ros.engine.cache import PAD_UNIT, PREFIX_UNIT, TEXT_UNIT, ChunkContext, NewTokens
from streamcache_ros.engine.cache.rope import apply_rotary
from streamcache_ros.engine.cache.sap import EPISODIC
from streamcache_ros.engine.ingest.guidance import GuidanceProvider
from conftest import policy_for, states_equal

PREFIX = 5
UNIT_TOKENS = 4  # a 2x2 grid per unit
CHUNK_UNITS = 2
POLICIES = {
    "full": {},
    "fifo": {"budget_tokens": 10},
    "hermes": {"budget_tokens": 14},
    "h2svc": {"w_s": 1, "w_w": 2, "n_e": 3},
}


def reference_attention(q, keys, values, visible, q_positions, rotary, group):
    """q [1, Hq, Q, D] un-rotated; per KV head: keys/values [T, D], visible [T] bool, the new tokens'
    positions [axes, Q]. Plain softmax in float64, query i seeing key j <= T - Q + i."""
    q_len, dim = q.shape[2], q.shape[3]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for head in range(q.shape[1]):
        kv = head // group
        cos, sin = rotary.cos_sin(q_positions[kv], q.dtype)
        rotated = apply_rotary(q[0, head], cos, sin).double()
        k, v, seen = keys[kv].double(), values[kv].double(), visible[kv]
        total = k.shape[0]
        for i in range(q_len):
            allowed = seen & (torch.arange(total) <= total - q_len + i)
            logits = (k[allowed] @ rotated[i]) / math.sqrt(dim)
            out[0, head, i] = torch.softmax(logits, dim=0) @ v[allowed]
    return out


def filter_view(units, key_filter):
    """A question's key filter: the prefix and the text always; units (a summary token too: -2)
    only when listed."""
    return (units == PREFIX_UNIT) | (units == TEXT_UNIT) | torch.isin(units, key_filter)


def layerwise_view(policy, layer, q_len, key_filter):
    store = policy.layers[layer]
    visible = torch.ones(len(store), dtype=torch.bool)
    if key_filter is not None:
        visible = filter_view(store.units, key_filter)
    heads = store.keys.shape[1]
    return ([store.keys[0, h] for h in range(heads)], [store.values[0, h] for h in range(heads)],
            [visible] * heads, [store.positions[:, -q_len:]] * heads)


def h2svc_view(policy, layer, new, key_filter):
    keys, values, visible, positions = [], [], [], []
    video = new.units[new.units >= 0]
    first = int(video.min()) if video.numel() else None
    for head in range(policy.geometry.num_kv_heads):
        group = next(g for g in policy.groups[layer] if head in g.store.heads.tolist())
        bank = group.store
        row = bank.heads.tolist().index(head)
        units = bank.units[row]
        seen = units != PAD_UNIT
        if group.bank == EPISODIC:
            trajectory_row = int(policy.trajectory_rows[(layer, EPISODIC)][row])
            kept = torch.tensor(policy.trajectory.frames(trajectory_row) + video.tolist(), dtype=torch.long)
            seen &= (units < 0) | torch.isin(units, kept)
        elif first is not None:
            seen &= ~((units >= 0) & (units <= first - policy.windows[group.bank]))
        if key_filter is not None:
            seen &= filter_view(units, key_filter)
        keys.append(bank.keys[0, row])
        values.append(bank.values[0, row])
        visible.append(seen)
        positions.append(bank.positions[row][:, -len(new):])
    return keys, values, visible, positions


def unit_positions(axes, units):
    """Relative positions of ``units`` units of a 2x2 grid each: 1D consecutive, M-RoPE (t, h, w)."""
    count = units * UNIT_TOKENS
    if axes == 1:
        return torch.arange(count, dtype=torch.float32)[None]
    index = torch.arange(count)
    return torch.stack((index // UNIT_TOKENS, (index % UNIT_TOKENS) // 2, index % 2)).float()


class Twins:
    def __init__(self, name, adapter):
        self.name = name
        self.geometry = adapter.geometry()
        self.guidance = GuidanceProvider(adapter)
        self.attending = policy_for(adapter, name, **POLICIES[name])
        self.appending = policy_for(adapter, name, **POLICIES[name])
        self.attending.setup(self.geometry)
        self.appending.setup(self.geometry)
        self.gen = torch.Generator().manual_seed(7)
        self.outputs_checked = 0

    def forward(self, new, key_filter=None):
        g = self.geometry
        for layer in range(g.num_layers):
            q_len = len(new)
            q = torch.randn(1, g.num_q_heads, q_len, g.head_dim, generator=self.gen)
            k = torch.randn(1, g.num_kv_heads, q_len, g.head_dim, generator=self.gen)
            v = torch.randn(1, g.num_kv_heads, q_len, g.head_dim, generator=self.gen)
            out = self.attending.attend(layer, q, k, v, new, key_filter)
            self.appending.append(layer, k, v, new)
            if self.name == "h2svc":
                view = h2svc_view(self.appending, layer, new, key_filter)
            else:
                view = layerwise_view(self.appending, layer, q_len, key_filter)
            expected = reference_attention(q, *view, g.rotary, g.group_size)
            torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
            self.outputs_checked += 1
        assert states_equal(self.attending.state_dict(), self.appending.state_dict())

    def chunk(self, first_unit, chunk_id):
        rel = unit_positions(self.geometry.rotary.axes, CHUNK_UNITS)
        units = torch.arange(first_unit, first_unit + CHUNK_UNITS).repeat_interleave(UNIT_TOKENS)
        step = UNIT_TOKENS if self.attending.prefill_unit_by_unit else rel.shape[1]
        for start in range(0, rel.shape[1], step):
            part = slice(start, start + step)
            offset = rel[:, :start].max() + 1 if start else 0.0  # as the session rebases each step
            new = NewTokens(rel[:, part] - offset, units[part], torch.full((len(units[part]),), chunk_id))
            self.forward(new)
            self.attending.after_prefill(new)
            self.appending.after_prefill(new)
        for policy in (self.attending, self.appending):  # the guidance a policy asks for, as the session does
            request = policy.guidance_request([])
            guidance = self.guidance.compute(request, policy) if request is not None else None
            policy.after_chunk(ChunkContext(chunk_id, guidance=guidance))
        assert states_equal(self.attending.state_dict(), self.appending.state_dict())

    def text(self, count, unit, key_filter=None):
        rel = torch.arange(count, dtype=torch.float32).expand(self.geometry.rotary.axes, count).clone()
        self.forward(NewTokens(rel, torch.full((count,), unit), torch.full((count,), -1)), key_filter)


@pytest.mark.parametrize("name", list(POLICIES))
def test_append_then_attention_equals_attend(adapter, name):
    twins = Twins(name, adapter)
    twins.text(PREFIX, PREFIX_UNIT)
    for chunk_id in range(4):
        twins.chunk(chunk_id * CHUNK_UNITS, chunk_id)
    held = twins.appending.stats()
    assert held.units, "the stream left no video in the cache"
    fed = (PREFIX + 4 * CHUNK_UNITS * UNIT_TOKENS) * twins.geometry.num_layers
    # full keeps all; the others were fed enough to drop some (kv_tokens: summed over layers)
    assert held.kv_tokens == fed if name == "full" else held.kv_tokens < fed
    # a question looking at one unit: the key filter path; then its tokens go again
    marks = twins.attending.mark(), twins.appending.mark()
    twins.text(3, TEXT_UNIT, key_filter=torch.tensor(held.units[-1:]))
    twins.attending.truncate(marks[0])
    twins.appending.truncate(marks[1])
    assert states_equal(twins.attending.state_dict(), twins.appending.state_dict())
    assert twins.outputs_checked > 0
