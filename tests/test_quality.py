"""`specops quality`: statistics against known values, verdict parsing, position swapping and the judge cache
through real HTTP judges, the catalog search, and the whole command on fixture answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from serve_helpers import FIXTURE, start_server, stop_server
from typer.testing import CliRunner

from specops.cli import app
from specops.quality import judge, stats
from specops.quality.outputs import Answer
from specops.task import synth
from specops.task.prompt import format_answer


def test_statistics_against_known_values():
    assert stats.sign_test(9, 1) == pytest.approx(0.021484375)  # 2 · (1 + 10) / 2¹⁰
    assert stats.sign_test(0, 0) is None
    ci = stats.bootstrap_mean([1.0] * 30)
    assert ci == {"value": 1.0, "ci95_low": 1.0, "ci95_high": 1.0}
    half = stats.bootstrap_mean([0.0, 1.0] * 200, seed=3)
    assert half["value"] == 0.5 and 0.44 < half["ci95_low"] < 0.5 < half["ci95_high"] < 0.56  # ± 1.96·√(.25/400)
    d = stats.paired_difference([0, 0, 1, 1], [1, 1, 1, 1])
    assert d["value"] == 0.5 and d["ci95_low"] >= 0
    assert stats.categorical_test(["a"] * 20 + ["b"] * 20, ["a"] * 20 + ["b"] * 20)["p_value"] == pytest.approx(1.0)
    assert stats.categorical_test(["a"] * 40, ["b"] * 40)["p_value"] < 1e-10
    assert stats.numeric_test([1, 2, 3, 4] * 10, [101, 102, 103] * 10)["p_value"] < 1e-6


@pytest.mark.parametrize("reply,verdict", [
    ("Assistant B is more complete. [[B]]", "B"), ("[[ a ]]", "A"), ("Verdict: [[C]].", "C"),
    ("At first [[A]] seemed right, but on reflection: [[B]]", "B"), ("A is better", None), ("", None),
    ("[A] [[D]]", None), ("**Final verdict:** [[c]]", "C"),
])
def test_verdicts_are_parsed_from_messy_replies(reply, verdict):
    assert judge.parse_verdict(reply) == verdict


class FakeJudgeServer:
    """A real OpenAI-compatible chat server on loopback whose judge always answers ``reply(n)`` (n: request
    number); it records how many requests it served."""

    def __init__(self, reply):
        self.requests = 0
        api = FastAPI()

        @api.post("/v1/chat/completions")
        async def chat(body: dict):
            self.requests += 1
            text = reply(self.requests)
            if text is None:
                await asyncio.sleep(1.5)  # longer than the client's timeout
                text = "[[A]]"
            return {"choices": [{"message": {"role": "assistant", "content": text}}]}

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _pairs(n: int = 6):
    return [(str(i), f"query {i}", f'{{"answer": {i}}}', f'{{"answer": {i + 100}}}') for i in range(n)]


def test_a_judge_that_always_says_a_is_all_position_bias_and_ties(tmp_path):
    with FakeJudgeServer(lambda n: "Clearly the first. [[A]]") as srv:
        impl = judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "c.sqlite"))
        result = judge.judge(_pairs(), impl, order="both")
        assert srv.requests == 12  # every pair in both orders
    assert result["position_bias_rate"] == 1.0
    assert result["tie"]["value"] == 1.0 and result["win"]["value"] == 0.0 and result["loss"]["value"] == 0.0
    assert result["sign_test_p"] is None and result["failed_games"] == 0


def test_random_order_asks_once_per_pair_from_the_seed(tmp_path):
    with FakeJudgeServer(lambda n: "[[B]]") as srv:
        one = judge.judge(_pairs(8), judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "a.sqlite")), "random", 5)
        two = judge.judge(_pairs(8), judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "b.sqlite")), "random", 5)
        assert srv.requests == 16
    assert one == two and one["games"] == 8 and one["position_bias_rate"] is None
    assert one["win"]["value"] + one["loss"]["value"] == 1.0  # "B" wins the slot, whichever answer sits there


def test_garbage_and_timeouts_are_retried_then_recorded_and_a_rerun_asks_nothing(tmp_path):
    replies = {1: "no tag here", 2: None, 3: "[[B]]"}  # garbage, then a timeout, then an answer
    with FakeJudgeServer(lambda n: replies.get(n, "still no verdict")) as srv:
        impl = judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "c.sqlite"), concurrency=1, timeout_s=0.5,
                               backoff_s=0.01)
        result = judge.judge(_pairs(2), impl, order="both")
        first = srv.requests
        assert impl.requests == first == 3 + 3 * judge.ATTEMPTS  # 1st game: 3 tries; the other 3 games: all 4
        assert result["failed_games"] == 3 and result["judged"] == 1 and result["unjudged_pairs"] == 1
        rerun = judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "c.sqlite"))
        assert judge.judge(_pairs(2), rerun, order="both") == result and srv.requests == first and rerun.requests == 0


def test_the_reference_judge_follows_the_gold_not_the_slot():
    ex = synth.generate(4, seed=2)
    gold = {e.id: e.gold for e in ex}
    worse = {**ex[0].gold, "intent": "other" if ex[0].gold["intent"] != "other" else "search"}
    pairs = [(e.id, e.query, format_answer(e.gold), format_answer(worse) if e is ex[0] else format_answer(e.gold))
             for e in ex]
    result = judge.judge(pairs, judge.ReferenceJudge(gold), "both")
    assert result["judged"] == 4 and result["identical_pairs"] == 3 and result["loss"]["value"] == 0.25
    assert result["position_bias_rate"] == 0.0


def test_catalog_builds_byte_identical_and_searches_by_every_constraint(tmp_path):
    from specops.fixtures.catalog import DEFAULT_PATH, build
    from specops.task.catalog import open_catalog, search

    a, b = build(tmp_path / "a.sqlite"), build(tmp_path / "b.sqlite")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(a) == digest(b) == digest(DEFAULT_PATH)  # the shipped file is the recipe's
    conn = open_catalog(a)
    base = {**synth.empty_params("search"), "keywords": ["wireless earbuds"], "category": "audio"}
    hits = search(conn, base, 50)
    assert hits and all("wireless earbuds" in h["title"] for h in hits)
    cheap = search(conn, {**base, "price_max": 100, "currency": "USD", "sort": "price_asc"}, 50)
    assert cheap and all(h["price_usd"] <= 100 for h in cheap)
    assert [h["price_usd"] for h in cheap] == sorted(h["price_usd"] for h in cheap)
    twd = search(conn, {**base, "price_max": 3150, "currency": "TWD", "sort": "price_asc"}, 50)
    assert [h["id"] for h in twd] == [h["id"] for h in cheap]  # 3150 TWD = 100 USD
    sony = search(conn, {**base, "keywords": [], "brands": ["sony"], "in_stock": True}, 50)
    assert sony and all(h["brand"] == "Sony" and h["stock"] > 0 for h in sony)
    assert search(conn, {**base, "keywords": ['"; DROP TABLE products; --']}, 5) == []
    assert search(conn, {"not": "valid"}, 5) == [] and search(conn, None, 5) == []
    assert search(conn, base, 10) == hits[:10]  # deterministic, ties by id


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Held-out queries answered by the fixture target plainly, speculatively, and by the base model (worse)."""
    from specops.engine.engine import Engine
    from specops.engine.sampling import SamplingParams
    from specops.fixtures.recipe import heldout_examples
    from specops.inputs import query_prompt_ids

    d = tmp_path_factory.mktemp("answers")
    examples = heldout_examples(10)
    synth.write_examples(examples, d / "gold.jsonl")
    params = SamplingParams(temperature=0.0, max_tokens=192)
    for name, model, draft in (("plain", "target-merged", None), ("spec", "target-merged", "draft-domain"),
                               ("base", "base", None)):
        eng = Engine.load(FIXTURE / model, draft=FIXTURE / draft if draft else None, gamma=3 if draft else 0)
        outs = eng.generate([query_prompt_ids(eng.tokenizer, e.query) for e in examples], params)
        (d / f"{name}.jsonl").write_text("".join(json.dumps({"id": e.id, "text": o.text, "token_ids": o.token_ids})
                                                 + "\n" for e, o in zip(examples, outs)), encoding="utf-8")
    return d


