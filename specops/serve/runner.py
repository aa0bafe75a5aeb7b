"""The engine's own thread: it alone touches the engine (which is not thread-safe).

HTTP handlers queue additions and aborts to it; it applies them between steps, loops ``engine.step()`` while
requests are pending, sleeps otherwise, and hands each request's new tokens to that request's asyncio queue:
one ``loop.call_soon_threadsafe`` per step for all of them (each call wakes the event loop, which costs more
than the rest of a token's way out). Whatever the engine raises for one request (say, a prompt it refuses) goes
back to that request; an exception from ``step`` fails every request in flight, and the thread goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from specops.errors import SpecopsError

log = logging.getLogger("specops.serve")


@dataclass
class Event:
    """New output of one engine request (``tag`` tells the choices of one HTTP request apart)."""

    tag: int
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    client_error: bool = False  # the error is the request's fault (a 400), not the server's
    provenance: dict | None = None  # on the finishing event, when asked: output token ids and per-round records


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tag: int

    def put(self, event: Event) -> None:
        _deliver([(self, event)])


def _put_all(events: list[tuple[asyncio.Queue, Event]]) -> None:
    for queue, event in events:
        queue.put_nowait(event)


def _deliver(events: list[tuple[_Sink, Event]]) -> None:
    """Hand a step's events to their queues, one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for sink, event in events:
        by_loop.setdefault(sink.loop, []).append((sink.queue, event))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            pass


class EngineRunner:
    def __init__(self, engine):
        self.engine = engine
        self._cv = threading.Condition()
        self._inbox: deque[tuple] = deque()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._outstanding = 0  # submitted and not yet finished or aborted (guarded by _cv)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="specops-engine", daemon=True)
        self.steps = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def outstanding(self) -> int:
        """Requests accepted and not yet released by the engine thread (running, waiting, or queued to add)."""
        with self._cv:
            return self._outstanding

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, request_id: str, prompt_ids: list[int], params, queue: asyncio.Queue, tag: int = 0,
               constraint: Any = None, provenance: bool = False) -> None:
        """Queue a request; its events arrive on ``queue`` (from the calling event loop)."""
        sink = _Sink(asyncio.get_running_loop(), queue, tag)
        with self._cv:
            if self._stopping:
                raise SpecopsError("server is shutting down")
            self._outstanding += 1
            self._inbox.append(("add", request_id, prompt_ids, params, constraint, provenance, sink))
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Cancel a request; its cache slot is freed by the engine thread before the next step."""
        with self._cv:
            self._inbox.append(("abort", request_id))
            self._cv.notify()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Abort whatever is left and end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout_s)

    def _release(self, request_id: str) -> _Sink | None:
        sink = self._sinks.pop(request_id, None)
        if sink is not None:
            with self._cv:
                self._outstanding -= 1
        return sink

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "abort":
            rid = cmd[1]
            if rid in self._sinks:
                self.engine.abort(rid)
                self._release(rid)
            return
        _, rid, prompt_ids, params, constraint, provenance, sink = cmd
        try:
            self.engine.add_request(rid, prompt_ids, params, constraint=constraint, provenance=provenance)
        except SpecopsError as e:
            with self._cv:
                self._outstanding -= 1
            sink.put(Event(sink.tag, finished=True, error=str(e), client_error=True))
            return
        except Exception as e:  # noqa: BLE001 - the engine's bug must not kill the thread
            log.exception("engine refused request %s", rid)
            with self._cv:
                self._outstanding -= 1
            sink.put(Event(sink.tag, finished=True, error=f"engine error: {type(e).__name__}: {e}"))
            return
        self._sinks[rid] = sink

    def _fail_all(self, message: str) -> None:
        for rid in list(self._sinks):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - best effort after an engine failure
                log.exception("abort of %s failed", rid)
            sink = self._release(rid)
            sink.put(Event(sink.tag, finished=True, error=message))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and not self._stopping and not self.engine.has_unfinished():
                    self._cv.wait()
                cmds = list(self._inbox)
                self._inbox.clear()
                stopping = self._stopping
            for cmd in cmds:
                self._apply(cmd)
            if stopping:
                self._fail_all("server is shutting down")
                return
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # noqa: BLE001
                log.exception("engine step failed")
                self._fail_all(f"engine error: {type(e).__name__}: {e}")
                continue
            self.steps += 1
            events = []
            for out in outputs:
                sink = self._sinks.get(out.request_id)
                if sink is None:
                    continue
                if out.finished:
                    self._release(out.request_id)
                prov = None
                if out.output is not None and out.output.provenance is not None:
                    prov = {"token_ids": out.output.token_ids, "rounds": out.output.provenance}
                events.append((sink, Event(sink.tag, list(out.new_token_ids), out.finished, out.finish_reason,
                                           provenance=prov)))
            _deliver(events)
