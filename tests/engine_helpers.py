"""Seeded tiny models for the engine tests: a random Llama target with a character tokenizer, and drafts."""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specops.models.attention import TorchAttention
from specops.models.eagle3 import Eagle3Draft

# The test models are a few 64-wide matrices: extra intra-op threads only add synchronisation, and on a shared
# two-core machine they spin against other processes (measured: ~50x slower per linear layer).
torch.set_num_threads(1)

SPECIALS = ["<pad>", "<s>", "</s>"]
CHARS = string.ascii_lowercase + " .,:{}\"'0123456789"  # 3 specials + 45 characters = 48 tokens


def save_char_tokenizer(out: Path, chars: str = CHARS) -> PreTrainedTokenizerFast:
    """One token per character after <pad>=0, <s>=1, </s>=2; decoding concatenates."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out))
    return fast


def make_target(out: Path, *, seed: int = 0, vocab_size: int = 64, layers: int = 8, bigram: float = 0.0,
                heads: int = 2, kv_heads: int = 1, lm_head_std: float = 1.0, chars: str = CHARS,
                **extra) -> LlamaForCausalLM:
    """Random Llama (head_dim 32) saved with a tokenizer. ``bigram`` in (0, 1]: scale every layer's attention and
    MLP output down by that factor, so the next token depends mostly on the current one (a predictable target)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=32, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **extra,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # HF's init (std 0.02) makes near-uniform logits; sharpen them
            if p.dim() == 2:
                p.normal_(0, 0.3)
        model.lm_head.weight.normal_(0, lm_head_std)
        model.model.embed_tokens.weight.normal_(0, 1.0)
        if bigram:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(bigram)
                layer.mlp.down_proj.weight.mul_(bigram)
    model.save_pretrained(str(out))
    save_char_tokenizer(out, chars)
    return model


def bigram_draft(target: LlamaForCausalLM, engine_target) -> Eagle3Draft:
    """A draft that predicts the target's bigram: ``norm_before_residual`` with a zero ``hidden_norm`` removes the
    fed-back hidden state, attention goes (almost) only to the draft's own position and copies the token's normed
    embedding through, and the target's norm and lm_head score it. Against a ``bigram``-scaled target it is
    right most of the time at every chain position, so long accepted runs and full acceptance occur."""
    cfg = engine_target.config
    h = cfg.hidden_size
    draft = Eagle3Draft.random(cfg, seed=1)
    draft.config["norm_before_residual"] = True
    draft.midlayer.norm_before_residual = True
    assert cfg.num_key_value_heads * cfg.head_dim == h == cfg.num_attention_heads * cfg.head_dim
    with torch.no_grad():
        eye = torch.eye(h)
        att = draft.midlayer.self_attn
        for lin, w in ((att.q_proj, 4.0 * eye), (att.k_proj, eye), (att.v_proj, eye)):
            lin.weight.zero_()
            lin.weight[:, :h] = w
        att.o_proj.weight.copy_(eye)
        draft.midlayer.hidden_norm.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.lm_head.weight.copy_(target.lm_head.weight * target.model.norm.weight)
    return draft


def forward(model, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None, slots=None, **kw):
    """One target forward from scratch over rows of tokens (positions 0.. and slots 0.. unless given)."""
    b, t = tokens.shape
    positions = torch.arange(t).expand(b, t) if positions is None else positions
    slots = torch.arange(b) if slots is None else slots
    cache = model.new_cache(b, int(positions.max()) + 1) if cache is None else cache
    return model(tokens, cache, TorchAttention.build(slots, positions), **kw)


def draft_forward(draft, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache, slots):
    """The draft over rows of tokens; logits and pre-norm output shaped [B, T, ·] like the rows."""
    b, t = tokens.shape
    logits, prenorm = draft(tokens, hidden.reshape(b * t, -1), cache, TorchAttention.build(slots, positions))
    return logits.view(b, t, -1), prenorm.view(b, t, -1)
