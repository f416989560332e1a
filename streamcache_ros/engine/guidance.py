"""Guidance for a policy that scores its cache with prompts (HERMES, docs/hermes.md §5-§6): the
model's side of it.

The policy says which texts it wants read and by which layers (``CachePolicy.guidance_request``);
here they become tensors with the model: raw token ids (no chat template, no special tokens), then
every asked layer's un-rotated q/k, projected from the token embeddings (``embedding``, the
reference, D3) or from the layer's own input with the text run over the cache (``hidden``). The
policy gets the tensors in ``ChunkContext.guidance``: it never sees the model, and never calls back.
"""
from __future__ import annotations

import torch

from .adapters.base import ModelAdapter, project_qk
from .cache import CachePolicy, GuidancePass, GuidanceRequest
from .cache.positions import PositionRangeError


class QKRecorder:
    """Stands in for a policy during one forward pass: records each layer's un-rotated q/k and
    passes the call on."""

    def __init__(self, policy: CachePolicy):
        self.policy = policy
        self.qk: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, layer, q, k, v, new, key_filter=None):
        self.qk.append((q, k))
        return self.policy.attend(layer, q, k, v, new, key_filter)


class GuidanceProvider:
    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter

    def token_ids(self, text: str) -> list[int]:
        # docs/hermes.md §5: tokenised raw, no chat template and no special tokens
        return self.adapter.tokenizer(text, add_special_tokens=False).input_ids

    @torch.inference_mode()
    def embedding_qk(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """D3 (the reference): layer l's q/k projected from input_layernorm_l(token embeddings), the
        same embeddings for every layer."""
        embeds = self.adapter.embed_text(ids)
        return [project_qk(layer.self_attn, layer.input_layernorm(embeds)) for layer in self.adapter.text_model.layers]

    @torch.inference_mode()
    def hidden_qk(self, ids: list[int], policy: CachePolicy) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer l's q/k from the layer's own input: the text runs through the decoder over the cache
        like a question would, and its tokens are removed again (the cache is unchanged)."""
        adapter = self.adapter
        recorder = QKRecorder(policy)
        mark = policy.mark()
        try:
            adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), recorder)
        finally:
            policy.truncate(mark)
        return recorder.qk

    def compute(self, request: GuidanceRequest, policy: CachePolicy) -> list[GuidancePass]:
        """The passes ``request`` asks for, one per prompt, over ``policy``'s cache."""
        ids = [self.token_ids(prompt.text) for prompt in request.prompts]
        # the guidance tokens take positions after the cache too: keep them in the model's range.
        # Where even a re-index leaves fewer positions than a prompt has (a small range, a long
        # question in the history), each prompt is cut to the positions left (docs/architecture.md)
        try:
            policy.ensure_room(max(len(i) for i in ids))
        except PositionRangeError as err:
            room = err.limit - 1 - int(err.max_position)
            if room < 1:
                raise
            ids = [i[:room] for i in ids]
        passes = []
        for prompt, prompt_ids in zip(request.prompts, ids):
            qk = self.hidden_qk(prompt_ids, policy) if request.queries == "hidden" else self.embedding_qk(prompt_ids)
            passes.append(GuidancePass(list(prompt.layers), [qk[i] for i in prompt.layers]))
        return passes
