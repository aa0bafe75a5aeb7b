"""What a request can reach on ``python -m specops.serve``: the API key guards every route but /health, no request
field reads a file or a URL, the server binds loopback unless told otherwise, and prompt text stays out of
/metrics, error bodies and the server's log."""

from __future__ import annotations

import base64
import http.server
import inspect
import json
import threading

import httpx
import pytest
from serve_helpers import FIXTURE, free_port, start_server, stop_server

from specops import cli
from specops.backends import embedded
from specops.backends import vllm as vllm_backend
from specops.backends.config import BackendConfig
from specops.engine.config import EngineConfig
from specops.errors import SpecopsError
from specops.serve import server as serve_server

MODEL = FIXTURE / "target-merged"
NAME = "commerce-tiny"
KEY = "sk-Sec-9f3Kq"
MARKER = "zqxmarker7731"  # appears in no model output, metric or log unless a request's text leaks there
FILE_KEY = "zqxfilekey5512"  # the only key the schema in the referenced file allows
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "red shoes"}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"model": NAME, "prompt": "Wireless earbuds", "max_tokens": 8, "temperature": 0}


class Server:
    """The server subprocess with its output drained into ``log`` as it comes (so it is never blocked on a pipe)."""

    def __init__(self, proc, port: int):
        self.proc, self.port, self.url, self._lines = proc, port, f"http://127.0.0.1:{port}", []
        self._drain = threading.Thread(target=lambda: self._lines.extend(proc.stdout), daemon=True)
        self._drain.start()

    @property
    def log(self) -> str:
        return "".join(self._lines)


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server(["--model", str(MODEL), "--served-model-name", NAME, "--api-key", KEY,
                         "--max-seq-len", "256"], port, host=None)
    yield Server(proc, port)
    stop_server(proc)


@pytest.fixture(scope="module")
def routes():
    """(path, method) of every route the real app registers, built by the same code as the server's."""
    from specops.engine.engine import Engine
    from specops.serve.app import create_app
    from specops.serve.runner import EngineRunner

    state = serve_server.build_state(EngineRunner(Engine.from_config(EngineConfig(model=MODEL, max_seq_len=256))),
                                     model_name=NAME, max_seq_len=256, max_queue=8)
    try:
        app = create_app(state, api_key=KEY)
        yield sorted({(r.path, sorted(r.methods - {"HEAD"})[0]) for r in app.routes})
    finally:
        state.runner.stop()


def call(server: Server, method: str, path: str, headers: dict | None = None) -> httpx.Response:
    body = {**COMPLETION, **CHAT, "max_tokens": 1} if method == "POST" else None
    return httpx.request(method, server.url + path, json=body, headers=headers or {}, timeout=60)


def assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401, (r.request.url, r.text)
    err = r.json()["error"]
    assert err["message"] and err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    assert "param" in err and r.headers["www-authenticate"] == "Bearer"


# --- the API key ---------------------------------------------------------------------------------------------------

def test_the_app_registers_the_routes_this_file_guards(routes):
    paths = {p for p, _ in routes}
    assert {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/openapi.json"} <= paths


def test_every_route_but_health_needs_the_key(server, routes):
    for path, method in routes:
        if path == "/health":
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = call(server, method, path, headers)
            assert_401(r)
            assert "wrong" not in r.text
        r = call(server, method, path, AUTH)
        assert r.status_code != 401 and r.status_code < 500, (path, r.status_code, r.text)


def test_health_is_open(server):
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/nope", "/v1/nope", "/healthz", "/health/x", "/metrics/"])
def test_paths_without_a_route_need_the_key_too(server, path):
    """Unknown paths answer 401 first, so probing without the key learns nothing about what exists."""
    assert_401(httpx.get(server.url + path))
    assert httpx.get(server.url + path, headers=AUTH).status_code in (404, 307)  # /metrics/ redirects to /metrics


@pytest.mark.parametrize("value", [
    f"Basic {base64.b64encode(f'user:{KEY}'.encode()).decode()}",
    f"Basic {KEY}",
    "Bearer",
    f"Token {KEY}",
    KEY,
    f"Bearer {KEY.upper()}",
    f"Bearer {KEY.lower()}",
    f"Bearer  {KEY}",
    f"Bearer\t{KEY}",
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    f"Bearer {KEY} {KEY}",
    f"Bearer {KEY},Bearer {KEY}",
])
def test_only_the_exact_bearer_key_passes(server, value):
    for path in ("/metrics", "/v1/models"):
        assert_401(httpx.get(server.url + path, headers={"Authorization": value}))


def test_an_empty_or_unsendable_api_key_is_refused_at_start():
    """An empty key must not mean "no auth", and a key no HTTP header can carry would lock every client out."""
    for key in ("", " ", f" {KEY}", f"{KEY} ", "k\ney", "ключ"):
        with pytest.raises(SpecopsError, match="--api-key"):
            serve_server.run_server(EngineConfig(model=MODEL), api_key=key)


# --- nothing a request names is read -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [str(MODEL), str(FIXTURE / "draft-domain"), "../target-merged", "target-merged",
                                   "/etc/passwd", "file:///etc/passwd", "http://127.0.0.1:9/model", f"{NAME}/../x"])
