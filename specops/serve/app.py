"""The FastAPI application: OpenAI routes, /health, /metrics, over a running engine runner."""

from __future__ import annotations

import asyncio
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from specops.errors import SpecopsError
from specops.inputs import chat_prompt_ids, text_prompt_ids
from specops.serve import errors, responses
from specops.serve.errors import APIError, error_body
from specops.serve.generation import Generation, check_room
from specops.serve.middleware import AuthMiddleware, MetricsMiddleware
from specops.serve.prometheus import ServerMetrics
from specops.serve.protocol import ChatCompletionRequest, CompletionRequest, GammaScheduleRequest, SamplingFields
from specops.serve.runner import Runner

DISCONNECT_POLL_S = 0.25


@dataclass
class ServerState:
    runner: Runner
    model_name: str
    max_seq_len: int
    max_queue: int
    metrics: ServerMetrics

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size


def _check_model(state: ServerState, req: SamplingFields) -> None:
    if req.model is not None and req.model != state.model_name:
        raise APIError(404, f"The model `{req.model}` does not exist; this server serves `{state.model_name}`.",
                       param="model", code="model_not_found")


def _token_budget(state: ServerState, prompts: list[list[int]], requested: Optional[int]) -> list[int]:
    """max_tokens per prompt; a prompt plus its completion must fit the context, as vLLM requires."""
    out = []
    limit = state.max_seq_len
    for ids in prompts:
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        if len(ids) >= limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; the prompt has "
                                f"{len(ids)} tokens.", param="prompt", code="context_length_exceeded")
        want = requested if requested is not None else limit - len(ids)
        if len(ids) + want > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(ids) + want} tokens ({len(ids)} in the prompt, {want} in the completion).",
                           param="max_tokens", code="context_length_exceeded")
        out.append(want)
    return out


def _completion_prompts(state: ServerState, req: CompletionRequest) -> list[list[int]]:
    out = []
    for p in req.prompts():
        if isinstance(p, str):
            out.append(text_prompt_ids(state.tokenizer, p))
        else:
            if any(not 0 <= t < state.vocab_size for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {state.vocab_size})", param="prompt")
            out.append(list(p))
    return out


def _chat_prompt(state: ServerState, req: ChatCompletionRequest) -> list[list[int]]:
    try:
        return [chat_prompt_ids(state.tokenizer, req.message_dicts())]
    except SpecopsError as e:
        raise APIError(400, str(e), param="messages") from None
    except Exception as e:  # noqa: BLE001 - a template that fails on these messages is the request's problem
        raise APIError(400, f"chat template failed on these messages: {e}", param="messages") from None


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _collect(gen: Generation) -> dict[int, str]:
    texts: dict[int, list[str]] = {c.index: [] for c in gen.choices}
    async with aclosing(gen.deltas()) as deltas:
        async for d in deltas:
            texts[d.choice.index].append(d.text)
    return {i: "".join(t) for i, t in texts.items()}


async def _complete(request: Request, gen: Generation) -> Optional[dict[int, str]]:
    """All choices' texts, or None when the client left first (its engine requests are then aborted)."""
    collect = asyncio.ensure_future(_collect(gen))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    if collect in done:
        watch.cancel()
        return collect.result()
    collect.cancel()
    try:
        await collect
    except (asyncio.CancelledError, APIError):
        pass
    return None


def _stream(gen: Generation) -> StreamingResponse:
    """SSE in OpenAI's chunk format, ending with ``data: [DONE]`` (an error mid-stream is sent as a data event)."""

    async def events():
        try:
            if gen.endpoint == "chat":
                for c in gen.choices:
                    yield responses.sse(responses.chunk(gen, c.index, None, None, first=True))
            async with aclosing(gen.deltas()) as deltas:
                async for d in deltas:
                    yield responses.sse(responses.chunk(gen, d.choice.index, d.text, d.finish_reason))
            if gen.req.include_usage:
                yield responses.sse(responses.usage_chunk(gen))
        except APIError as e:
            yield responses.sse(error_body(e.status, e.message, e.param, e.code))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _run(request: Request, state: ServerState, req: SamplingFields, prompts: list[list[int]],
               max_tokens: Optional[int], endpoint: str):
    gen = Generation(state, prompts, req, _token_budget(state, prompts, max_tokens), endpoint)
    await gen.start()
    if req.stream:
        return _stream(gen)
    texts = await _complete(request, gen)
    if texts is None:  # nobody to answer
        return Response(status_code=499)
    return JSONResponse(responses.full(gen, texts))


def create_app(state: ServerState, api_key: Optional[str] = None, gamma_endpoint: bool = False) -> FastAPI:
    """The app; ``gamma_endpoint`` adds ``POST /admin/gamma-schedule`` (``serve --gamma-endpoint``)."""
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.runner.start()
        yield
        state.runner.stop()  # uvicorn has drained in-flight requests by now

    app = FastAPI(title="specops", lifespan=lifespan, docs_url=None, redoc_url=None)
    errors.install(app)
    app.add_middleware(AuthMiddleware, api_key=api_key)
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    app.state.specops = state

    @app.get("/health")
    async def health():
        body = {"status": "ok" if state.runner.alive else "engine stopped", "model": state.model_name,
                "requests_in_flight": state.runner.outstanding, "max_queue": state.max_queue}
        return JSONResponse(body, status_code=200 if state.runner.alive else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "specops", "max_model_len": state.max_seq_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request, req: CompletionRequest):
        _check_model(state, req)
        check_room(state, len(req.prompts()) * req.n)
        return await _run(request, state, req, _completion_prompts(state, req), req.max_tokens, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request, req: ChatCompletionRequest):
        _check_model(state, req)
        check_room(state, req.n)
        return await _run(request, state, req, _chat_prompt(state, req), req.token_limit, "chat")

    if gamma_endpoint:
        @app.post("/admin/gamma-schedule")
        async def gamma_schedule(req: GammaScheduleRequest):
            try:  # the engine checks the table (``Engine.use_gamma_schedule``)
                await state.runner.use_gamma_schedule(req.gamma_schedule)
            except SpecopsError as e:
                raise APIError(400, str(e), param="gamma_schedule") from None
            return {"gamma_schedule": req.gamma_schedule}

    return app
