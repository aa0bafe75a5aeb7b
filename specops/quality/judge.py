"""Pairwise judging of baseline vs candidate answers, MT-bench style, with position swapping.

The judge sees the shopper's query, the task's contract and two answers in slots A and B, and ends with ``[[A]]``,
``[[B]]`` or ``[[C]]`` (tie). ``order="both"`` asks twice with the slots swapped and counts a disagreement as a tie
(FastChat's rule); ``order="random"`` asks once, the slot order drawn per pair from the seed. Identical answers are
ties without asking. A verdict that cannot be parsed, an error or a timeout is retried with exponential backoff;
after the last attempt the judgment is recorded as failed and the run goes on (a pair with one failed game is scored
by its other game; a pair with none is left unjudged and counted). Every judgment is cached (SQLite) by
(judge model, prompt, first answer, second answer), so a rerun asks nothing it has asked before.

``ReferenceJudge`` is deterministic and offline: it prefers the answer with more fields equal to the gold
parameters (ties when equal), whatever the slot order.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specops.quality.stats import bootstrap_mean, sign_test
from specops.task.schema import SCHEMA

SYSTEM = ("Please act as an impartial judge and evaluate the two answers provided by AI assistants to the shopping "
          "query below. Each answer must be one JSON object of search parameters following the contract given. "
          "Judge which answer captures the shopper's constraints more correctly and completely (intent, keywords, "
          "category, brands, prices and currency, colours, sizes, rating, stock, shipping, condition, sort) and "
          "follows the contract. Do not let the order of the answers, their length or the names of the assistants "
          "influence you. Be as objective as possible. After a short explanation, output your final verdict by "
          'strictly following this format: "[[A]]" if assistant A is better, "[[B]]" if assistant B is better, and '
          '"[[C]]" for a tie.')
VERDICT = re.compile(r"\[\[\s*([ABC])\s*\]\]", re.IGNORECASE)
ATTEMPTS = 4
BACKOFF_S = 0.5  # then 1, 2 s


def prompt(query: str, first: str, second: str) -> list[dict[str, str]]:
    user = (f"[Contract (JSON schema)]\n{json.dumps(SCHEMA, ensure_ascii=False)}\n\n[Shopping query]\n{query}\n\n"
            f"[The Start of Assistant A's Answer]\n{first}\n[The End of Assistant A's Answer]\n\n"
            f"[The Start of Assistant B's Answer]\n{second}\n[The End of Assistant B's Answer]")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> Optional[str]:
    """"A", "B" or "C" from the judge's reply: its last verdict tag (the final verdict comes last); None if none."""
    tags = VERDICT.findall(text or "")
    return tags[-1].upper() if tags else None


@dataclass(frozen=True)
class Judgment:
    verdict: Optional[str]  # A, B, C, or None when it failed
    attempts: int = 0
    error: Optional[str] = None
    cached: bool = False


