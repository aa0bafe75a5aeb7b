"""benchmarks/soak.py at a small size: overload gets 429 with Retry-After while accepted requests stay correct,
and streams cut mid-response leave nothing running and no memory behind (its correctness checks, not its timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_overload_and_disconnects_at_a_small_size(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--queue", "8", "--disconnects", "100",
           "--streams", "8", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=580,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    res = json.loads((tmp_path / "soak.json").read_text())
    failed = [name for name, ok in res["checks"].items() if not ok]
    assert run.returncode == 0 and not failed, (failed, run.stdout[-2000:], run.stderr[-2000:])
    o, d = res["overload"], res["disconnects"]
    assert o["accepted"] == 8 and o["rejected_429"] == 24 and o["accepted_correct"] == 8
    assert d["cut_mid_response"] == 100 and d["in_flight_after"] == 0 and d["tokens_generated_after_drain"] == 0
