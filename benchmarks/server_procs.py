"""The processes of a running ``specops serve`` and the CPU time they use: shared by the host-cost benchmarks."""

from __future__ import annotations

import psutil


def cpu_s(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds the processes have used so far."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def processes(server) -> tuple[list[psutil.Process], psutil.Process]:
    """The server's API processes (those listening on its port) and its engine process (of its other children, the
    one that has used the most CPU: the engine loads a model, a resource tracker does nothing)."""
    parent = psutil.Process(server.process.proc.pid)
    port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    family = [parent, *parent.children()]
    apis = [p for p in family
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in p.net_connections("tcp"))]
    engine = max((p for p in family if p not in apis), key=lambda p: cpu_s([p]))
    return apis, engine
