"""`specops study`: killed in each stage and resumed, everything is measured exactly once; its report opens in a
real browser with every chart drawn, no console error and no network request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_helpers import chromium, save_artifact, visit
from serve_helpers import FIXTURE, REPO

from specops.bench.store import RunStore

ARGS = ["--model", str(FIXTURE / "target-merged"), "--draft", str(FIXTURE / "draft-domain"),
        "--compare-draft", str(FIXTURE / "draft-general"), "--gamma", "0,3", "--concurrency", "1,2",
        "--temperature", "0", "--synthetic", "4", "--num-prompts", "4", "--max-tokens", "96", "--warmup", "1",
        "--acceptance-prompts", "3"]


def study(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specops", "study", "--out", str(out), *ARGS, *extra], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def stage_of(out: Path) -> tuple[str | None, int]:
    if not (out / "runs.sqlite").is_file():
        return None, 0
    store = RunStore(out)
    try:
        return store.meta("stage"), len(store.done_keys())
    finally:
        store.close()


def kill_when(proc: subprocess.Popen, out: Path, ready, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if ready(*stage_of(out)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.02)
    raise AssertionError(f"the study ended or stalled before the kill point (exit {proc.poll()}): "
                         f"{proc.stderr.read()[-2000:] if proc.poll() is not None else ''}")


def forget_stage(out: Path) -> None:
    """Clear the stage a killed run left behind, so the next kill point is one the resumed run reaches itself."""
    store = RunStore(out)
    try:
        store.put_meta("stage", None)
    finally:
        store.close()


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> Path:
    """A study SIGKILLed in the sweep (after its first configuration), then once it is past the sweep (quality is
    one short write, so the kill lands in quality or early in acceptance), then in acceptance, resumed after each."""
    out = tmp_path_factory.mktemp("study") / "run"
    kill_when(study(out), out, lambda stage, done: stage == "sweep" and done == 1)
    for points in (("quality", "acceptance"), ("acceptance",)):
        forget_stage(out)
        kill_when(study(out, "--resume"), out, lambda stage, done, p=points: stage in p)
    final = study(out, "--resume")
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err[-3000:]
    return out


def test_a_killed_study_resumes_with_everything_exactly_once(resumed_run):
    store = RunStore(resumed_run)
    try:
        configs = store.configs()
        assert sorted((c.point.gamma, c.point.concurrency) for c in configs) == [(0, 1), (0, 2), (3, 1), (3, 2)]
        assert all(len(c.records) == 4 and len({r.idx for r in c.records}) == 4 for c in configs)
        assert list(store.results("quality")) == ["γ = 3, T = 0"]
        acc = store.results("acceptance")
        assert sorted(acc) == ["draft-domain", "draft-general", "drafts"]
        assert store.result("quality", "γ = 3, T = 0")["lossless"]["identical_share"] == 1.0
        assert acc["draft-domain"]["matches_engine"] and acc["draft-general"]["matches_engine"]
        assert store.result("summary", "lines")
    finally:
        store.close()
    results = json.loads((resumed_run / "results.json").read_text(encoding="utf-8"))
    assert len(results["configurations"]) == 4


def test_the_report_renders_in_a_browser(resumed_run):
    assert chromium(), "the browser test needs Chromium (Debian package chromium; `make test` installs it)"
    page = resumed_run / "report.html"
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    check = """JSON.stringify(Array.from(document.querySelectorAll("svg.chart")).map(s => ({
        title: s.querySelector("title").textContent, width: s.getBoundingClientRect().width,
        marks: s.querySelectorAll(".series, .cell, .bar").length, empty: s.querySelectorAll(".empty").length})))"""
    v = visit(page.as_uri(), check)
    save_artifact("study-report.png", v.screenshot)
    assert v.console_errors == []
    assert v.requests == [page.as_uri()]  # the page itself, nothing else
    charts = json.loads(v.result)
    titles = [c["title"] for c in charts]
    for expected in ("Output tokens/s", "E2E latency", "TTFT", "TPOT", "Throughput speedup",
                     "Acceptance rate by draft position", "Acceptance rate by token class", "by schema field"):
        assert any(expected in t for t in titles), f"no chart {expected!r} in {titles}"
    assert all(c["marks"] > 0 and c["empty"] == 0 and c["width"] > 100 for c in charts), charts
    assert len(v.screenshot) > 50_000