def _quality(d: Path, candidate: str, out: Path, *extra) -> dict:
    r = CliRunner().invoke(app, ["quality", "--baseline", str(d / "plain.jsonl"), "--candidate",
                                 str(d / f"{candidate}.jsonl"), "--dataset", str(d / "gold.jsonl"), "--out", str(out),
                                 *extra])
    assert r.exit_code == 0, r.output
    return json.loads((out / "quality.json").read_text(encoding="utf-8"))


def test_speculation_loses_nothing_and_the_base_model_loses(answers, tmp_path):
    same = _quality(answers, "spec", tmp_path / "same")
    assert same["lossless"]["identical_share"] == 1.0 and same["lossless"]["compared_by"] == "token ids"
    assert same["accuracy"]["difference"] == {"value": 0.0, "ci95_low": 0.0, "ci95_high": 0.0}
    assert same["retrieval"]["overlap_at_k"] == 1.0 and same["judge"]["tie"]["value"] == 1.0
    worse = _quality(answers, "base", tmp_path / "worse")
    assert worse["lossless"]["identical_share"] < 1 and worse["lossless"]["differences"]
    assert worse["accuracy"]["difference"]["ci95_high"] < 0  # the loss, with a CI that excludes 0
    assert worse["judge"]["loss"]["value"] > worse["judge"]["win"]["value"]


