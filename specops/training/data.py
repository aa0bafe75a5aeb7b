"""Self-distilled training data: the target answers the prompts again, then one teacher-forced forward over
prompt + answer captures what the draft reads (the three tapped hidden states) and what it is trained against
(the final hidden state, from which the target's logits are recomputed at train time instead of storing V-sized
logits).

Both stages are cached in shards under one directory: ``answers-NNNNN.json`` (token ids) and, unless training
online, ``features-NNNNN.safetensors``. Each shard is written to a temporary name and renamed, so a rerun skips
finished shards and redoes at most the one that was interrupted. ``manifest.json`` fingerprints what the cache
was made from; a cache made from anything else is discarded.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save

from specops.errors import SpecopsError
from specops.models.attention import TorchAttention

SHARD = 64  # prompts per shard: small enough that an interrupted shard costs little to redo
FEATURE_DTYPE = torch.bfloat16  # what EAGLE-3 trainers store; halves the cache


@dataclass
class Example:
    prompt: list[int]
    answer: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.answer


@dataclass
class Features:
    """Per token of one example: the concatenated taps [L, 3·H] and the final (pre-norm) hidden state [L, H]."""

    taps: torch.Tensor
    final: torch.Tensor


def fingerprint(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_identity(path: str | Path | None) -> dict | None:
    """Path plus size and mtime of its weight files: a retrained model in the same directory invalidates a cache."""
    if path is None:
        return None
    path = Path(path).resolve()
    files = sorted(path.glob("*.safetensors"))
    return {"path": str(path), "files": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]}


class ShardCache:
    """A directory of numbered, atomically written shards, bound to one fingerprint."""

    def __init__(self, root: Path, key: str):
        self.root = Path(root)
        manifest = self.root / "manifest.json"
        if manifest.is_file() and json.loads(manifest.read_text()).get("key") != key:
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            self._write(manifest, json.dumps({"key": key}).encode())

    def path(self, kind: str, i: int, suffix: str) -> Path:
        return self.root / f"{kind}-{i:05d}{suffix}"

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise SpecopsError(
                    f"disk full while caching training data in {self.root} ({len(data) / 1e6:.1f} MB shard); "
                    "free space there, or train with --online"
                ) from None
            raise
        os.replace(tmp, path)

    def write_json(self, path: Path, obj) -> None:
        self._write(path, json.dumps(obj).encode())

    def write_tensors(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        self._write(path, save({k: v.contiguous() for k, v in sorted(tensors.items())}, metadata={"format": "pt"}))


def regenerate(engine, prompts: list[list[int]], params: list, cache: ShardCache,
               progress: Callable[[int, int], None] = lambda done, total: None) -> list[Example]:
    """The target's own answers to ``prompts`` (the stop token kept, as the engine returns it), shard by shard.

    ``params`` holds one ``SamplingParams`` per prompt (per-request seeds keep sampled answers reproducible).
    """
    examples: list[Example] = []
    for s in range(0, len(prompts), SHARD):
        chunk = prompts[s : s + SHARD]
        path = cache.path("answers", s // SHARD, ".json")
        if path.is_file():
            answers = json.loads(path.read_text())
        else:
            answers = [list(o.token_ids) for o in engine.generate(chunk, params[s : s + SHARD])]
            cache.write_json(path, answers)
        examples += [Example(list(p), a) for p, a in zip(chunk, answers)]
        progress(min(s + SHARD, len(prompts)), len(prompts))
    return examples


@torch.no_grad()
def forward_features(target, token_rows: list[list[int]], tap_layers: tuple[int, ...], device) -> list[Features]:
    """One teacher-forced target forward over right-padded rows; float32 features trimmed to each row's length."""
    width = max(map(len, token_rows))
    tokens = torch.zeros(len(token_rows), width, dtype=torch.long)
    for r, row in enumerate(token_rows):
        tokens[r, : len(row)] = torch.tensor(row)
    tokens = tokens.to(device)
    positions = torch.arange(width, device=device).expand_as(tokens)
    meta = TorchAttention.build(torch.arange(len(token_rows), device=device), positions)
    captured = {}
    hook = target.model.norm.register_forward_hook(lambda m, args, out: captured.setdefault("final", args[0]))
    try:
        _, taps = target(tokens, target.new_cache(len(token_rows), width), meta, tap_layers=tap_layers)
    finally:
        hook.remove()
    final = captured["final"].view(len(token_rows), width, -1)
    return [Features(taps[r, : len(row)].float(), final[r, : len(row)].float()) for r, row in enumerate(token_rows)]


def capture(target, examples: list[Example], tap_layers: tuple[int, ...], cache: ShardCache, device,
            batch: int = 16, progress: Callable[[int, int], None] = lambda done, total: None) -> list[Features]:
    """Features of every example, cached per shard in ``FEATURE_DTYPE``."""
    out: list[Features] = []
    for s in range(0, len(examples), SHARD):
        chunk = examples[s : s + SHARD]
        path = cache.path("features", s // SHARD, ".safetensors")
        if not path.is_file():
            feats = []
            for b in range(0, len(chunk), batch):
                feats += forward_features(target, [e.tokens for e in chunk[b : b + batch]], tap_layers, device)
            cache.write_tensors(path, {
                "taps": torch.cat([f.taps for f in feats]).to(FEATURE_DTYPE).cpu(),
                "final": torch.cat([f.final for f in feats]).to(FEATURE_DTYPE).cpu(),
                "lengths": torch.tensor([len(e.tokens) for e in chunk]),
            })
        t = load_file(str(path))
        if t["lengths"].tolist() != [len(e.tokens) for e in chunk]:
            raise SpecopsError(f"{path}: cached features do not match the cached answers; delete {cache.root}")
        for a, f in zip(t["taps"].split(t["lengths"].tolist()), t["final"].split(t["lengths"].tolist())):
            out.append(Features(a, f))
        progress(min(s + SHARD, len(examples)), len(examples))
    return out
