"""EAGLE-3 draft head in the checkpoint layout vLLM's ``LlamaForCausalLMEagle3`` loads.

Layout: ``fc`` fuses three target taps (3·H_target → H); one decoder layer ``midlayer.*`` whose attention reads
[input_layernorm(embed(token)); hidden_norm(hidden)] (2·H wide); ``norm``; ``lm_head`` over a reduced draft
vocabulary; ``d2t`` (int64, target_id = draft_id + d2t[draft_id]) and ``t2d`` (bool over the target vocabulary);
``embed_tokens`` only if the draft has its own, else the target's embedding is shared.

Semantics follow vLLM: the first pass of a round takes fc(target taps at position p) with the token at p + 1 and
runs at position p; later chain steps feed back the layer's pre-norm output (the residual stream before ``norm``),
one token at a time. ``norm_before_residual`` (a SpecForge option) makes the residual start from the normed hidden.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specops.errors import SpecopsError, naming
from specops.files import (
    check_shapes,
    checkpoint_shapes,
    load_safetensors,
    read_json,
    safetensors_files,
    save_safetensors,
)
from specops.models import ops
from specops.models.kv_cache import KVCache
from specops.models.llama import MLP, Attention, LlamaConfig, RMSNorm, Rotary

ARCHITECTURE = "LlamaForCausalLMEagle3"


def tap_layer_ids(draft_config: dict[str, Any], target_config: LlamaConfig) -> tuple[int, ...]:
    """Target layers the draft reads: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (or the top-level key
    newer vLLM reads), else vLLM's default (2, N//2, N−3). Returned sorted: vLLM concatenates taps in layer order."""
    ids = (draft_config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = ids or draft_config.get("eagle_aux_hidden_state_layer_ids") or target_config.default_tap_layers()
    n = target_config.num_hidden_layers
    if len(set(ids)) != 3 or not all(0 <= i < n for i in ids):
        raise SpecopsError(
            f"EAGLE-3 needs three distinct target layers in [0, {n}); got {list(ids)} "
            "(set eagle_config.eagle_aux_hidden_state_layer_ids, or use a target with >= 8 layers)"
        )
    return tuple(sorted(ids))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: LlamaConfig, norm_before_residual: bool):
        super().__init__()
        h = cfg.hidden_size
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, in_features=2 * h)
        self.mlp = MLP(cfg)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, cache, meta, rope):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        post = self.post_attention_layernorm
        h, residual = ops.add_rms_norm(self.self_attn(x, cache, 0, meta, rope), residual, post.weight, post.eps)
        return residual + self.mlp(h)


