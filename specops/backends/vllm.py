"""Real vLLM's OpenAI server on the same model, draft and γ, started with the vLLM environment's python.

Same model name, context length and batch limit as the embedded server, float32, and the draft as
``--speculative-config`` (method eagle3). ``vllm_args`` are appended last, so any flag can be added or
overridden there (``--tensor-parallel-size=8``, ``--gpu-memory-utilization 0.9`` on a GPU).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specops.backends.base import Backend, launch
from specops.backends.config import BackendConfig, default_vllm_python
from specops.errors import SpecopsError
from specops.files import read_json

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts for --max-lora-rank


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def vllm_python(cfg: BackendConfig) -> Path:
    py = Path(cfg.vllm_python) if cfg.vllm_python else default_vllm_python()
    if not py.is_file():
        raise SpecopsError(f"vLLM python not found: {py} (run scripts/setup_vllm_env.sh, or set SPECOPS_VLLM_PYTHON)")
    return py


def prepare_model(cfg: BackendConfig) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The directory vLLM loads: the model itself, or a temporary merged copy (removed with the backend)."""
    from specops.models.target import save_merged

    if cfg.lora is None or cfg.lora_mode == "unmerged":
        return Path(cfg.model), None
    tmp = tempfile.TemporaryDirectory(prefix="specops-merged-")
    return save_merged(Path(cfg.model), Path(cfg.lora), Path(tmp.name) / "model"), tmp


def command(cfg: BackendConfig, model_dir: Path, port: int) -> list[str]:
    argv = [str(vllm_python(cfg)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", cfg.host, "--port", str(port), "--dtype", "float32", "--max-model-len", str(cfg.max_seq_len),
            "--max-num-seqs", str(cfg.max_batch)]
    extra = list(cfg.vllm_args)
    if not _has_flag(extra, "--gpu-memory-utilization"):
        argv += ["--gpu-memory-utilization", "0.3"]  # on the CPU build this sizes the KV cache in host memory
    if cfg.lora is not None and cfg.lora_mode == "unmerged":
        argv += ["--enable-lora", "--lora-modules", f"{cfg.model_name}={cfg.lora}"]
        if not _has_flag(extra, "--max-lora-rank"):
            rank = int(read_json(Path(cfg.lora) / "adapter_config.json").get("r", 8))
            argv += ["--max-lora-rank", str(next((r for r in LORA_RANKS if r >= rank), rank))]
        argv += ["--served-model-name", f"{cfg.model_name}-base"]
    else:
        argv += ["--served-model-name", cfg.model_name]
    if cfg.draft is not None:
        spec = {"method": "eagle3", "model": str(cfg.draft), "num_speculative_tokens": cfg.gamma}
        argv += ["--speculative-config", json.dumps(spec)]
    if cfg.api_key:
        argv += ["--api-key", cfg.api_key]
    return argv + extra


def start(cfg: BackendConfig) -> Backend:
    model_dir, tmp = prepare_model(cfg)
    return launch(cfg, lambda port: command(cfg, model_dir, port), tmp)
