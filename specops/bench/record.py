"""One measured request as the client saw it: the unit every metric is computed from and the store keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class RequestRecord:
    """Times are seconds from ``time.perf_counter``; ``start_s`` counts from the start of the timed phase.

    ``ttft_s`` is send → first chunk carrying text, ``e2e_s`` send → end of the stream (or of the failed attempt), ``itl_s`` the gaps between
    consecutive text chunks. ``output_tokens`` comes from the server's usage block when it sent one
    (``tokens_from == "usage"``), else it is the number of text chunks (``"chunks"``; exact only when every chunk
    carries one token)."""

    idx: int
    prompt_id: str
    start_s: float
    e2e_s: float
    ok: bool
    ttft_s: Optional[float] = None
    itl_s: tuple[float, ...] = field(default_factory=tuple)
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None
    tokens_from: str = "chunks"
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    text: str = ""
    provenance: Optional[dict] = None  # the server's draft provenance of the answer, when the sweep asked for it
