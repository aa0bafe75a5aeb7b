"""What an engine loads and how it runs: the one set of settings ``generate``, ``serve`` and the embedded backend
share, checked in one place and turned back into command-line flags for a server subprocess."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from specops.errors import SpecopsError

LORA_MODES = ("merged", "unmerged")
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DRAFTERS = ("eagle3", "schema", "schema+eagle3")
FORCED_TOKENS = 16  # schema-aware drafting: the most forced tokens a row drafts beyond γ in one round
AUTO_GAMMA_MAX = 5  # --gamma auto chooses γ in 0..5 each step
GammaSchedule = tuple[tuple[int, int, int], ...]  # --gamma-schedule: (first batch size, last batch size, γ) ranges


@dataclass(frozen=True)
class EngineConfig:
    """``gamma`` is the number of speculative tokens per step; without a ``draft`` decoding is plain (γ = 0).
    ``lora_mode``: merged folds the adapter into the weights at load, unmerged adds it in the forward.
    ``drafter``: ``eagle3`` proposes with the draft alone; ``schema+eagle3`` adds the tokens a request's JSON schema
    forces, beyond γ; ``schema`` proposes forced tokens alone, with no draft model. ``gamma_schedule`` (JSON text or
    [start, end, γ] ranges, see ``parse_gamma_schedule``): γ by running batch size; ``gamma`` is then its largest γ,
    the most drafts a round takes. ``prefix_cache``: reuse the keys and values of prompt prefixes requests share."""

    model: Path
    lora: Optional[Path] = None
    lora_mode: str = "merged"
    draft: Optional[Path] = None
    gamma: int = 3
    device: str = "cpu"
    dtype: str = "float32"
    max_batch: int = 16
    max_seq_len: int = 1024
    cuda_graphs: bool = True  # on CUDA, replay each decode round as a captured graph
    drafter: str = "eagle3"
    adaptive_gamma: bool = False  # --gamma auto: γ chosen every step, at most ``gamma``
    gamma_schedule: Optional[GammaSchedule] = None
    prefix_cache: bool = True

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.gamma_schedule is not None:
            schedule = parse_gamma_schedule(self.gamma_schedule)
            object.__setattr__(self, "gamma_schedule", schedule)
            object.__setattr__(self, "gamma", schedule_gamma(schedule))

    def validate(self) -> "EngineConfig":
        """Refuse settings that cannot load, naming the flag; returns self."""
        if not (Path(self.model) / "config.json").is_file():
            raise SpecopsError(f"--model: model directory not found or without config.json: {self.model}")
        for flag, path in (("--lora", self.lora), ("--draft", self.draft)):
            if path is not None and not Path(path).is_dir():
                raise SpecopsError(f"{flag}: directory not found: {path}")
        if self.lora_mode not in LORA_MODES:
            raise SpecopsError(f"--lora-mode must be one of {', '.join(LORA_MODES)}, not {self.lora_mode!r}")
        check_dtype(self.dtype)
        check_device(self.device)
        if self.gamma < 0:
            raise SpecopsError(f"--gamma must be >= 0, got {self.gamma}")
        if self.drafter not in DRAFTERS:
            raise SpecopsError(f"--drafter must be one of {', '.join(DRAFTERS)}, not {self.drafter!r}")
        if self.adaptive_gamma and self.draft is None:
            raise SpecopsError("--gamma auto chooses how many tokens the draft proposes: give --draft")
        if self.gamma_schedule is not None:
            if self.adaptive_gamma:
                raise SpecopsError("--gamma-schedule fixes γ per batch size: it excludes --gamma auto")
            if self.gamma > 0 and self.draft is None:
                raise SpecopsError(f"--gamma-schedule drafts up to {self.gamma} tokens per round: give --draft")
        if self.drafter == "schema" and self.draft is not None:
            raise SpecopsError("--drafter schema proposes forced tokens alone: drop --draft, or use schema+eagle3")
        if self.max_batch < 1:
            raise SpecopsError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_seq_len < 16:
            raise SpecopsError(f"--max-seq-len must be >= 16, got {self.max_seq_len}")
        return self

    @property
    def forced_tokens(self) -> int:
        """Forced tokens a row may draft beyond γ: 0 unless the drafter uses the schema."""
        return FORCED_TOKENS if self.drafter.startswith("schema") else 0

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    def argv(self) -> list[str]:
        """The same settings as ``specops serve`` / ``specops generate`` flags."""
        args = ["--model", str(self.model), "--device", self.device, "--dtype", self.dtype,
                "--max-batch", str(self.max_batch), "--max-seq-len", str(self.max_seq_len)]
        if self.lora is not None:
            args += ["--lora", str(self.lora), "--lora-mode", self.lora_mode]
        if self.draft is not None:
            args += ["--draft", str(self.draft), "--gamma", "auto" if self.adaptive_gamma else str(self.gamma)]
        if self.gamma_schedule is not None:
            args += ["--gamma-schedule", json.dumps(self.gamma_schedule, separators=(",", ":"))]
        if self.drafter != "eagle3":
            args += ["--drafter", self.drafter]
        if not self.cuda_graphs:
            args.append("--no-cuda-graphs")
        if not self.prefix_cache:
            args.append("--no-prefix-cache")
        return args


def parse_gamma(text: str) -> tuple[int, bool]:
    """``--gamma``: a number of speculative tokens, or ``auto`` (γ chosen every step, up to AUTO_GAMMA_MAX).
    Returns (γ, adaptive)."""
    if text.strip().lower() == "auto":
        return AUTO_GAMMA_MAX, True
    try:
        gamma = int(text)
    except ValueError:
        raise SpecopsError(f"--gamma must be a number of tokens or 'auto', not {text!r}") from None
    if gamma < 0:
        raise SpecopsError(f"--gamma must be >= 0, got {gamma}")
    return gamma, False


def parse_gamma_schedule(value: str | Sequence) -> GammaSchedule:
    """``--gamma-schedule``: vLLM's ``num_speculative_tokens_per_batch_size``, a JSON list of inclusive batch-size
    ranges with a γ each, ``[[1,4,5],[5,16,3],[17,64,1]]``: from batch size 1, each range starting right after the one
    before (so every batch size has exactly one γ). ``value``: the JSON text, or the list itself."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise SpecopsError(f"--gamma-schedule is not JSON: {value!r}") from None
    triples = isinstance(value, (list, tuple)) and value and all(
        isinstance(r, (list, tuple)) and len(r) == 3 and all(type(x) is int for x in r) for r in value)
    if not triples:
        raise SpecopsError("--gamma-schedule must be a non-empty JSON list of [start, end, γ] integer triples, "
                           f"like [[1,4,5],[5,16,3]]; got {json.dumps(value, default=str)}")
    schedule = tuple(tuple(r) for r in value)
    next_start = 1
    for start, end, gamma in schedule:
        where = f"--gamma-schedule: range {[start, end, gamma]}"
        if next_start == 1 and start != 1:
            raise SpecopsError(f"{where} must start at batch size 1")
        if start > next_start:
            raise SpecopsError(f"{where} leaves batch sizes {next_start}..{start - 1} without a γ")
        if start < next_start:
            raise SpecopsError(f"{where} overlaps the range before (it should start at {next_start})")
        if end < start:
            raise SpecopsError(f"{where} ends before it starts")
        if gamma < 0:
            raise SpecopsError(f"{where}: γ must be >= 0")
        next_start = end + 1
    return schedule


def gamma_at(schedule: GammaSchedule, batch: int) -> int:
    """The schedule's γ for ``batch`` running requests; beyond the last range, its γ (as vLLM does)."""
    return next((gamma for _, end, gamma in schedule if batch <= end), schedule[-1][2])


def schedule_gamma(schedule: GammaSchedule) -> int:
    """The most drafts a round of the schedule takes: its largest γ."""
    return max(gamma for _, _, gamma in schedule)


def canonical_dtype(dtype: str) -> str:
    """The torch name of a dtype alias (bf16 → bfloat16); other names unchanged."""
    return DTYPE_ALIASES.get(dtype, dtype)


def check_dtype(dtype: str) -> None:
    if canonical_dtype(dtype) not in DTYPES:
        raise SpecopsError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")


def check_device(device: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise SpecopsError(f"--device must be cpu, cuda or cuda:N, not {device!r}")
