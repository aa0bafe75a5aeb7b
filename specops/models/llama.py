"""Decoder-only transformer of the Llama family, run over a static per-slot KV cache.

One forward covers Llama 2/3.x (incl. ``rope_type: llama3``), Llama-based Nemotron, Mistral, Qwen2 (q/k/v bias)
and Qwen3 (per-head q_norm/k_norm). Module names follow Hugging Face's, so a checkpoint's state dict loads as is.

The forward takes tokens ``[B, T]`` and the attention metadata of the forward (``models.attention``: which cache
slot and position each token has), writes the new keys/values into the cache and attends over it. Hidden states
flow token-major ([B·T, H]); the residual stream and the normed sublayer inputs are kept apart so the CUDA path
can fuse each residual add with the norm that follows it (``models.ops``).

``tap_layers`` returns the EAGLE-3 taps with vLLM's meaning: for layer id ``i`` the residual stream entering
layer ``i`` (the embedding for ``i = 0``, Hugging Face's ``hidden_states[i]``), concatenated in ascending layer order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specops.errors import SpecopsError
from specops.models import ops
from specops.models.attention import rotate
from specops.models.kv_cache import KVCache

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
}
SUPPORTED_ROPE = {"default", "linear", "llama3"}
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of an HF ``config.json`` the forward depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    sliding_window: int | None = None  # attention here is full; contexts must stay within a configured window

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        missing = [k for k in REQUIRED_FIELDS if not isinstance(d.get(k), int) or d[k] < 1]
        if missing:
            raise SpecopsError(f"{', '.join(missing)} missing or not a positive integer")
        archs = d.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise SpecopsError(
                f"unsupported architecture {archs or d.get('model_type')}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise SpecopsError(f"unsupported activation {act!r}; only silu is implemented")
        # transformers >= 5 nests theta and scaling in rope_parameters; older files use rope_theta + rope_scaling.
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE:
            raise SpecopsError(f"unsupported rope_type {rope_type!r}; supported: {sorted(SUPPORTED_ROPE)}")
        rope["rope_type"] = rope_type
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        bias = arch == "Qwen2ForCausalLM" or bool(d.get("attention_bias", False))
        qwen = arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
        window = d.get("sliding_window") if (d.get("use_sliding_window") or not qwen) else None
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rope,
            attention_bias=bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            architecture=arch,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            sliding_window=int(window) if window else None,
        )

    def default_tap_layers(self) -> tuple[int, int, int]:
        """vLLM's default EAGLE-3 taps: early, middle and late layer."""
        n = self.num_hidden_layers
        return (2, n // 2, n - 3)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies of rotary embedding, with the configured scaling applied (float64 for exactness)."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.rope_scaling
    if rs["rope_type"] == "linear":
        inv = inv / float(rs["factor"])
    elif rs["rope_type"] == "llama3":
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old_len = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old_len / low, old_len / high
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > low_wavelen, inv / factor, inv)
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, inv)
    return inv


