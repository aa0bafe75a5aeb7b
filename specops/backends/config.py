"""What to serve and with which server: one config for every backend kind."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from specops.engine.config import LORA_MODES, EngineConfig, GammaSchedule
from specops.errors import SpecopsError

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_vllm_python() -> Path:
    """``$SPECOPS_VLLM_PYTHON``, else the repository's ``.venv-vllm`` (made by scripts/setup_vllm_env.sh)."""
    env = os.environ.get("SPECOPS_VLLM_PYTHON")
    return Path(env) if env else REPO_ROOT / ".venv-vllm" / "bin" / "python"


@dataclass
class BackendConfig:
    """``kind``: a name in ``specops.backends.BACKENDS``. ``lora_mode``: "merged" folds the adapter into the weights
    (vLLM: a merged temporary copy, since LoRA with EAGLE-3 crashes its CPU build; embedded: merged at load);
    "unmerged" serves it as an adapter (vLLM ``--enable-lora``; embedded: unmerged forward)."""

    kind: str = "embedded"
    model: Optional[Path] = None
    lora: Optional[Path] = None
    draft: Optional[Path] = None
    gamma: int = 3
    drafter: str = "eagle3"  # engine.config.DRAFTERS (embedded only)
    adaptive_gamma: bool = False  # --gamma auto, up to ``gamma`` (embedded only)
    gamma_schedule: Optional[GammaSchedule] = None  # --gamma-schedule: γ by batch size (embedded only)
    url: Optional[str] = None
    api_key: Optional[str] = None
    vllm_python: Optional[Path] = None
    vllm_args: list[str] = field(default_factory=list)
    lora_mode: str = "merged"
    startup_timeout_s: float = 300.0
    served_model_name: Optional[str] = None
    max_seq_len: int = 1024
    max_batch: int = 16
    device: str = "cpu"  # device and dtype: the embedded engine's
    dtype: str = "float32"
    engine_process: Optional[bool] = None  # embedded: --engine-process / --engine-thread (None: serve's default)
    api_procs: int = 1  # embedded: serve's --api-procs
    gamma_endpoint: bool = False  # embedded: serve's --gamma-endpoint (POST /admin/gamma-schedule)
    host: str = "127.0.0.1"
    port: Optional[int] = None  # None: a free port
    stop_grace_s: float = 20.0

    def validate(self) -> None:
        if self.gamma_schedule is not None and self.kind != "embedded":
            raise SpecopsError("--gamma-schedule runs on the embedded backend only")
        if self.gamma_endpoint and self.kind != "embedded":
            raise SpecopsError("switching γ on a running server is the embedded server's own")
        if self.kind == "external":
            if not self.url:
                raise SpecopsError("the external backend needs a URL")
            return
        if self.model is None or not (Path(self.model) / "config.json").is_file():
            raise SpecopsError(f"model directory not found or without config.json: {self.model}")
        for name in ("lora", "draft"):
            p = getattr(self, name)
            if p is not None and not Path(p).is_dir():
                raise SpecopsError(f"{name} directory not found: {p}")
        if self.lora_mode not in LORA_MODES:
            raise SpecopsError(f"lora_mode must be one of {', '.join(LORA_MODES)}, not {self.lora_mode!r}")
        if self.draft is not None and self.gamma < 1:
            raise SpecopsError("gamma must be at least 1 when a draft is given")

    def engine_config(self) -> EngineConfig:
        """The embedded engine's settings for this config."""
        return EngineConfig(model=Path(self.model), lora=self.lora, lora_mode=self.lora_mode, draft=self.draft,
                            gamma=self.gamma, device=self.device, dtype=self.dtype, max_batch=self.max_batch,
                            max_seq_len=self.max_seq_len, drafter=self.drafter, adaptive_gamma=self.adaptive_gamma,
                            gamma_schedule=self.gamma_schedule)

    @property
    def model_name(self) -> str:
        """The name requests carry: the same for every backend serving the same model."""
        if self.served_model_name:
            return self.served_model_name
        name = Path(self.model).name
        return f"{name}+{Path(self.lora).name}" if self.lora is not None else name