class Eagle3Draft(nn.Module):
    def __init__(self, config: dict[str, Any], target_config: LlamaConfig, max_len: int = 4096):
        super().__init__()
        self.config = dict(config)
        cfg = LlamaConfig.from_dict({**config, "architectures": ["LlamaForCausalLM"]})
        self.cfg = cfg
        self.target_config = target_config
        self.draft_vocab_size = int(config.get("draft_vocab_size") or cfg.vocab_size)
        target_hidden = int(config.get("target_hidden_size") or cfg.hidden_size)
        if target_hidden != target_config.hidden_size:
            raise SpecopsError(f"draft trained for a target hidden size of {target_hidden}, this target has "
                               f"{target_config.hidden_size}")
        if cfg.vocab_size != target_config.vocab_size:
            raise SpecopsError(f"draft trained for a target vocab_size of {cfg.vocab_size}, this target has "
                               f"{target_config.vocab_size}")
        if self.draft_vocab_size > cfg.vocab_size:
            raise SpecopsError(f"draft_vocab_size {self.draft_vocab_size} exceeds the vocabulary {cfg.vocab_size}")
        self.tap_layers = tap_layer_ids(config, target_config)
        self.fc = nn.Linear(3 * target_hidden, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg, bool(config.get("norm_before_residual", False)))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, self.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.embed_tokens: nn.Embedding | None = None  # set when the checkpoint has its own
        self.target_embed: nn.Embedding | None = None  # the target's, used otherwise (not saved)
        self.rotary = Rotary(cfg, max_len)

    # -- construction -------------------------------------------------------------------------------------------

    @classmethod
    def random(
        cls,
        target_config: LlamaConfig,
        draft_vocab_size: int | None = None,
        seed: int = 0,
        token_ids: list[int] | None = None,
        tap_layer_ids: tuple[int, int, int] | None = None,
    ) -> "Eagle3Draft":
        """A seeded random draft shaped for ``target_config``: the target's width and heads, draft vocabulary
        of the first ``draft_vocab_size`` ids (or ``token_ids``), sharing the target's embedding."""
        t = target_config
        ids = sorted(set(token_ids)) if token_ids is not None else list(range(draft_vocab_size or t.vocab_size))
        if not ids or ids[-1] >= t.vocab_size or ids[0] < 0:
            raise SpecopsError("draft token ids must be a non-empty subset of the target vocabulary")
        config = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": t.rope_theta,
            "max_position_embeddings": t.max_position_embeddings,
            "vocab_size": t.vocab_size,
            "draft_vocab_size": len(ids),
            "target_hidden_size": t.hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        }
        if t.rope_scaling.get("rope_type", "default") != "default":
            config["rope_scaling"] = dict(t.rope_scaling)
        if tap_layer_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(tap_layer_ids)}
        draft = cls(config, t)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in draft.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            idx = torch.tensor(ids, dtype=torch.int64)
            draft.d2t.copy_(idx - torch.arange(len(ids)))
            draft.t2d.zero_()
            draft.t2d[idx] = True
        return draft

    @classmethod
    def load(cls, draft_dir: str | Path, target, max_len: int = 4096) -> "Eagle3Draft":
        """Read a draft directory (ours or a published EAGLE-3 checkpoint) for ``target`` (a LlamaForCausalLM)."""
        draft_dir = Path(draft_dir)
        config_path = draft_dir / "config.json"
        if not config_path.is_file():
            raise SpecopsError(f"draft directory has no config.json: {draft_dir}")
        config = read_json(config_path)
        archs = config.get("architectures") or []
        if not any("Eagle3" in a for a in archs):
            raise SpecopsError(f"{draft_dir}: not an EAGLE-3 draft (architectures {archs})")
        if int(config.get("num_hidden_layers", 1)) != 1:
            raise SpecopsError(f"{draft_dir}: EAGLE-3 drafts with {config['num_hidden_layers']} layers are not supported")
        with naming(str(config_path)):
            draft = cls(config, target.config, max_len)
        bin_path, state = draft_dir / "pytorch_model.bin", None
        if bin_path.is_file() and not list(draft_dir.glob("*.safetensors")):
            try:
                state = torch.load(bin_path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - torch raises several types for a damaged file
                raise SpecopsError(f"{bin_path}: truncated or not a PyTorch checkpoint ({e})") from None
            found = {k: (tuple(v.shape), bin_path) for k, v in state.items()}
        else:
            files = safetensors_files(draft_dir)
            found = checkpoint_shapes(files)
        fc_shape, fc_file = found.get("fc.weight", ((), None))
        if len(fc_shape) == 2 and fc_shape[1] != 3 * target.config.hidden_size:
            raise SpecopsError(f"{fc_file}: draft trained for a target hidden size of {fc_shape[1] // 3} (fc.weight is "
                               f"{fc_shape}), this target has {target.config.hidden_size}")
        params = draft.state_dict()
        expected = {k: tuple(v.shape) for k, v in params.items()}
        if "embed_tokens.weight" in found:
            expected["embed_tokens.weight"] = (draft.cfg.vocab_size, draft.cfg.hidden_size)
        check_shapes(found, expected, f"{config_path} and this target")
        if state is None:
            state = load_safetensors(files)
        own_embed = state.pop("embed_tokens.weight", None)
        draft.load_state_dict({k: v.to(params[k].dtype) for k, v in state.items()})
        if own_embed is not None:
            draft.embed_tokens = nn.Embedding(*own_embed.shape, _weight=own_embed.clone())
        mapped = torch.arange(draft.draft_vocab_size) + draft.d2t
        lo, hi, vocab = int(mapped.min()), int(mapped.max()), draft.cfg.vocab_size
        if lo < 0 or hi >= vocab:
            raise SpecopsError(f"{found['d2t'][1]}: d2t maps draft ids to target ids {lo}..{hi}, outside this "
                               f"target's vocabulary of {vocab}")
        if mapped.unique().numel() != mapped.numel():
            raise SpecopsError(f"{found['d2t'][1]}: d2t maps several draft ids to the same target id")
        with naming(str(config_path)):
            return draft.attach(target)

    def attach(self, target) -> "Eagle3Draft":
        """Share the target's embedding when the draft has none; match its device and dtype."""
        if self.embed_tokens is None and self.cfg.hidden_size != target.config.hidden_size:
            raise SpecopsError(
                f"draft hidden size {self.cfg.hidden_size} differs from the target's {target.config.hidden_size} "
                "and the draft has no embed_tokens of its own"
            )
        w = target.model.embed_tokens.weight
        self.to(device=w.device, dtype=w.dtype)  # d2t/t2d are integer/bool buffers: .to(dtype) leaves them
        # Kept outside the module tree: the target's embedding is neither a draft parameter nor saved with it.
        object.__setattr__(self, "target_embed", target.model.embed_tokens)
        return self

    def save(self, out_dir: str | Path) -> Path:
        """Write config.json + model.safetensors in the layout vLLM loads (no target weights)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        config = dict(self.config)
        dtype = self.fc.weight.dtype
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        # Pin the taps: the draft was built for these layers, whatever vLLM's default for the target would be.
        ids = list(self.tap_layers)
        config["eagle_config"] = {**(config.get("eagle_config") or {}), "eagle_aux_hidden_state_layer_ids": ids}
        save_safetensors(state, out / "model.safetensors")
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return out

    # -- forward ------------------------------------------------------------------------------------------------

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        c, w = self.cfg, self.fc.weight
        return KVCache(1, slots, c.num_key_value_heads, max_len, c.head_dim, w.dtype, w.device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return (self.embed_tokens if self.embed_tokens is not None else self.target_embed)(tokens)

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        """Fuse the target's three taps [.., 3·H_target] into the draft's hidden [.., H]."""
        return self.fc(taps)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache, meta, full_vocab: bool = True,
                at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: [B, T]; hidden: [B·T, H] (fc output, or a previous step's pre-norm output); ``meta``: the attention
        metadata of these tokens. Returns (logits, pre-norm [B·T, H]): logits over the target vocabulary [B·T, V]
        with −inf outside the draft vocabulary, or with ``full_vocab=False`` over the draft vocabulary
        [B·T, V_draft] (map ids with ``to_target``), which is all an argmax needs. ``at`` [K]: indices into the
        B·T tokens whose logits and pre-norm alone are returned ([K, ·])."""
        embeds = self.embed(tokens.reshape(-1))
        prenorm = self.midlayer(embeds, hidden.reshape(embeds.shape[0], -1), cache, meta,
                                meta.rope(self.rotary, embeds.dtype))
        if at is not None:
            prenorm = prenorm[at]
        draft_logits = self.lm_head(self.norm(prenorm))
        if not full_vocab:
            return draft_logits, prenorm
        logits = draft_logits.new_full(draft_logits.shape[:-1] + (self.cfg.vocab_size,), float("-inf"))
        logits[..., torch.arange(self.draft_vocab_size, device=tokens.device) + self.d2t] = draft_logits
        return logits, prenorm

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids to target ids (``d2t`` holds the offsets)."""
        return draft_ids + self.d2t[draft_ids]