@pytest.mark.parametrize("endpoint, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_a_model_other_than_the_served_name_is_404_and_loads_nothing(server, model, endpoint, body):
    r = httpx.post(server.url + endpoint, json={**body, "model": model}, headers=AUTH, timeout=60)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model" and err["type"] == "not_found_error"


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("schemas") / "secret.json"
    path.write_text(json.dumps({"type": "object", "properties": {FILE_KEY: {"const": FILE_KEY}},
                                "required": [FILE_KEY], "additionalProperties": False}))
    return path


@pytest.fixture(scope="module")
def schema_host(schema_file):
    """A loopback HTTP server serving the schema file, counting every request it gets."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = schema_file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()


def ref_format(ref: str, where: str) -> dict:
    sub = {"$ref": ref}
    schema = {
        "property": {"type": "object", "properties": {"a": sub}, "required": ["a"]},
        "root": sub,
        "nested": {"type": "object", "required": ["a"],
                   "properties": {"a": {"type": "array", "items": {"anyOf": [sub, {"type": "null"}]}}}},
        "defs": {"$defs": {"x": sub}, "type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"]},
    }[where]
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("where", ["property", "root", "nested", "defs"])
@pytest.mark.parametrize("ref", ["file://{file}", "{file}", "file://{file}#/properties", "{host}/secret.json",
                                 "secret.json", "#secret", "urn:x:secret"])
def test_a_ref_outside_the_schema_is_400_and_fetches_nothing(server, schema_file, schema_host, ref, where):
    host, hits = schema_host
    ref = ref.format(file=schema_file, host=host)
    for endpoint, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        for stream in (False, True):
            r = httpx.post(server.url + endpoint, headers=AUTH, timeout=60,
                           json={**body, "max_tokens": 40, "stream": stream, "response_format": ref_format(ref, where)})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "response_format" and err["type"] == "invalid_request_error"
            assert FILE_KEY not in r.text
    assert hits == []


def test_a_ref_inside_the_schema_still_constrains(server):
    schema = {"$defs": {"size": {"type": "integer", "minimum": 1, "maximum": 9}}, "type": "object",
              "properties": {"size": {"$ref": "#/$defs/size"}}, "required": ["size"], "additionalProperties": False}
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=60,
                   json={**CHAT, "max_tokens": 40, "response_format": {
                       "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert list(json.loads(choice["message"]["content"])) == ["size"]


def test_fields_other_servers_read_files_for_are_ignored(server, schema_file, schema_host):
    """vLLM-style extras (a chat template, an adapter, guided decoding, a tokenizer path) leave the answer as it is."""
    host, hits = schema_host
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=60).json()
    extras = {
        "chat_template": f"{{{{ '{MARKER}' }}}}{{% include '{schema_file}' %}}",
        "chat_template_kwargs": {"template": str(schema_file)},
        "lora_request": {"lora_name": "x", "lora_path": str(FIXTURE / "draft-domain")},
        "adapter": str(FIXTURE / "draft-domain"),
        "guided_json": {"$ref": f"file://{schema_file}"},
        "guided_grammar": f"{host}/grammar",
        "tokenizer": str(schema_file.parent),
        "download_dir": str(schema_file.parent),
        "user": MARKER,
    }
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, **extras}, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"] == plain["choices"] and r.json()["usage"] == plain["usage"]
    assert hits == []


# --- binding -------------------------------------------------------------------------------------------------------

def _listening(port: int) -> list[str]:
    """Hex local addresses of the sockets listening on ``port`` (IPv4 and IPv6), from /proc/net."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, _, state = row.split()[1:4]
            addr, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":
                out.append(addr)
    return out


def test_serve_binds_loopback_by_default(server):
    assert _listening(server.port) == ["0100007F"]  # 127.0.0.1 only, nothing on IPv6
    assert f"on http://127.0.0.1:{server.port}/v1" in server.log


def test_default_hosts_are_loopback(tmp_path):
    assert inspect.signature(cli.serve).parameters["host"].default.default == "127.0.0.1"
    assert inspect.signature(serve_server.run_server).parameters["host"].default == "127.0.0.1"
    cfg = BackendConfig(model=MODEL)
    assert cfg.host == "127.0.0.1"
    argv = embedded.command(cfg, 1234)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    py = tmp_path / "python"
    py.write_text("")
    argv = vllm_backend.command(BackendConfig(kind="vllm", model=MODEL, vllm_python=py), MODEL, 1234)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


# --- no prompt text in metrics, error bodies or the log ------------------------------------------------------------

def test_prompt_text_stays_out_of_metrics_errors_and_the_log(server):
    sent = [
        ("/v1/completions", {**COMPLETION, "prompt": f"{MARKER} earbuds", "user": MARKER}, 200),
        ("/v1/completions", {**COMPLETION, "prompt": [f"{MARKER} a", f"b {MARKER}"], "stream": True}, 200),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": MARKER}], "user": MARKER}, 200),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": MARKER, "content": MARKER}]}, 200),
        ("/v1/completions", {**COMPLETION, "prompt": f"{MARKER} " * 400}, 400),  # past the context
        ("/v1/completions", {**COMPLETION, "prompt": MARKER, "temperature": MARKER}, 400),
        ("/v1/completions", {**COMPLETION, "prompt": MARKER, "stop": [MARKER] * 9}, 400),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"http://{MARKER}/x.png"}}]}]}, 400),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": {"text": MARKER}}]}, 400),
        ("/v1/chat/completions", {**CHAT, "messages": MARKER}, 400),
        ("/v1/completions", {**COMPLETION, "prompt": MARKER, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}, 400),
        (f"/v1/{MARKER}", {**COMPLETION, "prompt": MARKER}, 404),
    ]
    for path, body, status in sent:
        r = httpx.post(server.url + path, json=body, headers=AUTH, timeout=60)
        assert r.status_code == status, (body, r.text)
        if status != 200:
            assert MARKER not in r.text, r.text
        assert_401(httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {MARKER}"}))
    metrics = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert metrics.status_code == 200 and "specops_requests_total" in metrics.text
    assert MARKER not in metrics.text
    httpx.get(f"{server.url}/health")  # one more round trip, so the log has caught up with the requests above
    assert "serving" in server.log and MARKER not in server.log
