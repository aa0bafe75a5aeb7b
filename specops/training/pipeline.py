"""``train-draft`` end to end: prompts → regenerated answers → features → vocabulary → TTT → evaluation → draft dir.

Everything in progress lives in a hidden sibling ``.NAME.partial/`` (data cache, training checkpoint, the draft
being written); rerunning the same command resumes there. The finished draft directory is renamed into place
last, so a directory at ``--out`` is always complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError
from specops.files import read_json
from specops.models.eagle3 import tap_layer_ids
from specops.models.llama import LlamaConfig
from specops.models.target import load_tokenizer
from specops.training import card, data, draft_init, evaluate, vocab
from specops.training import sources as prompt_sources
from specops.training.train import Data, TrainConfig, train

DEFAULT_DRAFT_VOCAB = 32_000


@dataclass(frozen=True)
class Source:
    """Where the prompts come from: ``file`` (a JSONL path), ``synthetic`` (N task queries) or ``records``
    (request records the caller built, described by ``label``)."""

    kind: str
    value: str | int | tuple[dict, ...]
    exclude: tuple[str, ...] = ()  # synthetic queries never to train on (someone's held-out set)
    label: str = ""

    def describe(self) -> str:
        held = f" (none of {len(self.exclude)} held-out queries)" if self.exclude else ""
        return {"file": f"prompts from {self.value}", "synthetic": f"{self.value} synthetic commerce queries{held}",
                "records": self.label}[self.kind]


@dataclass(frozen=True)
class Job:
    target: Path
    out: Path
    source: Source
    lora: Path | None = None
    init: Path | None = None
    draft_vocab_size: int | None = None
    online: bool = False
    device: str = "cpu"
    temperature: float = 0.0
    max_new_tokens: int = 256
    eval_prompts: int = 32
    max_batch: int = 16  # requests the target answers at once while regenerating (more pays on a GPU)
    train: TrainConfig = field(default_factory=TrainConfig)


Progress = Callable[[str, int, int, dict], None]  # (stage, done, total, fields)


def load_prompts(job: Job, tokenizer) -> tuple[list[list[int]], int]:
    s = job.source
    if s.kind == "file":
        return prompt_sources.from_jsonl(tokenizer, Path(s.value))
    if s.kind == "synthetic":
        return prompt_sources.synthetic(tokenizer, int(s.value), job.train.seed, set(s.exclude)), 0
    if s.kind == "records":
        return prompt_sources.from_records(tokenizer, list(s.value))
    raise SpecopsError(f"unknown prompt source {s.kind!r}")


def check_out(out: Path) -> None:
    """``--out`` may be new, empty, or a previous draft (replaced); anything else is refused, never deleted."""
    if out.is_file():
        raise SpecopsError(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()):
        cfg = out / "config.json"
        archs = read_json(cfg).get("architectures", []) if cfg.is_file() else []
        if not any("Eagle3" in a for a in archs):
            raise SpecopsError(f"--out {out} exists and is not an EAGLE-3 draft directory; choose another path")


def relative(path: Path | None, out: Path) -> str | None:
    return None if path is None else os.path.relpath(Path(path).resolve(), out.resolve())


def sampling_params(job: Job, n: int) -> list[SamplingParams]:
    greedy = job.temperature == 0
    return [SamplingParams(temperature=job.temperature, max_tokens=job.max_new_tokens,
                           seed=None if greedy else job.train.seed * 1_000_003 + i) for i in range(n)]


def run(job: Job, progress: Progress = lambda *a: None) -> dict:
    """Train a draft as ``job`` says; returns the report also written to ``OUT/train_report.json``."""
    out = Path(job.out)
    check_out(out)
    if not (Path(job.target) / "config.json").is_file():
        raise SpecopsError(f"target directory has no config.json: {job.target}")
    raw = read_json(Path(job.target) / "config.json")
    target_cfg = LlamaConfig.from_dict(raw)
    if job.init is not None and not (Path(job.init) / "config.json").is_file():
        raise SpecopsError(f"--init draft not found (no config.json): {job.init}")
    tap_layers = tap_layer_ids(read_json(Path(job.init) / "config.json") if job.init else {}, target_cfg)
    torch.manual_seed(job.train.seed)
    tokenizer = load_tokenizer(job.target, target_cfg.vocab_size)
    all_prompts, skipped = load_prompts(job, tokenizer)
    train_prompts, eval_prompts = prompt_sources.split(all_prompts, job.eval_prompts, job.train.seed)
    max_seq = min(target_cfg.max_position_embeddings, max(map(len, all_prompts)) + job.max_new_tokens + 1)
    engine = Engine.load(job.target, lora=job.lora, device=job.device, max_seq_len=max_seq, max_batch=job.max_batch)
    model = engine.model
    init = draft_init.load_init(Path(job.init), model) if job.init else None

    partial = out.parent / f".{out.name}.partial"
    prompt_hash = hashlib.sha256(json.dumps(train_prompts).encode()).hexdigest()
    key = data.fingerprint(target=data.model_identity(job.target), lora=data.model_identity(job.lora),
                           prompts=prompt_hash, temperature=job.temperature, max_new_tokens=job.max_new_tokens,
                           seed=job.train.seed, tap_layers=tap_layers)
    cache = data.ShardCache(partial / "data", key)
    examples = data.regenerate(engine, train_prompts, sampling_params(job, len(train_prompts)), cache,
                               lambda d, t: progress("regenerate", d, t, {}))

    size = job.draft_vocab_size or (init.draft_vocab_size if init is not None else DEFAULT_DRAFT_VOCAB)
    chosen, _, _ = vocab.build([e.answer for e in examples], target_cfg.vocab_size, size)
    draft = draft_init.revocab(init, model, chosen) if init is not None else draft_init.fresh(model, chosen, job.train.seed, tap_layers)

    features = None if job.online else data.capture(model, examples, tap_layers, cache, job.device,
                                                    progress=lambda d, t: progress("capture", d, t, {}))
    dataset = Data(examples, features, model, tap_layers, job.device)

    before = None
    if init is not None and eval_prompts:
        progress("evaluate", 0, 2, {})
        before = evaluate.acceptance(engine, init, eval_prompts, job.max_new_tokens)
    run_key = f"{key}:{relative(job.init, out)}:{chosen.numel()}"
    history = train(draft, model, dataset, job.train, partial / "train.pt", run_key,
                    lambda step, total, r: progress("train", step, total, {
                        "loss": r.loss.item(),
                        "acc": [c / n if n else 0.0 for c, n in zip(r.step_correct, r.step_counts)]}))
    after = None
    if eval_prompts:
        progress("evaluate", 1, 2, {})
        after = evaluate.acceptance(engine, draft, eval_prompts, job.max_new_tokens)
        progress("evaluate", 2, 2, {})

    report = {
        "target": relative(job.target, out),
        "lora": relative(job.lora, out),
        "init": relative(job.init, out),
        "prompts": {"source": job.source.describe(), "train": len(train_prompts), "heldout": len(eval_prompts),
                    "skipped_lines": skipped},
        "data": {"examples": len(examples), "answer_tokens": sum(len(e.answer) for e in examples),
                 "temperature": job.temperature, "max_new_tokens": job.max_new_tokens,
                 "mode": "online" if job.online else "cached"},
        "draft_vocab_size": int(chosen.numel()),
        "aux_layers": list(tap_layers),
        "training": {**asdict(job.train), **history},
        "acceptance": {"before": before, "after": after},
    }
    staging = partial / "draft"
    shutil.rmtree(staging, ignore_errors=True)
    draft.save(staging)
    (staging / "train_report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (staging / "README.md").write_text(card.render(report), encoding="utf-8")
    publish(staging, out)
    shutil.rmtree(partial)
    return report


def publish(staging: Path, out: Path) -> None:
    """Move the finished draft to ``out``; a previous draft there is replaced, never left half-overwritten."""
    out.parent.mkdir(parents=True, exist_ok=True)
    old = staging.parent / "previous"
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