class Cache:
    """Judgments by key, in SQLite (WAL): written as each one arrives, so an interrupted run keeps them."""

    def __init__(self, path: Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS judgments (key TEXT PRIMARY KEY, verdict TEXT, attempts INTEGER,"
                          " error TEXT, raw TEXT)")

    @staticmethod
    def key(model: str, messages: list[dict]) -> str:
        return hashlib.sha256(json.dumps([model, messages], ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> Optional[Judgment]:
        row = self.conn.execute("SELECT verdict, attempts, error FROM judgments WHERE key = ?", (key,)).fetchone()
        return Judgment(row[0], row[1], row[2], cached=True) if row else None

    def put(self, key: str, j: Judgment, raw: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO judgments VALUES (?, ?, ?, ?, ?)", (key, j.verdict, j.attempts, j.error, raw))

    def __len__(self) -> int:
        return self.conn.execute("SELECT count(*) FROM judgments").fetchone()[0]

    def close(self) -> None:
        self.conn.close()


class HttpJudge:
    """Any OpenAI-compatible chat endpoint, asked with bounded concurrency, a timeout and retries."""

    def __init__(self, url: str, model: str, cache: Cache, api_key: Optional[str] = None, concurrency: int = 8,
                 timeout_s: float = 60.0, backoff_s: float = BACKOFF_S):
        base = url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.model, self.cache, self.api_key = model, cache, api_key
        self.concurrency, self.timeout_s, self.backoff_s = concurrency, timeout_s, backoff_s
        self.requests = 0  # HTTP requests made (a cached rerun makes none)

    async def _ask(self, client, messages: list[dict]) -> Judgment:
        key = Cache.key(self.model, messages)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        error, raw = None, ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self.requests += 1
                r = await client.post(self.url, json={"model": self.model, "messages": messages, "temperature": 0,
                                                      "max_tokens": 512})
                r.raise_for_status()
                raw = r.json()["choices"][0]["message"]["content"] or ""
                verdict = parse_verdict(raw)
                if verdict is not None:
                    j = Judgment(verdict, attempt)
                    self.cache.put(key, j, raw)
                    return j
                error = f"no verdict tag in the reply: {raw[:80]!r}"
            except Exception as e:  # noqa: BLE001 - timeouts, HTTP errors, malformed JSON: all retried
                error = f"{type(e).__name__}: {str(e)[:120]}"
            if attempt < ATTEMPTS:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        j = Judgment(None, ATTEMPTS, error)
        self.cache.put(key, j, raw)
        return j

    def judge_all(self, requests: list[list[dict]], progress: Optional[Callable[[int], None]] = None) -> list[Judgment]:
        import httpx

        async def run():
            sem = asyncio.Semaphore(self.concurrency)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            done = 0
            async with httpx.AsyncClient(headers=headers, timeout=self.timeout_s) as client:
                async def one(m):
                    nonlocal done
                    async with sem:
                        j = await self._ask(client, m)
                    done += 1
                    if progress:
                        progress(done)
                    return j

                return await asyncio.gather(*(one(m) for m in requests))

        return asyncio.run(run())


class ReferenceJudge:
    """Prefers the answer with more fields equal to the gold parameters; ties when equal (no slot bias)."""

    def __init__(self, gold: dict[str, dict]):
        self.gold = gold

    def verdict(self, pid: str, first: str, second: str) -> str:
        from specops.task.scoring import score_one

        a = sum(score_one(first, self.gold[pid]).field_correct.values())
        b = sum(score_one(second, self.gold[pid]).field_correct.values())
        return "A" if a > b else "B" if b > a else "C"


def judge(pairs: list[tuple[str, str, str, str]], judge_impl, order: str = "both", seed: int = 0,
          progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """``pairs``: (id, query, baseline answer, candidate answer). Returns win / tie / loss for the candidate with
    bootstrap CIs, the sign test, the position-bias rate and the failures."""
    rng = random.Random(seed)
    plan = []  # (pair index, candidate is in slot A)
    for k, (_, _, base, cand) in enumerate(pairs):
        if base == cand:
            continue
        slots = (False, True) if order == "both" else (rng.random() < 0.5,)
        plan += [(k, swapped) for swapped in slots]
    verdicts: dict[tuple[int, bool], Judgment] = {}
    if isinstance(judge_impl, ReferenceJudge):
        for k, swapped in plan:
            pid, _, base, cand = pairs[k]
            first, second = (cand, base) if swapped else (base, cand)
            verdicts[(k, swapped)] = Judgment(judge_impl.verdict(pid, first, second))
    else:
        messages = []
        for k, swapped in plan:
            _, query, base, cand = pairs[k]
            messages.append(prompt(query, *((cand, base) if swapped else (base, cand))))
        got = judge_impl.judge_all(messages, None if progress is None else (lambda d: progress(d, len(plan))))
        verdicts = dict(zip(plan, got))
    outcome, failed, slot_followed, both_parsed = [], 0, 0, 0
    for k in range(len(pairs)):
        if pairs[k][2] == pairs[k][3]:
            outcome.append(0)
            continue
        per_order = []
        for swapped in ((False, True) if order == "both" else [s for kk, s in plan if kk == k]):
            j = verdicts[(k, swapped)]
            if j.verdict is None:
                failed += 1
                per_order.append(None)
                continue
            # +1: the candidate won this game, −1: the baseline did, 0: tie
            cand_slot = "A" if swapped else "B"
            per_order.append(0 if j.verdict == "C" else (1 if j.verdict == cand_slot else -1))
        if order == "both" and None not in per_order:
            both_parsed += 1
            first, second = verdicts[(k, False)].verdict, verdicts[(k, True)].verdict
            if first == second and first in ("A", "B"):
                slot_followed += 1  # the same slot won with the answers swapped: the verdict followed the position
        known = [v for v in per_order if v is not None]
        if not known:
            outcome.append(None)
        elif len(known) == 2 and known[0] != known[1]:
            outcome.append(0)  # the orders disagree: a tie
        else:
            outcome.append(known[0])
    scored = [o for o in outcome if o is not None]
    wins, losses = sum(o == 1 for o in scored), sum(o == -1 for o in scored)
    return {
        "order": order, "pairs": len(pairs), "judged": len(scored), "identical_pairs": sum(p[2] == p[3] for p in pairs),
        "games": len(plan), "failed_games": failed, "unjudged_pairs": len(outcome) - len(scored),
        "win": bootstrap_mean([float(o == 1) for o in scored], seed),
        "tie": bootstrap_mean([float(o == 0) for o in scored], seed),
        "loss": bootstrap_mean([float(o == -1) for o in scored], seed),
        "sign_test_p": sign_test(wins, losses),
        "position_bias_rate": slot_followed / both_parsed if both_parsed else None,
    }