class Rotary(nn.Module):
    """cos/sin tables for every position the cache can hold; looked up by per-token position."""

    def __init__(self, cfg: LlamaConfig, max_len: int):
        super().__init__()
        inv = rope_inv_freq(cfg).float()
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions [B, T], shaped [B, T, 1, head_dim] to broadcast over heads."""
        return self.cos[positions].unsqueeze(2).to(dtype), self.sin[positions].unsqueeze(2).to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, T, heads, head_dim]; positions: [B, T]."""
        return rotate(x, *self.tables(positions, x.dtype))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, in_features: int | None = None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        inp = in_features or h
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(inp, self.n_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(inp, self.n_kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(inp, self.n_kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.qkv_proj: nn.Linear | None = None  # set by fuse()

    def fuse(self) -> None:
        """Serve q, k and v from one matmul over their stacked weights (the checkpoint layout is gone after)."""
        self.qkv_proj = _stacked(self, "q_proj", "k_proj", "v_proj") or self.qkv_proj

    def forward(self, x: torch.Tensor, cache: KVCache, layer: int, meta, rope) -> torch.Tensor:
        """x: [N, in] → [N, H]; ``meta``/``rope``: the forward's attention metadata and this model's rotary."""
        h, kv, d = self.n_heads, self.n_kv, self.head_dim
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)
        else:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if self.qk_norm:
            heads = qkv.view(-1, h + 2 * kv, d)
            qkv = torch.cat([self.q_norm(heads[:, :h]), self.k_norm(heads[:, h : h + kv]), heads[:, h + kv :]],
                            dim=1).view(qkv.shape)
        return self.o_proj(meta.attend(qkv, h, kv, d, cache, layer, rope))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.gate_up_proj: nn.Linear | None = None  # set by fuse()

    def fuse(self) -> None:
        """Serve gate and up from one matmul (the checkpoint layout is gone after)."""
        self.gate_up_proj = _stacked(self, "gate_proj", "up_proj") or self.gate_up_proj

    def forward(self, x):
        if self.gate_up_proj is not None:
            return self.down_proj(ops.silu_mul(self.gate_up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _stacked(module: nn.Module, *names: str) -> nn.Linear | None:
    """One linear layer whose output is the named layers' outputs side by side; they are removed from ``module``.
    None (and nothing removed) if any of them is not a plain nn.Linear, e.g. one carrying an unmerged LoRA."""
    parts = [getattr(module, n, None) for n in names]
    if not all(type(p) is nn.Linear for p in parts):
        return None
    w = parts[0].weight
    fused = nn.Linear(w.shape[1], sum(p.out_features for p in parts), bias=parts[0].bias is not None,
                      device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    for n in names:
        delattr(module, n)
    return fused.requires_grad_(False)


def fuse_projections(model: nn.Module) -> nn.Module:
    """Stack q/k/v and gate/up of every layer for serving: fewer, larger matmuls, the same numbers up to rounding.
    The model can no longer save or load a checkpoint state dict; engines call this on the models they own."""
    for m in model.modules():
        if isinstance(m, (Attention, MLP)):
            m.fuse()
    return model


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, normed, residual, cache, layer: int, meta, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """``normed``: input_layernorm of ``residual``, the stream entering the layer. Returns the MLP's output
        and the stream after attention (their sum is the stream leaving the layer)."""
        h = self.self_attn(normed, cache, layer, meta, rope)
        h, residual = ops.add_rms_norm(h, residual, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Target model. ``forward`` returns logits for every input token and, if asked, the EAGLE-3 taps."""

    def __init__(self, cfg: LlamaConfig, max_len: int):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg, max_len)

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        cfg, w = self.config, self.model.embed_tokens.weight
        return KVCache(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, max_len, cfg.head_dim, w.dtype, w.device)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        meta,
        tap_layers: tuple[int, ...] = (),
        logits_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens: [B, T]; ``meta``: the forward's attention metadata (``models.attention``). Returns logits
        [B, T, V] and the taps [B, T, len(tap_layers)·H] (None without tap layers).

        ``logits_at`` [K]: indices into the flattened B·T tokens whose logits alone are wanted (a prefill's last
        prompt tokens); the logits are then [K, V] and the LM head skips every other token."""
        b, t = tokens.shape
        h = self.model.embed_tokens(tokens.reshape(-1))
        rope = meta.rope(self.rotary, h.dtype)
        residual, taps = None, []
        for i, layer in enumerate(self.model.layers):
            ln = layer.input_layernorm
            if residual is None:
                residual, normed = h, ln(h)
            else:
                normed, residual = ops.add_rms_norm(h, residual, ln.weight, ln.eps)
            if i in tap_layers:
                taps.append(residual)
            h, residual = layer(normed, residual, cache, i, meta, rope)
        if logits_at is not None:
            h, residual = h[logits_at], residual[logits_at]
        logits = self.lm_head(self.model.norm(residual + h))
        if logits_at is None:
            logits = logits.view(b, t, -1)
        return logits, (torch.cat(taps, dim=-1).view(b, t, -1) if taps else None)
