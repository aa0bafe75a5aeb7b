"""Stop conditions, streaming step API, abort, and request validation."""

import pytest
from engine_helpers import bigram_draft, make_target

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError

PROMPTS = [[20, 7, 3, 30], [5, 9, 13, 40, 41, 42, 11], [8, 8]]


@pytest.fixture(scope="module")
def spec_engine(tmp_path_factory):
    """A bigram target with a draft that is usually right: steps emit several tokens at once."""
    d = tmp_path_factory.mktemp("stops")
    hf = make_target(d, seed=3, bigram=0.005, kv_heads=2, vocab_size=48)
    base = Engine.load(d, gamma=0, max_seq_len=64)

    def build(gamma=4, max_batch=4, max_seq_len=64):
        draft = bigram_draft(hf, base.model) if gamma else None
        return Engine(base.model, base.tokenizer, draft=draft, gamma=gamma, max_batch=max_batch,
                      max_seq_len=max_seq_len, eos_token_ids=[])

    return build


def free_run(eng, prompt, n=30):
    [o] = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=n))
    return o.token_ids


@pytest.mark.parametrize("gamma", [0, 4])
def test_stop_string_truncates_text_and_tokens_exactly(spec_engine, gamma):
    eng = spec_engine(gamma)
    tok = eng.tokenizer
    for prompt in PROMPTS:
        full = free_run(eng, prompt)
        text = tok.decode(full, skip_special_tokens=True)
        stop = text[5:7]
        k = next(i for i in range(1, len(full) + 1) if stop in tok.decode(full[:i], skip_special_tokens=True))
        prefix = tok.decode(full[:k], skip_special_tokens=True)
        [o] = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=30, stop=["@never", stop]))
        assert o.finish_reason == "stop"
        assert o.token_ids == full[:k]  # up to the token completing the stop string, nothing after
        assert o.text == prefix[: prefix.find(stop)] and stop not in o.text


@pytest.mark.parametrize("gamma", [0, 4])
def test_stop_token_and_max_tokens(spec_engine, gamma):
    eng = spec_engine(gamma)
    full = free_run(eng, PROMPTS[0])
    stop_tok = full[9]
    first = full.index(stop_tok)
    [o] = eng.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok]))
    assert o.token_ids == full[: first + 1] and o.finish_reason == "stop"
    for m in (1, 2, 7):
        [o] = eng.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=m))
        assert o.token_ids == full[:m] and o.finish_reason == "length"


def test_max_seq_len_ends_with_length(spec_engine):
    eng = spec_engine(4, max_seq_len=16)
    [o] = eng.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=100))
    assert len(o.prompt_token_ids) + len(o.token_ids) == 16 and o.finish_reason == "length"
    assert o.token_ids == free_run(spec_engine(4), PROMPTS[1], 9)


def test_streamed_steps_add_up_and_abort_frees_the_slot(spec_engine):
    eng = spec_engine(4, max_batch=2)
    params = SamplingParams(temperature=0, max_tokens=25)
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, params)
    streamed = {f"r{i}": [] for i in range(3)}
    finished = {}
    multi = False
    for so in eng.step():  # admits r0, r1 (r2 waits: two slots)
        streamed[so.request_id] += so.new_token_ids
    eng.abort("r1")
    assert len(eng.scheduler.running) == 1 and eng.has_unfinished()
    while eng.has_unfinished():
        for so in eng.step():
            assert so.request_id != "r1"
            streamed[so.request_id] += so.new_token_ids
            multi |= len(so.new_token_ids) > 1
            if so.finished:
                finished[so.request_id] = so.output
    assert set(finished) == {"r0", "r2"} and multi
    ref0, ref2 = free_run(spec_engine(4), PROMPTS[0], 25), free_run(spec_engine(4), PROMPTS[2], 25)
    assert finished["r0"].token_ids == ref0 and finished["r2"].token_ids == ref2
    assert streamed["r0"] == ref0 and streamed["r2"] == ref2
    assert eng.scheduler.free_slots == [0, 1]


def test_invalid_requests_are_refused(spec_engine):
    eng = spec_engine(4, max_seq_len=16)
    eng.add_request("x", [5, 6], SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(SpecopsError, match="duplicate"):
        eng.add_request("x", [5, 6], SamplingParams())
    with pytest.raises(SpecopsError, match="max_seq_len"):
        eng.add_request("y", [5] * 16, SamplingParams())
    with pytest.raises(SpecopsError, match="token ids"):
        eng.add_request("z", [5, 48], SamplingParams())
    with pytest.raises(SpecopsError, match="empty"):
        eng.add_request("w", [], SamplingParams())
    for bad in (dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(top_k=-2)):
        with pytest.raises(SpecopsError):
            SamplingParams(**bad)
    with pytest.raises(SpecopsError, match="sampling params"):
        eng.generate([[1], [2]], [SamplingParams()])
