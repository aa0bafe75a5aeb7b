"""The server as clients see it: the official openai client against ``python -m specops.serve`` on the fixture."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from serve_helpers import FIXTURE, free_port, start_server, stop_server
from transformers import AutoTokenizer

from specops.backends.scrape import scrape_spec
from specops.inputs import chat_prompt_ids, text_prompt_ids
from specops.task.prompt import messages as task_messages
from specops.task.schema import SCHEMA, validate

MODEL = FIXTURE / "target-merged"
NAME = "commerce-tiny"
QUERIES = [
    "red running shoes under $80",
    "Compare the Sony and Bose noise cancelling headphones",
    "我想買一台 3000 元以下的藍色吹風機",
    "used iphone 14 in stock with free shipping, rating 4 or more",
    "where is my order",
]
COMMERCE_FORMAT = {"type": "json_schema", "json_schema": {"name": "commerce_search", "schema": SCHEMA}}


@pytest.fixture(scope="module", params=["--engine-thread", "--engine-process"])
def server(request):
    port = free_port()
    proc = start_server(["--model", str(MODEL), "--served-model-name", NAME, "--max-seq-len", "1024", request.param],
                        port)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(MODEL))


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_completion_counts_tokens_like_every_engine(client, tokenizer):
    r = client.completions.create(model=NAME, prompt="Wireless earbuds", max_tokens=12, temperature=0)
    assert r.usage.prompt_tokens == len(text_prompt_ids(tokenizer, "Wireless earbuds"))
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streamed_completion_equals_the_plain_one(client):
    kw = dict(model=NAME, prompt="A review of the blue kettle:", max_tokens=24, temperature=0)
    plain = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_streamed_chat_equals_the_plain_one(client, tokenizer):
    msgs = task_messages(QUERIES[0])
    plain = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=80, temperature=0)
    assert plain.usage.prompt_tokens == len(chat_prompt_ids(tokenizer, msgs))
    stream = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=80, temperature=0,
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == plain.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == plain.choices[0].finish_reason


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_responses_validate(client, temperature):
    for i, q in enumerate(QUERIES):
        r = client.chat.completions.create(model=NAME, messages=task_messages(q), max_tokens=300, seed=i,
                                           temperature=temperature, response_format=COMMERCE_FORMAT)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert validate(json.loads(choice.message.content)) == [], choice.message.content


def test_json_object_gives_json_even_for_a_free_text_prompt(client):
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Tell me a story."}],
                                       max_tokens=200, temperature=0, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), (dict, list))
    else:  # cut by max_tokens: still a prefix the grammar allows, so it opens a JSON value
        assert r.choices[0].message.content.lstrip()[:1] in "{["


def test_stop_string_cuts_the_text_before_it(client):
    kw = dict(model=NAME, messages=task_messages(QUERIES[1]), max_tokens=80, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    stop = full[10:14]
    r = client.chat.completions.create(**kw, stop=[stop])
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_n_choices_and_seeds_are_reproducible(client):
    kw = dict(model=NAME, prompt="Top picks for a rainy day:", max_tokens=16, temperature=1.0, n=3, seed=7)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1, "each choice has its own random stream"
    assert 3 <= a.usage.completion_tokens <= 48


def test_32_concurrent_requests_return_what_they_return_one_by_one(server, client):
    prompts = [f"Query {i}: " + QUERIES[i % len(QUERIES)] for i in range(32)]
    alone = [client.completions.create(model=NAME, prompt=p, max_tokens=16, temperature=0).choices[0].text
             for p in prompts]

    async def together():
        aclient = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
        rs = await asyncio.gather(*[aclient.completions.create(model=NAME, prompt=p, max_tokens=16, temperature=0)
                                    for p in prompts])
        await aclient.close()
        return [r.choices[0].text for r in rs]

    assert asyncio.run(together()) == alone


@pytest.mark.parametrize("call, status", [
    (lambda c: c.completions.create(model="no-such-model", prompt="x"), 404),
    (lambda c: c.completions.create(model=NAME, prompt="x", max_tokens=-1), 400),
    (lambda c: c.completions.create(model=NAME, prompt="word " * 1100), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", max_tokens=1100), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", temperature=3.5), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", top_p=0), 400),
    (lambda c: c.completions.create(model=NAME, prompt=[10**9]), 400),
    (lambda c: c.chat.completions.create(model=NAME, messages=[]), 400),
    (lambda c: c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}],
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "x", "schema": {"type": "no-such-type"}}}), 400),
    (lambda c: c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], logprobs=True), 400),
    (lambda c: c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}],
                                         logit_bias={"5": 100}), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", presence_penalty=0.5), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", frequency_penalty=-1), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", best_of=3), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", extra_body={"repetition_penalty": 1.2}), 400),
    (lambda c: c.completions.create(model=NAME, prompt="x", extra_body={"min_p": 0.1}), 400),
])
def test_bad_requests_are_4xx_with_a_message(client, call, status):
    with pytest.raises(openai.APIStatusError) as e:
        call(client)
    assert e.value.status_code == status
    assert e.value.body["message"] and e.value.body["type"]


def test_neutral_values_of_unsupported_knobs_are_accepted(client):
    # What OpenAI's own defaults (and many clients) send must not be turned away.
    plain = client.completions.create(model=NAME, prompt="x", max_tokens=4, temperature=0)
    neutral = client.completions.create(model=NAME, prompt="x", max_tokens=4, temperature=0, presence_penalty=0,
                                        frequency_penalty=0, logit_bias={}, best_of=1,
                                        extra_body={"repetition_penalty": 1.0, "min_p": 0})
    assert neutral.choices[0].text == plain.choices[0].text


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"prompt": 5}', b'{"model": "x"}', b""])
def test_malformed_bodies_are_400_in_openai_shape(server, body):
    r = httpx.post(f"{server}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and "param" in err and "code" in err


def test_metrics_count_requests_and_expose_spec_counters(server, client):
    client.completions.create(model=NAME, prompt="x", max_tokens=2)
    text = httpx.get(f"{server}/metrics").text
    assert 'specops_requests_total{endpoint="completions",status="200"}' in text
    assert "vllm:spec_decode_num_drafts_total" in text
    counters = scrape_spec(f"{server}/v1")
    assert counters.num_drafts == 0 and counters.num_draft_tokens == 0  # no draft: plain decoding
