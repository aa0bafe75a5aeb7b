"""Real vLLM offline, called from specops: build the runner's request file, run it under the vLLM python, parse.

The runner (``runner.py`` beside this file) needs vLLM's own torch and transformers, so it is a
subprocess of the vLLM environment's python (``$SPECOPS_VLLM_PYTHON``, else the repository's
``.venv-vllm``). Requests use specops' ``SamplingParams`` and results use its ``SpecStats``, so vLLM's numbers
compare one to one with the engine's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specops.backends.config import default_vllm_python
from specops.engine.sampling import SamplingParams
from specops.engine.stats import SpecStats
from specops.errors import SpecopsError

RUNNER = Path(__file__).with_name("runner.py")
LOG_TAIL = 40  # lines of vLLM's log shown when it fails


@dataclass
class VllmRequest:
    """One timed run: ``prompts`` (token ids) with ``params``, at most ``batch_size`` requests in flight."""

    name: str
    prompts: list[list[int]]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    batch_size: int | None = None


@dataclass
class VllmOutput:
    token_ids: list[int]
    text: str
    finish_reason: str


@dataclass
class VllmRun:
    name: str
    wall_s: float
    num_output_tokens: int
    output_tokens_per_s: float
    outputs: list[VllmOutput]
    spec: SpecStats


@dataclass
class VllmResult:
    vllm_version: str
    startup_s: float
    runs: list[VllmRun]

    def run(self, name: str) -> VllmRun:
        return next(r for r in self.runs if r.name == name)


def resolve_python(vllm_python: str | Path | None = None) -> Path:
    """The vLLM environment's python, or an error that says how to make one."""
    py = Path(vllm_python) if vllm_python else default_vllm_python()
    if not py.is_file():
        raise SpecopsError(
            f"vLLM python not found: {py} (run `bash scripts/setup_vllm_env.sh .venv-vllm`, or set SPECOPS_VLLM_PYTHON)"
        )
    return py


def _run_dict(req: VllmRequest) -> dict:
    p = req.params
    return {
        "name": req.name,
        "prompts": [list(map(int, ids)) for ids in req.prompts],
        "batch_size": req.batch_size,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "max_tokens": p.max_tokens,
        "seed": p.seed,
        "ignore_eos": p.ignore_eos,
        "stop": list(p.stop),
        "stop_token_ids": list(p.stop_token_ids),
    }


def _parse(raw: dict) -> VllmResult:
    runs = []
    for r in raw["runs"]:
        spec = SpecStats(**{k: r["spec"][k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                       "accepted_per_pos")})
        outputs = [VllmOutput(o["token_ids"], o["text"], o["finish_reason"]) for o in r["outputs"]]
        runs.append(VllmRun(r["name"], r["wall_s"], r["num_output_tokens"], r["output_tokens_per_s"], outputs, spec))
    return VllmResult(raw["vllm_version"], raw["startup_s"], runs)


def run_vllm(
    model: str | Path,
    requests: list[VllmRequest],
    *,
    draft: str | Path | None = None,
    gamma: int = 0,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    vllm_python: str | Path | None = None,
    timeout_s: float = 1800,
) -> VllmResult:
    """Start one vLLM engine on ``model`` (EAGLE-3 ``draft`` with ``gamma`` tokens when both are given) and
    run ``requests`` in order on it. vLLM's log goes to a temporary file and is quoted only on failure."""
    py = resolve_python(vllm_python)
    body = {
        "model": str(Path(model).resolve()),
        "draft": str(Path(draft).resolve()) if draft is not None and gamma > 0 else None,
        "num_speculative_tokens": gamma,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "dtype": "float32",
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "runs": [_run_dict(r) for r in requests],
    }
    with tempfile.TemporaryDirectory(prefix="specops-vllm-") as tmp:
        req_path, res_path, log_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "vllm.log")
        req_path.write_text(json.dumps(body), encoding="utf-8")
        with log_path.open("w", encoding="utf-8") as log:
            try:
                proc = subprocess.run([str(py), str(RUNNER), "--request", str(req_path), "--result", str(res_path)],
                                      stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise SpecopsError(f"vLLM did not finish within {timeout_s:.0f} s:\n{_tail(log_path)}") from None
        if proc.returncode != 0 or not res_path.is_file():
            raise SpecopsError(f"vLLM failed (exit {proc.returncode}):\n{_tail(log_path)}")
        return _parse(json.loads(res_path.read_text(encoding="utf-8")))


def _tail(path: Path) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL:])
