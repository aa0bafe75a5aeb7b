"""Plain ASGI middleware (not BaseHTTPMiddleware, which would buffer streams and hide client disconnects)."""

from __future__ import annotations

import hmac
import json
import time

from specops.serve.errors import error_body

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/models": "models"}
OPEN_PATHS = frozenset({"/health"})  # liveness probes carry no key


class AuthMiddleware:
    """With an API key set, every path but /health needs ``Authorization: Bearer KEY``: /metrics and the OpenAPI
    schema too, and paths with no route, so a client without the key learns nothing of what the server holds.

    The header is compared whole and in constant time, so how early a guess goes wrong cannot be timed."""

    def __init__(self, app, api_key: str | None):
        self.app, self._expected = app, (f"Bearer {api_key}".encode() if api_key is not None else None)

    async def __call__(self, scope, receive, send):
        if self._expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        body = json.dumps(error_body(401, "invalid or missing API key", code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


class MetricsMiddleware:
    """Counts requests by endpoint and status; latency runs to the last byte, so streams are timed whole."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        endpoint = ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def timed_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.monotonic() - start)
            self.metrics.request_done()
