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

from ..adapters.base import ModelAdapter, project_qk
from ..cache import CachePolicy, GuidancePass, GuidanceRequest
from ..cache.positions import PositionRangeError


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
        # embedding q/k of the last request's prompts, by (ids, layer): they depend on the text and
        # the weights alone, so a chunk after a chunk with the same prompts projects nothing
        self._embedded: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def token_ids(self, text: str) -> list[int]:
        # docs/hermes.md §5: tokenised raw, no chat template and no special tokens
        return self.adapter.tokenizer(text, add_special_tokens=False).input_ids

    @torch.inference_mode()
    def embedding_qk(self, ids: list[int], layers: list[int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """D3 (the reference): layer l's q/k projected from input_layernorm_l(token embeddings), the
        same embeddings for every layer; for ``layers`` (default: all of them), in that order."""
        embeds = self.adapter.embed_text(ids)
        decoder = self.adapter.text_model.layers
        chosen = range(len(decoder)) if layers is None else layers
        return [project_qk(decoder[i].self_attn, decoder[i].input_layernorm(embeds)) for i in chosen]

    def _weights(self, layer: int) -> tuple:
        """What a layer's embedding q/k are computed from, as (storage, version) pairs: a cached q/k
        is used only while these are the same (an in-place update bumps the version)."""
        decoder = self.adapter.text_model.layers[layer]
        tensors = [self.adapter.text_model.embed_tokens.weight, *decoder.input_layernorm.parameters(),
                   *decoder.self_attn.q_proj.parameters(), *decoder.self_attn.k_proj.parameters()]
        return tuple((t.data_ptr(), t._version) for t in tensors)

    def _embedded_passes(self, request: GuidanceRequest, ids: list[list[int]]) -> list[GuidancePass]:
        """The embedding passes; a layer's q/k is projected once for as long as its prompt and
        weights stay the same (the last request's are kept, nothing older)."""
        kept, passes = {}, []
        for prompt, prompt_ids in zip(request.prompts, ids):
            keys = {i: (tuple(prompt_ids), i, self._weights(i)) for i in prompt.layers}
            known = {**self._embedded, **kept}
            missing = [i for i in prompt.layers if keys[i] not in known]
            fresh = dict(zip(missing, self.embedding_qk(prompt_ids, missing))) if missing else {}
            qk = [fresh[i] if i in fresh else known[keys[i]] for i in prompt.layers]
            kept.update(zip(keys.values(), qk))
            passes.append(GuidancePass(list(prompt.layers), qk))
        self._embedded = kept
        return passes

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
        if request.queries != "hidden":
            return self._embedded_passes(request, ids)
        passes = []
        for prompt, prompt_ids in zip(request.prompts, ids):
            qk = self.hidden_qk(prompt_ids, policy)
            passes.append(GuidancePass(list(prompt.layers), [qk[i] for i in prompt.layers]))
        return passes
