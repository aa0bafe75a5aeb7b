"""Headless Chromium driven over the DevTools protocol: open a page, collect console errors, exceptions and
every network request, evaluate a script, take a screenshot."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1100,1400"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page itself included
    result: object = None
    screenshot: bytes = b""


def visit(url: str, script: str, screenshot_width: int = 1100, timeout_s: float = 60.0) -> PageVisit:
    """Load ``url`` in a fresh headless Chromium profile, run ``script`` (an expression returning JSON-able data)
    after the load event, screenshot the whole page."""
    import websocket

    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (Debian package: chromium)")
    profile = tempfile.mkdtemp(prefix="specops-chromium-")
    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = _devtools_port(proc, timeout_s)
        target = httpx.put(f"http://127.0.0.1:{port}/json/new?about:blank", timeout=10).json()
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=timeout_s)
        page = _Session(ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        visit_ = PageVisit()
        page.call("Page.navigate", url=url)
        page.wait_for("Page.loadEventFired", visit_, timeout_s)
        time.sleep(0.3)  # late console messages
        page.drain(visit_)
        result = page.call("Runtime.evaluate", expression=script, returnByValue=True)
        visit_.result = result["result"].get("value")
        metrics = page.call("Page.getLayoutMetrics")
        height = int(metrics["cssContentSize"]["height"])
        page.call("Emulation.setDeviceMetricsOverride", width=screenshot_width, height=height, deviceScaleFactor=1,
                  mobile=False)
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        visit_.screenshot = base64.b64decode(shot["data"])
        page.drain(visit_)
        ws.close()
        return visit_
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if m:
            return int(m.group(1))
        if not line and proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
    raise RuntimeError("chromium did not open its DevTools port")


class _Session:
    def __init__(self, ws):
        self.ws, self.next_id, self.pending = ws, 0, []

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.pending.append(msg)

    def wait_for(self, event: str, visit_: PageVisit, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.pending.pop(0) if self.pending else json.loads(self.ws.recv())
            self._record(msg, visit_)
            if msg.get("method") == event:
                return
        raise RuntimeError(f"no {event} within {timeout_s} s")

    def drain(self, visit_: PageVisit) -> None:
        for msg in self.pending:
            self._record(msg, visit_)
        self.pending.clear()
        self.ws.settimeout(0.2)
        try:
            while True:
                self._record(json.loads(self.ws.recv()), visit_)
        except Exception:  # noqa: BLE001 - the socket's timeout ends the drain
            pass
        self.ws.settimeout(60)

    @staticmethod
    def _record(msg: dict, visit_: PageVisit) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            visit_.console_errors.append(json.dumps(params.get("args"))[:300])
        elif method == "Runtime.exceptionThrown":
            visit_.console_errors.append(json.dumps(params.get("exceptionDetails"))[:300])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            visit_.console_errors.append(params["entry"].get("text", "")[:300])
        elif method == "Network.requestWillBeSent":
            visit_.requests.append(params["request"]["url"])


def save_artifact(name: str, data: bytes) -> Path:
    """Keep a test artefact under build/test-artifacts (ignored by git)."""
    out = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)
    return out / name
