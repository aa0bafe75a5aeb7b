"""What an engine loads and how it runs: the one set of settings ``generate``, ``serve`` and the embedded backend
share, checked in one place and turned back into command-line flags for a server subprocess."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops.errors import SpecopsError

LORA_MODES = ("merged", "unmerged")
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DRAFTERS = ("eagle3", "schema", "schema+eagle3")
FORCED_TOKENS = 16  # schema-aware drafting: the most forced tokens a row drafts beyond γ in one round
AUTO_GAMMA_MAX = 5  # --gamma auto chooses γ in 0..5 each step


@dataclass(frozen=True)
class EngineConfig:
    """``gamma`` is the number of speculative tokens per step; without a ``draft`` decoding is plain (γ = 0).
    ``lora_mode``: merged folds the adapter into the weights at load, unmerged adds it in the forward.
    ``drafter``: ``eagle3`` proposes with the draft alone; ``schema+eagle3`` adds the tokens a request's JSON schema
    forces, beyond γ; ``schema`` proposes forced tokens alone, with no draft model."""

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

    def __post_init__(self):
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))  # bf16 → bfloat16

    def validate(self) -> "EngineConfig":
        """Refuse settings that cannot load, naming the flag; returns self."""
        if not (Path(self.model) / "config.json").is_file():
            raise SpecopsError(f"--model: model directory not found or without config.json: {self.model}")
        for flag, path in (("--lora", self.lora), ("--draft", self.draft)):
            if path is not None and not Path(path).is_dir():
                raise SpecopsError(f"{flag}: directory not found: {path}")
        if self.lora_mode not in LORA_MODES:
            raise SpecopsError(f"--lora-mode must be one of {', '.join(LORA_MODES)}, not {self.lora_mode!r}")
        if self.dtype not in DTYPES:
            raise SpecopsError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise SpecopsError(f"--device must be cpu, cuda or cuda:N, not {self.device!r}")
        if self.gamma < 0:
            raise SpecopsError(f"--gamma must be >= 0, got {self.gamma}")
        if self.drafter not in DRAFTERS:
            raise SpecopsError(f"--drafter must be one of {', '.join(DRAFTERS)}, not {self.drafter!r}")
        if self.adaptive_gamma and self.draft is None:
            raise SpecopsError("--gamma auto chooses how many tokens the draft proposes: give --draft")
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
        if self.drafter != "eagle3":
            args += ["--drafter", self.drafter]
        if not self.cuda_graphs:
            args.append("--no-cuda-graphs")
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
