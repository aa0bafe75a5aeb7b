"""What a sweep measures: the grid, the fixed parameters every configuration shares, and their checks.

The grid (γ, concurrency, temperature, repeats) may grow between a run and its resume; the fixed parameters may
not, since results measured with different models, prompts or token budgets do not compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specops.backends import KINDS
from specops.engine.config import (DRAFTERS, GammaSchedule, canonical_dtype, check_device, check_dtype,
                                   schedule_gamma)
from specops.bench.store import NAMED_GAMMAS, Point, speculative
from specops.bench.workload import dataset_digest
from specops.errors import SpecopsError

DEFAULT_GAMMAS = [0, 1, 3, 5]
DEFAULT_CONCURRENCY = [1, 4, 16, 32, 64]
DEFAULT_TEMPERATURES = [0.0, 0.7]
DEFAULT_SLO = {"e2e": 2.0}  # production's "answers in under 2 s"


@dataclass
class SweepConfig:
    out: Optional[Path] = None  # the run directory
    backend: str = "embedded"
    model: Optional[Path] = None
    lora: Optional[Path] = None
    draft: Optional[Path] = None
    url: Optional[str] = None
    api_key: Optional[str] = None
    vllm_python: Optional[Path] = None
    vllm_args: list[str] = field(default_factory=list)
    gammas: list[int | str] = field(default_factory=lambda: list(DEFAULT_GAMMAS))  # numbers, "auto", "schedule"
    gamma_schedule: Optional[GammaSchedule] = None  # what γ = "schedule" runs (engine.config.parse_gamma_schedule)
    drafters: list[str] = field(default_factory=lambda: ["eagle3"])  # engine.config.DRAFTERS
    json_schema: Optional[Path] = None  # every request asks for this schema (response_format json_schema)
    concurrencies: list[int] = field(default_factory=lambda: list(DEFAULT_CONCURRENCY))
    temperatures: list[float] = field(default_factory=lambda: list(DEFAULT_TEMPERATURES))
    repeats: int = 1
    rate: Optional[float] = None  # Poisson arrivals per second; None = closed loop
    dataset: Optional[Path] = None
    synthetic: Optional[int] = None
    num_prompts: int = 64
    waves: int = 0  # at least waves × concurrency timed requests per configuration (0: num_prompts alone)
    client_procs: int = 0  # load generator processes (0: one per 8 clients, at most half the cores)
    api_procs: int = 1  # the embedded server's HTTP processes
    one_server: bool = False  # every γ on one server, switched between points (--one-server)
    max_tokens: int = 128
    warmup: int = 2
    seed: int = 0
    top_p: float = 1.0
    ignore_eos: bool = False
    provenance: bool = False  # record each answer's draft provenance (specops servers) for `specops acceptance`
    slo: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SLO))  # seconds
    resume: bool = False
    gpu_hourly_cost: Optional[float] = None
    gpus: int = 1
    max_batch: Optional[int] = None  # server batch limit; None = the largest concurrency
    device: str = "cpu"  # device and dtype: the embedded server's
    dtype: str = "float32"
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 300.0

    def __post_init__(self):
        self.dtype = canonical_dtype(self.dtype)

    def validate(self) -> None:
        """Refuse a sweep that cannot run, before a server is started or a request sent."""
        if self.backend not in KINDS:
            raise SpecopsError(f"--backend must be one of {', '.join(KINDS)}, not {self.backend!r}")
        if not self.gammas or not self.concurrencies or not self.temperatures:
            raise SpecopsError("the grid is empty: give at least one --gamma, --concurrency and --temperature value")
        fixed = [g for g in self.gammas if g not in NAMED_GAMMAS]
        if min(fixed, default=0) < 0 or min(self.concurrencies) < 1 or min(self.temperatures) < 0:
            raise SpecopsError("γ must be ≥ 0, concurrency ≥ 1 and temperature ≥ 0")
        bad = [d for d in self.drafters if d not in DRAFTERS]
        if bad or not self.drafters:
            raise SpecopsError(f"--drafter takes a comma-separated list of {', '.join(DRAFTERS)}; got {bad or 'none'}")
        if set(self.drafters) != {"eagle3"}:
            if self.backend != "embedded":
                raise SpecopsError("schema-aware drafters run on the embedded backend only; use --drafter eagle3")
            if self.json_schema is None:
                raise SpecopsError("schema-aware drafters draft what a schema forces: give --json-schema FILE")
            if "schema+eagle3" in self.drafters and not any(map(speculative, self.gammas)):
                raise SpecopsError("--drafter schema+eagle3 needs a γ > 0 in --gamma")
        if self.json_schema is not None and not Path(self.json_schema).is_file():
            raise SpecopsError(f"--json-schema: file not found: {self.json_schema}")
        if "schedule" in self.gammas and self.gamma_schedule is None:
            raise SpecopsError("--gamma schedule runs the γ table of --gamma-schedule: give it, e.g. "
                               "--gamma-schedule '[[1,4,5],[5,64,3]]'")
        if self.one_server:
            if self.backend != "embedded" or self.drafters != ["eagle3"]:
                raise SpecopsError("--one-server switches γ on a running embedded server: use --backend embedded "
                                   "and --drafter eagle3")
            if not all(g == "schedule" or (isinstance(g, int) and g > 0) for g in self.gammas):
                raise SpecopsError("--one-server measures γ values above 0 and schedule on one server with a draft; "
                                   "γ = 0 and auto need servers of their own (run them without --one-server)")
        if self.gamma_schedule is not None:
            if "schedule" not in self.gammas:
                raise SpecopsError("--gamma-schedule is measured as the γ value schedule: add schedule to --gamma")
            if schedule_gamma(self.gamma_schedule) == 0:
                raise SpecopsError("--gamma-schedule never drafts (every γ is 0): measure that as --gamma 0")
        check_device(self.device)
        check_dtype(self.dtype)
        if self.api_procs != 1 and self.backend != "embedded":
            raise SpecopsError("--api-procs is the embedded server's: vLLM's is --vllm-arg=--api-server-count=N")
        if (self.device, self.dtype) != ("cpu", "float32") and self.backend != "embedded":
            raise SpecopsError("--device and --dtype are the embedded server's: give vLLM's own with --vllm-arg")
        if self.backend == "external":
            if not self.url:
                raise SpecopsError("--backend external needs --url")
            if len(self.gammas) != 1 or self.gammas[0] in NAMED_GAMMAS:
                raise SpecopsError("an external server runs one fixed γ: give exactly one --gamma value (its γ)")
        else:
            if self.model is None or not (Path(self.model) / "config.json").is_file():
                raise SpecopsError(f"--model: not a model directory with config.json: {self.model}")
            named = [g for g in self.gammas if g in NAMED_GAMMAS]
            if named and self.backend != "embedded":
                raise SpecopsError(f"--gamma {named[0]} is the embedded engine's own: use numbers with this backend")
            if any(map(speculative, self.gammas)) and self.draft is None:
                raise SpecopsError("γ > 0 needs --draft (an EAGLE-3 draft directory)")
            for name in ("lora", "draft"):
                p = getattr(self, name)
                if p is not None and not Path(p).is_dir():
                    raise SpecopsError(f"--{name}: directory not found: {p}")
        if (self.dataset is None) == (self.synthetic is None):
            raise SpecopsError("give exactly one of --dataset FILE.jsonl or --synthetic N")
        for name, value, low in (("--num-prompts", self.num_prompts, 1), ("--max-tokens", self.max_tokens, 1),
                                 ("--repeats", self.repeats, 1), ("--warmup", self.warmup, 0), ("--gpus", self.gpus, 1),
                                 ("--waves", self.waves, 0), ("--client-procs", self.client_procs, 0),
                                 ("--api-procs", self.api_procs, 1)):
            if value < low:
                raise SpecopsError(f"{name} must be at least {low}, got {value}")
        if self.gpu_hourly_cost is not None and self.gpu_hourly_cost <= 0:
            raise SpecopsError("--gpu-hourly-cost must be positive")

    def servers(self) -> list[tuple[str, int | str]]:
        """(drafter, γ) of each server the grid needs, in run order: eagle3 at every γ (γ = 0: plain decoding),
        schema+eagle3 at every γ > 0, schema (no draft model) once, at γ = 0. With ``one_server``, one eagle3 server
        whose γ is the most any configuration drafts."""
        if self.one_server:
            return [("eagle3", max(g if isinstance(g, int) else schedule_gamma(self.gamma_schedule)
                                   for g in self.gammas))]
        out = []
        for d in self.drafters:
            gammas = {"eagle3": self.gammas, "schema+eagle3": [g for g in self.gammas if speculative(g)],
                      "schema": [0]}[d]
            out += [(d, g) for g in gammas]
        return out

    def points(self) -> list[Point]:
        """The grid in run order: (drafter, γ) outermost (one server each), then concurrency, temperature, repeat.
        With ``one_server``, γ innermost: each repeat of a concurrency and temperature measures every γ in turn, so
        that what drifts over the run falls on all of them alike."""
        if self.one_server:
            return [Point(g, c, float(t), r, "eagle3") for c in self.concurrencies for t in self.temperatures
                    for r in range(self.repeats) for g in self.gammas]
        return [Point(g, c, float(t), r, d) for d, g in self.servers() for c in self.concurrencies
                for t in self.temperatures for r in range(self.repeats)]

    def gamma_table(self, gamma: int | str) -> GammaSchedule:
        """What a one-server sweep has the engine draft by for ``gamma``: the schedule, or γ at every batch size."""
        return self.gamma_schedule if gamma == "schedule" else ((1, self.server_max_batch, gamma),)

    def fixed(self) -> dict[str, Any]:
        """Parameters every configuration of the run shares; a resume must match them exactly."""
        where = str(Path(self.model).resolve()) if self.model is not None else self.url
        return {
            "backend": self.backend,
            "model": where,
            "lora": str(Path(self.lora).resolve()) if self.lora else None,
            "draft": str(Path(self.draft).resolve()) if self.draft else None,
            "vllm_args": list(self.vllm_args),
            "prompts": ({"dataset": str(Path(self.dataset).resolve()), "sha256": dataset_digest(Path(self.dataset))}
                        if self.dataset else {"synthetic": self.synthetic}),
            "num_prompts": self.num_prompts,
            "max_tokens": self.max_tokens,
            "warmup": self.warmup,
            "seed": self.seed,
            "top_p": self.top_p,
            "ignore_eos": self.ignore_eos,
            "rate": self.rate,
            "max_batch": self.server_max_batch,
            **({"json_schema": _schema_digest(Path(self.json_schema))} if self.json_schema else {}),
            **({"provenance": True} if self.provenance else {}),
            # only when set, so that runs from before these options still resume
            **({"gamma_schedule": [list(r) for r in self.gamma_schedule]} if self.gamma_schedule is not None else {}),
            **({"device": self.device} if self.device != "cpu" else {}),
            **({"dtype": self.dtype} if self.dtype != "float32" else {}),
            **({"waves": self.waves} if self.waves else {}),
            **({"client_procs": self.client_procs} if self.client_procs else {}),
            **({"api_procs": self.api_procs} if self.api_procs != 1 else {}),
            **({"one_server": True} if self.one_server else {}),
        }

    def timed_requests(self, concurrency: int) -> int:
        """Timed requests at ``concurrency``: ``num_prompts``, raised to ``waves`` × concurrency, so that at high
        concurrency the run is more than its ramp-up and drain (with as many requests as slots, every request
        starts together and the throughput is that of the slowest one)."""
        return max(self.num_prompts, self.waves * concurrency)

    @property
    def response_format(self) -> Optional[dict[str, Any]]:
        from specops.inputs import schema_format

        return schema_format(Path(self.json_schema)) if self.json_schema is not None else None

    @property
    def server_max_batch(self) -> int:
        return self.max_batch or max(self.concurrencies)


def _schema_digest(path: Path) -> dict[str, str]:
    import hashlib

    return {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
