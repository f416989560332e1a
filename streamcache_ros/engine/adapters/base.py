"""What every model family shares: loading, the decoder loop over an explicit cache, text prompts.

The adapter runs the language model's decoder layers itself (the transformers modules, unchanged:
norms, projections, MLP) so that each layer's attention goes through the cache policy, which owns
positions and storage. Everything family-specific (frame preprocessing, vision encoder, chunk
positions, system prompt) lives in the family's own file.
"""
from __future__ import annotations

import abc
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..cache import TEXT_UNIT, CacheGeometry, CachePolicy, FamilyTraits, NewTokens
from ..cache.attention import resolve_backend
from ..cache.rope import RotarySpec, apply_rotary
from ..stream.layout import OPTION_LETTERS, question_prompt, text_positions

# Attention of one decoder layer: (layer index, q [B,Hq,Q,D], k [B,Hkv,Q,D], v) -> [B,Hq,Q,D], q and k
# not yet rotated
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class VisionInputs:
    """One chunk's preprocessed pixels, ready for a vision encoder (torch or onnxruntime)."""

    tensors: dict[str, torch.Tensor]  # model inputs, e.g. pixel_values_videos (+ video_grid_thw)
    num_units: int  # stream units in the chunk (frames; temporal patches on Qwen2.5-VL)
    tokens_per_unit: int
    unit_frames: list[tuple[int, ...]]  # for each unit, the indices (into the chunk) of its frames
    grid: tuple[int, int, int]  # (units, rows, cols) of merged tokens


class VisionEncoder(abc.ABC):
    """Turns ``VisionInputs.tensors`` into visual embeddings [N, hidden] for the language model."""

    name = "torch"

    @abc.abstractmethod
    def __call__(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor: ...


def config_fingerprint(config, ignore: tuple[str, ...] = ()) -> str:
    """A short hash of a model config: tells two models (or an exported encoder's source) apart.
    Keys named in ``ignore`` are left out at every level (e.g. the dtype a model was loaded in)."""
    data = config.to_dict()
    data.pop("_name_or_path", None)  # where it was loaded from is not what it is
    text = json.dumps(_without_keys(data, set(ignore)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _without_keys(value, ignore: set[str]):
    if isinstance(value, dict):
        return {k: _without_keys(v, ignore) for k, v in value.items() if k not in ignore}
    return value


def match_option(answer: str, options: list[str]) -> int:
    """The option an answer names, or -1 when none or several do. In order: the answer is an
    option's text (case and surrounding punctuation aside); a leading letter ('B', '(B)', 'B) ...');
    one option's words appear as whole words in the answer. A part of a word never matches: "no"
    is not in "not" or "know"."""
    if not options:
        return -1
    texts = [_words(opt) for opt in options]
    said = _words(answer)
    exact = [i for i, words in enumerate(texts) if words and words == said]
    if len(exact) == 1:
        return exact[0]
    letter = re.match(r"^\s*\(?([A-Z])(?:\)|\.|:|\s|$)", answer)
    if letter:
        index = OPTION_LETTERS.index(letter.group(1))
        return index if index < len(options) else -1
    hits = [i for i, words in enumerate(texts) if words and _contains(said, words)]
    if len(hits) > 1:  # "dark red" names "dark red", not also "red"
        hits = [i for i in hits if not any(j != i and _contains(texts[j], texts[i]) for j in hits)]
    return hits[0] if len(hits) == 1 else -1


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+", text.lower()))


def _contains(words: tuple[str, ...], part: tuple[str, ...]) -> bool:
    return any(words[i:i + len(part)] == part for i in range(len(words) - len(part) + 1))


def project_qk(attn: torch.nn.Module, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's un-rotated q [B, Hq, Q, D] and k [B, Hkv, Q, D] from its normed input [B, Q, hidden]."""
    bsz, q_len, _ = normed.shape
    q = attn.q_proj(normed).view(bsz, q_len, -1, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(normed).view(bsz, q_len, -1, attn.head_dim).transpose(1, 2)
    return q, k


def gated_mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mlp(x)`` for the families' gated MLP, down(act(gate(x)) * up(x)). Without gradients the
    product is taken in place: two tensors as wide as the MLP exist at once instead of three, the
    largest part of a prefill block's activations (engine/ingest/prefill.py). The same numbers."""
    if torch.is_grad_enabled() or not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj",
                                                                          "act_fn")):
        return mlp(x)
    return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)).mul_(mlp.up_proj(x)))


