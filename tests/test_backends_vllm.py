"""Real vLLM (CPU build) behind the same backend interface: speculative counters, same prompt tokens, LoRA merge.

Slow (about a minute per vLLM start); needs SPECOPS_VLLM_PYTHON pointing at a python that imports vllm.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import openai
import pytest
from serve_helpers import FIXTURE
from test_backends_embedded import children

from specops.backends import BackendConfig, start_backend
from specops.files import read_json
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig
from specops.task.prompt import messages as task_messages
from specops.task.schema import SCHEMA, validate

VLLM_PYTHON = os.environ.get("SPECOPS_VLLM_PYTHON")
MODEL = FIXTURE / "target-merged"
GAMMA = 3


def _usable(py: str | None) -> bool:
    if not py or not Path(py).is_file():
        return False
    return subprocess.run([py, "-c", "import vllm"], capture_output=True, timeout=300).returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _usable(VLLM_PYTHON), reason="SPECOPS_VLLM_PYTHON unset or cannot import vllm"),
]


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory) -> Path:
    # A reduced draft vocabulary, as published EAGLE-3 heads have (vLLM expects d2t only then).
    cfg = LlamaConfig.from_dict(read_json(MODEL / "config.json"))
    return Eagle3Draft.random(cfg, draft_vocab_size=cfg.vocab_size // 2, seed=0).save(tmp_path_factory.mktemp("draft"))


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.api_key or "unused", max_retries=0)


def _prompt_tokens(server) -> tuple[int, int]:
    c = _client(server)
    a = c.completions.create(model=server.model_name, prompt="Wireless earbuds", max_tokens=4, temperature=0)
    b = c.chat.completions.create(model=server.model_name, messages=task_messages("red shoes under $80"),
                                  max_tokens=4, temperature=0)
    return a.usage.prompt_tokens, b.usage.prompt_tokens


def test_vllm_backend_speculates_and_its_counters_are_scraped(random_draft):
    with start_backend(BackendConfig(kind="embedded", model=MODEL, startup_timeout_s=120)) as ours:
        expected_prompt_tokens = _prompt_tokens(ours)
    before_children = children()
    cfg = BackendConfig(kind="vllm", model=MODEL, draft=random_draft, gamma=GAMMA, vllm_python=Path(VLLM_PYTHON),
                        api_key="k", startup_timeout_s=900)
    with start_backend(cfg) as server:
        assert [m.id for m in _client(server).models.list().data] == [server.model_name]
        before = server.spec_counters()
        assert _prompt_tokens(server) == expected_prompt_tokens
        r = _client(server).chat.completions.create(
            model=server.model_name, messages=task_messages("used iphone 14 with free shipping"), max_tokens=300,
            temperature=0, response_format={"type": "json_schema",
                                            "json_schema": {"name": "commerce_search", "schema": SCHEMA}})
        assert r.choices[0].finish_reason == "stop"
        assert validate(json.loads(r.choices[0].message.content)) == []
        d = server.spec_counters().since(before)
    # vLLM drafts fewer than γ tokens when a request is within γ of its length limit, never more
    assert d.num_drafts > 0 and d.num_drafts <= d.num_draft_tokens <= GAMMA * d.num_drafts
    assert len(d.accepted_per_pos) == GAMMA and sum(d.accepted_per_pos) == d.num_accepted_tokens
    assert children() == before_children


def test_vllm_serves_lora_with_a_draft_through_a_merged_copy(random_draft):
    cfg = BackendConfig(kind="vllm", model=FIXTURE / "base", lora=FIXTURE / "lora", draft=random_draft,
                        gamma=GAMMA, vllm_python=Path(VLLM_PYTHON), startup_timeout_s=900)
    server = start_backend(cfg)
    try:
        merged_dir = Path(server.process.proc.args[server.process.proc.args.index("--model") + 1])
        assert merged_dir.is_dir() and merged_dir != cfg.model
        r = _client(server).completions.create(model=server.model_name, prompt="Wireless earbuds", max_tokens=8)
        assert r.usage.completion_tokens >= 1
        assert server.spec_counters().num_drafts > 0
    finally:
        server.stop()
    assert not merged_dir.exists()


def test_vllm_metrics_acceptance_matches_specops_with_the_domain_draft():
    """vLLM's own /metrics acceptance rate for the trained draft agrees with specops' on the same prompts."""
    from specops.engine.engine import Engine
    from specops.engine.sampling import SamplingParams
    from specops.fixtures.recipe import heldout_examples
    from specops.inputs import query_prompt_ids

    draft = FIXTURE / "draft-domain"
    queries = [e.query for e in heldout_examples(16)]
    engine = Engine.load(MODEL, draft=draft, gamma=GAMMA, max_batch=16)
    engine.generate([query_prompt_ids(engine.tokenizer, q) for q in queries],
                    SamplingParams(temperature=0.0, max_tokens=160))
    ours = engine.stats.acceptance_rate
    cfg = BackendConfig(kind="vllm", model=MODEL, draft=draft, gamma=GAMMA, vllm_python=Path(VLLM_PYTHON))
    with start_backend(cfg) as server:
        before = server.spec_counters()
        for q in queries:
            _client(server).chat.completions.create(model=server.model_name, messages=task_messages(q),
                                                    max_tokens=160, temperature=0)
        d = server.spec_counters().since(before)
    theirs = d.num_accepted_tokens / d.num_draft_tokens
    assert ours > 0.5, ours  # the trained draft, not a random one
    assert abs(ours - theirs) <= 0.10 * theirs, f"acceptance rate {ours:.3f} (specops) vs {theirs:.3f} (vLLM /metrics)"
