"""specops' own server (``python -m specops.serve``) as a subprocess of the current interpreter."""

from __future__ import annotations

import sys

from specops.backends.config import BackendConfig


def command(cfg: BackendConfig, port: int) -> list[str]:
    argv = [sys.executable, "-m", "specops.serve", "--model", str(cfg.model), "--host", cfg.host,
            "--port", str(port), "--served-model-name", cfg.model_name, "--max-seq-len", str(cfg.max_seq_len),
            "--max-batch", str(cfg.max_batch)]
    if cfg.lora is not None:
        argv += ["--lora", str(cfg.lora), "--lora-mode", "merged" if cfg.lora_mode == "merge" else "unmerged"]
    if cfg.draft is not None:
        argv += ["--draft", str(cfg.draft), "--gamma", str(cfg.gamma)]
    if cfg.api_key:
        argv += ["--api-key", cfg.api_key]
    return argv