class ModelAdapter(abc.ABC):
    """One model family on transformers: prompt layout, vision encoding, decoder loop."""

    family: str = ""
    system_prompt: str = ""
    frames_per_unit: int = 1
    # what the family means to a cache policy (RoPE layout, setting presets), as data
    traits: FamilyTraits = FamilyTraits()
    # the family's own old parameter names: "<policy>.<old name>" -> "<policy>.<setting>" (the
    # factory applies them to this family's models only)
    setting_aliases: dict[str, str] = {}
    model_dir: str = ""  # the local folder the model was loaded from ("" for a hub id)

    def __init__(self, model, tokenizer, image_processor, model_id: str, attention: str = "auto",
                 options_prompt: str = "letter"):
        self.model = model
        self.options_prompt = options_prompt  # "letter" or "words": see layout.options_query
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.model_id = model_id
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.text_model = self._text_model()
        self.lm_head = model.lm_head
        self.attention_backend = resolve_backend(attention, self.device)
        self.vision_encoder: VisionEncoder = self._torch_vision_encoder()
        self._prefix_ids = self.tokenizer(self.system_prompt, add_special_tokens=False).input_ids
        eos = self.tokenizer.eos_token_id
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos or [])
        self.config_hash = config_fingerprint(model.config)

    def set_sample_fps(self, sample_fps: float) -> None:
        """The stream's sampling rate, for families whose positions follow time (Qwen2.5-VL's time
        stride); applies to the chunks prefilled from now on. Here: positions do not depend on it."""

    # -- family-specific --------------------------------------------------------------------------
    @abc.abstractmethod
    def _text_model(self) -> torch.nn.Module:
        """The decoder stack (embed_tokens, layers, norm, rotary_emb)."""

    @abc.abstractmethod
    def _torch_vision_encoder(self) -> VisionEncoder: ...

    @abc.abstractmethod
    def preprocess(self, frames: list[np.ndarray]) -> VisionInputs:
        """RGB uint8 frames [H, W, 3] (one camera, in time order) -> encoder inputs."""

    def input_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) a frame of this size is resized to before the vision tower: what the archive
        keeps of a frame with ``archive_content: frames`` (docs/archive.md "What a chunk keeps")."""
        return height, width

    @abc.abstractmethod
    def batch_vision_inputs(self, inputs: list[VisionInputs]) -> dict[str, torch.Tensor]:
        """Several chunks' tensors as one input of the vision tower, whose output is their tokens
        one chunk after another (training on single frames batches them this way)."""

    @abc.abstractmethod
    def chunk_rel_positions(self, inputs: VisionInputs) -> torch.Tensor:
        """[axes, N] positions of the chunk's visual tokens relative to the chunk start."""

    @property
    def text_config(self):
        return self.text_model.config

    # -- geometry ---------------------------------------------------------------------------------
    def rotary_spec(self) -> RotarySpec:
        rope = self.text_model.rotary_emb
        section = getattr(rope, "mrope_section", None) if self.traits.rope_layout == "mrope" else None
        return RotarySpec(inv_freq=rope.inv_freq.detach().to(torch.float32).cpu(),
                          mrope_section=tuple(section) if section else None,
                          attention_scaling=float(getattr(rope, "attention_scaling", 1.0)))

    def geometry(self) -> CacheGeometry:
        cfg = self.text_config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return CacheGeometry(
            num_layers=cfg.num_hidden_layers, num_q_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=head_dim, dtype=self.dtype, device=self.device,
            rotary=self.rotary_spec(), max_position_embeddings=cfg.max_position_embeddings,
            traits=self.traits, attention_backend=self.attention_backend,
        )

    # -- text -------------------------------------------------------------------------------------
    @property
    def prefix_ids(self) -> list[int]:
        return list(self._prefix_ids)

    def question_ids(self, question: str, options: list[str]) -> list[int]:
        prompt = question_prompt(question, options, self.options_prompt)
        return self.tokenizer(prompt, add_special_tokens=False).input_ids

    def answer_ids(self, answer: str) -> list[int]:
        """A trained answer: its words, then the end-of-turn token that stops decoding."""
        return self.tokenizer(answer, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]

    def option_ids(self, options: list[str], index: int) -> list[int]:
        """What the model says to choose ``options[index]`` after the question's prompt: the
        option's words (``words`` layout) or its letter (``letter``, the reference's layout)."""
        said = options[index] if self.options_prompt == "words" else OPTION_LETTERS[index]
        return self.tokenizer(said, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def embed_text(self, ids: list[int]) -> torch.Tensor:
        return self.text_model.embed_tokens(torch.tensor([ids], device=self.device))

    @property
    def position_axes(self) -> int:
        return 3 if self.traits.rope_layout == "mrope" else 1

    def text_tokens(self, count: int, unit: int = TEXT_UNIT, clock: int | None = None) -> NewTokens:
        """``count`` text tokens; on a camera's ``clock`` (a question about that camera) or on none."""
        return NewTokens(text_positions(count, self.position_axes, device=self.device),
                         torch.full((count,), unit, dtype=torch.long), torch.full((count,), -1, dtype=torch.long),
                         clock)

    # -- vision -----------------------------------------------------------------------------------
    def encode(self, inputs: VisionInputs) -> torch.Tensor:
        """Visual embeddings [N, hidden] of one chunk, N = num_units · tokens_per_unit."""
        embeds = self.vision_encoder(inputs.tensors)
        expected = inputs.num_units * inputs.tokens_per_unit
        if embeds.shape[0] != expected:
            raise RuntimeError(f"vision encoder gave {embeds.shape[0]} tokens, expected {expected}")
        return embeds.to(device=self.device, dtype=self.dtype)

    @abc.abstractmethod
    def vision_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """The torch vision tower on one chunk's tensors -> [N, hidden]; gradients flow (training).
        The session's torch encoder calls it under inference mode."""

    # -- language model ---------------------------------------------------------------------------
    def decoder(self, embeds: torch.Tensor, attend: Attend, layer_hook: Callable | None = None) -> torch.Tensor:
        """The decoder layers over ``embeds`` [B, Q, hidden] with each layer's attention given by
        ``attend``; returns the final-norm hidden states. Gradients flow (training uses it)."""
        hidden = embeds if embeds.dim() == 3 else embeds[None]
        bsz, q_len, _ = hidden.shape
        for index, layer in enumerate(self.text_model.layers):
            if layer_hook is not None:
                layer_hook(index)
            attn = layer.self_attn
            residual = hidden
            normed = layer.input_layernorm(hidden)
            q, k = project_qk(attn, normed)
            v = attn.v_proj(normed).view(bsz, q_len, -1, attn.head_dim).transpose(1, 2)
            out = attend(index, q, k, v)
            hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))
            hidden = hidden + gated_mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        return self.text_model.norm(hidden)

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, new: NewTokens, policy: CachePolicy,
                key_filter: torch.Tensor | None = None, layer_hook: Callable | None = None,
                observe: Callable | None = None) -> torch.Tensor:
        """Run the decoder layers over ``embeds`` [1, Q, hidden], attending through ``policy``.

        Returns the final-norm hidden states [1, Q, hidden]. ``observe(layer, q, k, new)`` sees each
        layer's queries and keys before the rotary embedding. ``layer_hook(layer_index)`` is called
        before each layer (the session's failpoints, engine/failpoints.py).
        """
        def attend(index, q, k, v):
            if observe is not None:  # the archive's retrieval keys read the layer's q and k before RoPE
                observe(index, q, k, new)
            return policy.attend(index, q, k, v, new, key_filter)
        return self.decoder(embeds, attend, layer_hook)

    def forward_laid_out(self, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The decoder over a whole laid-out sequence (layout.lay_out_stream): every token rotated at
        its position, attention restricted by ``mask`` [T, T]. The same arithmetic as the cached
        path, without a cache; gradients flow."""
        rotary = self.rotary_spec()
        cos, sin = rotary.cos_sin(positions.to(self.device), embeds.dtype)
        mask = mask.to(self.device)

        def attend(_, q, k, v):
            return F.scaled_dot_product_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                                  attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

        return self.decoder(embeds, attend)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits while answering (training calls ``lm_head`` itself, with gradients)."""
        return self.lm_head(hidden).float()
