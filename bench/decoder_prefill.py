"""What a chunk's prefill costs at a model's real widths, so a policy's compression can be read as a
share of it (docs/performance.md "Compression as a share of prefill").

One real ``Qwen2DecoderLayer`` (transformers; the decoder of both LLaVA-OneVision-7B and, but for
M-RoPE's three position axes, which cost nothing measurable, Qwen2.5-VL-7B) with random weights of
the shape's widths prefills one chunk's tokens over ``held_tokens`` already in its cache; the
chunk's prefill is that layer's time times the number of layers, every layer being the same work.
The vision encoder is not in it (it is the same for every policy).
"""
from __future__ import annotations

import inspect
import time

import torch


def _layer(shape, intermediate: int, dtype: torch.dtype, device: torch.device):
    from transformers import Qwen2Config  # noqa: PLC0415 - only this measurement needs it
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding  # noqa: PLC0415

    config = Qwen2Config(hidden_size=shape.hidden, intermediate_size=intermediate,
                         num_attention_heads=shape.q_heads, num_key_value_heads=shape.kv_heads,
                         head_dim=shape.head_dim, num_hidden_layers=1,
                         max_position_embeddings=shape.max_position_embeddings, rope_theta=shape.rope_theta)
    config._attn_implementation = "sdpa"
    layer = Qwen2DecoderLayer(config, 0).to(device=device, dtype=dtype).eval()
    return config, layer, Qwen2RotaryEmbedding(config).to(device)


def chunk_prefill_ms(shape, chunk_tokens: int, held_tokens: int, intermediate: int, dtype: torch.dtype,
                     device: torch.device, repeats: int = 2, seed: int = 0) -> dict:
    """ms to prefill ``chunk_tokens`` over ``held_tokens`` through every layer of ``shape``: one layer
    timed ``repeats`` times (the first also warms it up; the fastest is kept), times ``shape.layers``."""
    from transformers import DynamicCache  # noqa: PLC0415

    torch.manual_seed(seed)
    config, layer, rotary = _layer(shape, intermediate, dtype, device)
    hidden = torch.randn(1, chunk_tokens, shape.hidden, dtype=dtype, device=device)
    positions = torch.arange(held_tokens, held_tokens + chunk_tokens, device=device)[None]
    embeddings = rotary(hidden, positions)
    # causal over the chunk, every held token visible: the mask a chunk's prefill has
    mask = torch.ones(chunk_tokens, held_tokens + chunk_tokens, dtype=torch.bool, device=device)
    mask = mask.tril(held_tokens)[None, None]
    # the cache's keyword: ``cache`` in transformers 5.24, ``past_key_values`` before (a GPU machine's 5.17)
    cache_kw = "cache" if "cache" in inspect.signature(layer.forward).parameters else "past_key_values"
    layer_ms = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=config)
            shape_kv = (1, shape.kv_heads, held_tokens, shape.head_dim)
            cache.update(torch.randn(shape_kv, dtype=dtype, device=device),
                         torch.randn(shape_kv, dtype=dtype, device=device), 0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            layer(hidden, attention_mask=mask, position_ids=positions, use_cache=True,
                  position_embeddings=embeddings, **{cache_kw: cache})
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            layer_ms.append((time.perf_counter() - started) * 1000)
    best = min(layer_ms)
    return {"chunk_tokens": chunk_tokens, "held_tokens": held_tokens, "intermediate": intermediate,
            "dtype": str(dtype).removeprefix("torch."), "layer_ms": layer_ms, "layers": shape.layers,
            "prefill_ms": best * shape.layers}
