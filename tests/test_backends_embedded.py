"""The embedded and external backends on the fixture: start, answer, read spec counters, stop without orphans."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import openai
import pytest
import torch
from serve_helpers import FIXTURE

from specops.backends import BackendConfig, start_backend
from specops.errors import SpecopsError
from specops.files import read_json
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig
from specops.models.target import load_target, save_merged

MODEL = FIXTURE / "target-merged"
PROMPTS = ["Wireless earbuds with", "我想買一雙", "Best laptop for", "A blue kettle"]
GAMMA = 3


def children() -> set[int]:
    """Live child processes of this test process (zombies excluded)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.add(int(d.name))
    return out


def greedy(server, prompts=PROMPTS) -> list[str]:
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key or "unused", max_retries=0)
    return [client.completions.create(model=server.model_name, prompt=p, max_tokens=24, temperature=0).choices[0].text
            for p in prompts]


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory) -> Path:
    # A reduced draft vocabulary, as published EAGLE-3 heads have (vLLM expects d2t only then).
    cfg = LlamaConfig.from_dict(read_json(MODEL / "config.json"))
    return Eagle3Draft.random(cfg, draft_vocab_size=cfg.vocab_size // 2, seed=0).save(tmp_path_factory.mktemp("draft"))


def test_embedded_backend_serves_speculatively_and_leaves_nothing_behind(random_draft):
    before = children()
    cfg = BackendConfig(kind="embedded", model=MODEL, draft=random_draft, gamma=GAMMA, api_key="k",
                        startup_timeout_s=120)
    with start_backend(cfg) as server:
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        assert server.model_name == "target-merged"
        counters_before = server.spec_counters()
        texts = greedy(server)
        d = server.spec_counters().since(counters_before)

        # The same server as an external backend: found by URL (with or without /v1), model name discovered.
        for url in (server.base_url, server.base_url.removesuffix("/v1")):
            ext = start_backend(BackendConfig(kind="external", url=url, api_key="k"))
            assert (ext.base_url, ext.model_name) == (server.base_url, server.model_name)
            assert greedy(ext, PROMPTS[:1]) == texts[:1]
            ext.stop()
        with pytest.raises(SpecopsError, match="does not answer"):
            start_backend(BackendConfig(kind="external", url=server.base_url, api_key="wrong"))
        assert greedy(server, PROMPTS[:1]) == texts[:1]  # stopping an external backend leaves the server alone
        assert children() - before
    assert children() == before and not server.process.group_alive()

    assert all(texts)
    assert d.num_drafts > 0
    assert d.num_draft_tokens == GAMMA * d.num_drafts
    assert len(d.accepted_per_pos) == GAMMA and sum(d.accepted_per_pos) == d.num_accepted_tokens
    assert all(a >= b for a, b in zip(d.accepted_per_pos, d.accepted_per_pos[1:]))  # chain drafting


def test_a_start_that_times_out_or_is_interrupted_leaves_no_process():
    before = children()
    with pytest.raises(SpecopsError, match="not healthy"):
        start_backend(BackendConfig(kind="embedded", model=MODEL, startup_timeout_s=0.3))
    assert children() == before

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_backend(BackendConfig(kind="embedded", model=MODEL, startup_timeout_s=120))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert children() == before


def test_merged_lora_copy_holds_the_weights_the_engine_merges(tmp_path):
    base, lora = FIXTURE / "base", FIXTURE / "lora"
    out = save_merged(base, lora, tmp_path / "merged")
    merged, _ = load_target(out, dtype=torch.float32)
    reference, _ = load_target(base, lora=lora, lora_mode="merged", dtype=torch.float32)
    plain_base, _ = load_target(base, dtype=torch.float32)
    ref_state = reference.state_dict()
    for k, v in merged.state_dict().items():
        assert torch.equal(v, ref_state[k]), k
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight,
                           plain_base.model.layers[0].self_attn.q_proj.weight)
    assert (out / "tokenizer.json").is_file() and read_json(out / "config.json") == read_json(base / "config.json")