def test_a_real_model_server_as_a_garbage_judge_fails_gracefully(answers, tmp_path):
    """`specops serve` answers with search parameters, never a verdict tag: every game is retried, then recorded
    as failed, and the command still writes its report."""
    from serve_helpers import free_port

    two = tmp_path / "two"  # two pairs are enough: 4 games × 4 attempts through the model
    two.mkdir()
    for name in ("plain", "base", "gold"):
        lines = (answers / f"{name}.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:2]
        (two / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    port = free_port()
    proc = start_server(["--model", str(FIXTURE / "target-merged"), "--max-seq-len", "2048"], port)
    try:
        result = _quality(two, "base", tmp_path / "q", "--judge-url", f"http://127.0.0.1:{port}/v1",
                          "--judge-model", str(FIXTURE / "target-merged"), "--judge-concurrency", "4")
    finally:
        stop_server(proc)
    j = result["judge"]
    assert j["failed_games"] == j["games"] > 0 and j["judged"] == 0 and j["win"]["value"] is None
    assert result["accuracy"]["difference"]["ci95_high"] < 0  # the other parts are reported all the same


def test_answers_from_a_run_directory(tmp_path):
    from specops.bench.record import RequestRecord
    from specops.bench.store import Point, RunStore, StoredConfig
    from specops.errors import SpecopsError
    from specops.quality.outputs import load

    with pytest.raises(SpecopsError, match="not a run directory"):
        load(str(tmp_path))
    store = RunStore.open(tmp_path, {"fixed": 1}, resume=False)
    for gamma, conc, text in ((0, 1, "plain"), (3, 4, "spec at 4"), (3, 1, "spec at 1")):
        recs = [RequestRecord(idx=i, prompt_id=f"p{i}", start_s=0, e2e_s=1, ok=True, text=f"{text} {i}") for i in range(3)]
        store.commit(StoredConfig(Point(gamma, conc, 0.0), 1.0, None, recs))
    store.close()
    got = load(f"{tmp_path}:gamma=3,temperature=0")
    assert got == {f"p{i}": Answer(f"spec at 1 {i}") for i in range(3)}  # the lowest concurrency
    with pytest.raises(SpecopsError, match="several configurations"):
        load(str(tmp_path))
    with pytest.raises(SpecopsError, match="no configuration matches"):
        load(f"{tmp_path}:gamma=5")


JUDGE_CHILD = """
import sys
from specops.quality import judge
pairs = [(str(i), f"query {i}", f'{{"answer": {i}}}', f'{{"answer": {i + 100}}}') for i in range(int(sys.argv[3]))]
judge.judge(pairs, judge.HttpJudge(sys.argv[1], "m", judge.Cache(sys.argv[2]), concurrency=1), order="both")
"""


def test_a_sigkilled_judge_run_resumes_with_every_game_judged_once(tmp_path):
    """A judge run killed with SIGKILL part way keeps what was judged; the rerun asks only the rest, once each."""
    import signal
    import sqlite3
    import subprocess
    import sys

    n, cache = 20, tmp_path / "judge.sqlite"
    with FakeJudgeServer(lambda k: (time.sleep(0.03), "[[A]]")[1]) as srv:
        child = subprocess.Popen([sys.executable, "-c", JUDGE_CHILD, srv.url, str(cache), str(n)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def judged() -> int:
            try:
                with sqlite3.connect(cache) as conn:
                    return conn.execute("SELECT count(*) FROM judgments").fetchone()[0]
            except sqlite3.OperationalError:
                return 0  # not created yet

        deadline = time.monotonic() + 120
        while judged() < 10 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        kept = judged()
        assert child.returncode == -signal.SIGKILL and 10 <= kept < 2 * n  # killed part way

        rerun = judge.HttpJudge(srv.url, "m", judge.Cache(cache), concurrency=1)
        result = judge.judge(_pairs(n), rerun, order="both")
        assert rerun.requests == 2 * n - kept and judged() == 2 * n  # the rest, each asked once
        fresh = judge.judge(_pairs(n), judge.HttpJudge(srv.url, "m", judge.Cache(tmp_path / "fresh.sqlite")), "both")
    assert result == fresh and result["failed_games"] == 0
