"""Shared pieces of the serving tests: a small tokenizer, the model under test, a server subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "commerce-tiny"


def train_tokenizer(out: Path) -> Path:
    """The fixture tokenizer recipe on a small corpus: byte-level BPE, chat template, ``<|eot|>`` as EOS."""
    from specops.fixtures import corpus
    from specops.fixtures import tokenizer as tok_lib

    tok_lib.save(tok_lib.train(corpus.documents(600, seed=0), 1024), out, 1024)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], port: int, timeout_s: float = 120.0, env: dict | None = None,
                 host: str | None = "127.0.0.1") -> subprocess.Popen:
    """``python -m specops.serve ARGS --host HOST --port PORT`` in its own process group, returned once /health
    answers; ``host=None`` leaves the server's default bind address."""
    bind = ["--host", host] if host is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "specops.serve", *args, *bind, "--port", str(port)],
        cwd=REPO, start_new_session=True, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError("server did not become healthy")


def stop_server(proc: subprocess.Popen, grace_s: float = 20.0) -> int:
    """SIGTERM the server's process group, SIGKILL after ``grace_s``; returns the exit code."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
