"""A server subprocess in its own process group: started, waited on until healthy, stopped without orphans.

Stopping signals the whole group (vLLM forks an engine-core process), SIGTERM first so servers drain, SIGKILL
after a grace period, and SIGKILL again for any member that outlives the leader. On Linux the server is also
tied to its parent's life (``PR_SET_PDEATHSIG``), so a benchmark killed with SIGKILL leaves no server running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specops.errors import SpecopsError

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the thread that started it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                 name: str = "server"):
        self.name = name
        fd, path = tempfile.mkstemp(prefix=f"specops-{name}-", suffix=".log")
        self.log_path = Path(path)
        self._log = os.fdopen(fd, "wb")
        self.healthy = False
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=cwd, start_new_session=True,
                                     preexec_fn=_die_with_parent if _LIBC is not None else None)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_healthy(self, url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        """Poll ``url`` until it answers 200; a process that exits first is an error showing its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SpecopsError(f"{self.name} exited with code {self.proc.returncode} before becoming healthy "
                                   f"(log {self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(url, headers=headers, timeout=2.0).status_code == 200:
                    self.healthy = True
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise SpecopsError(f"{self.name} not healthy after {timeout_s:.0f} s (log {self.log_path}):\n{self.log_tail()}")

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the group, SIGKILL after ``grace_s``; returns the leader's exit code.

        The log is removed after a clean run (healthy, then ended by SIGTERM or exit 0); otherwise it is kept."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # members that outlived the leader
        deadline = time.monotonic() + 5.0
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log.close()
        if self.healthy and self.proc.returncode in (0, -signal.SIGTERM):
            self.log_path.unlink(missing_ok=True)
        return self.proc.returncode

    def group_alive(self) -> bool:
        """Whether any process of the group still exists."""
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
