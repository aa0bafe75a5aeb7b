"""The run store: one SQLite file per run directory, safe against a sweep killed at any instant.

Each finished configuration is written in one transaction with all its request records, so after a crash a
configuration is either wholly present or absent; WAL with ``synchronous=FULL`` makes a commit survive the
process dying right after it. A configuration's key is a hash of its grid parameters; the run's fixed
parameters (model, prompts, token budget, ...) are stored once and a resume with different ones is refused.
Later stages of a study (quality, acceptance, ...) keep their finished results in the same file, one row per
(stage, key), written atomically: a resumed study redoes only what it had not finished.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from specops.bench.record import RequestRecord
from specops.errors import SpecopsError

DB_NAME = "runs.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS configs (
    key TEXT PRIMARY KEY, gamma INTEGER NOT NULL, concurrency INTEGER NOT NULL, temperature REAL NOT NULL,
    repeat INTEGER NOT NULL, duration_s REAL NOT NULL, spec TEXT, finished_at REAL NOT NULL,
    drafter TEXT NOT NULL DEFAULT 'eagle3');
CREATE TABLE IF NOT EXISTS requests (
    config_key TEXT NOT NULL REFERENCES configs(key), idx INTEGER NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (config_key, idx));
CREATE TABLE IF NOT EXISTS results (
    stage TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, finished_at REAL NOT NULL,
    PRIMARY KEY (stage, key));
"""


NAMED_GAMMAS = ("auto", "schedule")  # γ the engine sets per round: --gamma auto, --gamma-schedule


def speculative(gamma: int | str) -> bool:
    """Whether a configuration drafts: γ > 0, or γ set by the engine per round (``auto``, ``schedule``)."""
    return gamma in NAMED_GAMMAS or gamma > 0


def gamma_order(gamma: int | str) -> int:
    """Sort key of γ values: the numbers, then ``auto``, then ``schedule``."""
    return (1 << 30) + NAMED_GAMMAS.index(gamma) if gamma in NAMED_GAMMAS else gamma


@dataclass(frozen=True)
class Point:
    """One configuration of the grid; ``repeat`` numbers the repeated measurements of the same settings;
    ``drafter`` says what proposed the drafts (``engine.config.DRAFTERS``)."""

    gamma: int | str  # a number of draft tokens, "auto" (chosen every step) or "schedule" (by batch size)
    concurrency: int
    temperature: float
    repeat: int = 0
    drafter: str = "eagle3"

    @property
    def key(self) -> str:
        d = {"gamma": self.gamma, "concurrency": self.concurrency, "temperature": float(self.temperature),
             "repeat": self.repeat}
        if self.drafter != "eagle3":  # runs from before the drafter axis keep their keys
            d["drafter"] = self.drafter
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class StoredConfig:
    point: Point
    duration_s: float
    spec: Optional[dict[str, Any]]  # speculative counter deltas over the timed requests; None when unread
    records: list[RequestRecord]


class RunStore:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(_SCHEMA)
        columns = {row[1] for row in self.conn.execute("PRAGMA table_info(configs)")}
        if "drafter" not in columns:  # a run from before the drafter axis: all of it drafted with EAGLE-3
            self.conn.execute("ALTER TABLE configs ADD COLUMN drafter TEXT NOT NULL DEFAULT 'eagle3'")

    @classmethod
    def open(cls, run_dir: Path, fixed: dict[str, Any], resume: bool) -> "RunStore":
        """The store of ``run_dir``: new, or (with ``resume``) an existing run whose fixed parameters match.
        A run without any finished configuration counts as new."""
        store = cls(run_dir)
        stored = store.fixed()
        if stored is None or not store.done_keys():  # nothing measured yet: nothing to protect
            store._put_meta({"fixed": fixed, "schema_version": SCHEMA_VERSION, "created_at": time.time()})
            return store
        if not resume:
            store.close()
            raise SpecopsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
        diff = [f"{k}: {stored.get(k)!r} in the run, {fixed.get(k)!r} now" for k in sorted(set(stored) | set(fixed))
                if stored.get(k) != fixed.get(k)]
        if diff:
            store.close()
            raise SpecopsError(f"cannot resume {run_dir} with different fixed parameters ({'; '.join(diff)})")
        return store

    def _put_meta(self, items: dict[str, Any]) -> None:
        with self._transaction():
            self.conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                  [(k, json.dumps(v, sort_keys=True)) for k, v in items.items()])

    def meta(self, key: str) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def fixed(self) -> Optional[dict[str, Any]]:
        return self.meta("fixed")

    @contextmanager
    def _transaction(self):
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def done_keys(self) -> set[str]:
        return {k for (k,) in self.conn.execute("SELECT key FROM configs")}

    def commit(self, cfg: StoredConfig) -> None:
        """Write one finished configuration and all its records atomically."""
        p = cfg.point
        with self._transaction():
            self.conn.execute("INSERT INTO configs (key, gamma, concurrency, temperature, repeat, duration_s, spec, "
                              "finished_at, drafter) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (p.key, p.gamma, p.concurrency, float(p.temperature), p.repeat, cfg.duration_s,
                               json.dumps(cfg.spec) if cfg.spec is not None else None, time.time(), p.drafter))
            self.conn.executemany("INSERT INTO requests VALUES (?, ?, ?)",
                                  [(p.key, r.idx, json.dumps(asdict(r), ensure_ascii=False)) for r in cfg.records])

    def configs(self) -> list[StoredConfig]:
        """Every stored configuration with its records, in grid order."""
        rows = self.conn.execute(
            "SELECT key, gamma, concurrency, temperature, repeat, duration_s, spec, drafter FROM configs "
            "ORDER BY temperature, concurrency, drafter != 'eagle3', drafter, gamma, repeat").fetchall()
        out = []
        for key, gamma, conc, temp, rep, dur, spec, drafter in rows:
            recs = [_record(json.loads(t)) for (t,) in
                    self.conn.execute("SELECT record FROM requests WHERE config_key = ? ORDER BY idx", (key,))]
            out.append(StoredConfig(Point(gamma, conc, temp, rep, drafter), dur, json.loads(spec) if spec else None, recs))
        return out

    def put_result(self, stage: str, key: str, value: Any) -> None:
        with self._transaction():
            self.conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)",
                              (stage, key, json.dumps(value, sort_keys=True, ensure_ascii=False), time.time()))

    def result(self, stage: str, key: str) -> Any:
        row = self.conn.execute("SELECT value FROM results WHERE stage = ? AND key = ?", (stage, key)).fetchone()
        return json.loads(row[0]) if row else None

    def results(self, stage: str) -> dict[str, Any]:
        """Every finished result of ``stage`` by key, in key order."""
        return {k: json.loads(v) for k, v in
                self.conn.execute("SELECT key, value FROM results WHERE stage = ? ORDER BY key", (stage,))}

    def put_meta(self, key: str, value: Any) -> None:
        self._put_meta({key: value})

    def close(self) -> None:
        self.conn.close()


def _record(d: dict[str, Any]) -> RequestRecord:
    return RequestRecord(**{**d, "itl_s": tuple(d["itl_s"])})
