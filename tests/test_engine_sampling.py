"""At temperature > 0 speculative decoding must not change the output distribution.

On a 16-token model the target's exact distribution over the first three generated tokens is enumerated from
transformers' logits, with temperature / top-k / top-p applied by a plain reference implementation here. The
engine's samples (one seeded request each) are compared with it by a chi-square test, cells with expected count
< 5 pooled. Each test has a false-alarm rate of 1e-3 for a correct engine; seeds are fixed, so results are
reproducible rather than flaky.
"""

import numpy as np
import pytest
import torch
from engine_helpers import bigram_draft, make_target
from scipy.stats import chisquare

from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.models.eagle3 import Eagle3Draft

ALPHA = 1e-3
N = 4000
PROMPT = [1, 5, 9, 3]
CHARS = "abcdefghijklm"  # 3 specials + 13 = 16 tokens


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if top_k > 0:
        z[order[top_k:]] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        ranked = p[order]
        keep = np.cumsum(ranked) - ranked < top_p
        keep[0] = True
        mask = np.zeros_like(p, dtype=bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0)
        p /= p.sum()
    return p


def exact_joint(hf, params: SamplingParams, depth: int) -> dict[tuple[int, ...], float]:
    """P(first ``depth`` generated tokens) under the target alone."""
    joint = {(): 1.0}
    for _ in range(depth):
        prefixes = list(joint)
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT + list(p) for p in prefixes])).logits[:, -1].numpy()
        nxt = {}
        for prefix, row in zip(prefixes, logits):
            probs = reference_probs(row, params.temperature, params.top_k, params.top_p)
            for t in np.nonzero(probs)[0]:
                nxt[prefix + (int(t),)] = joint[prefix] * probs[t]
        joint = nxt
    return joint


def chi_square_pvalue(samples: list[tuple[int, ...]], joint: dict) -> float:
    counts: dict = {}
    for s in samples:
        assert s in joint, f"sampled {s}, which has probability 0 under the target"
        counts[s] = counts.get(s, 0) + 1
    n = len(samples)
    big = [c for c, p in joint.items() if n * p >= 5]
    obs = [counts.get(c, 0) for c in big]
    exp = [n * joint[c] for c in big]
    rest_exp = n - sum(exp)
    if rest_exp > 1e-9:
        obs.append(n - sum(obs))
        exp.append(rest_exp)
    return chisquare(obs, exp).pvalue


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for kind in ("random", "bigram"):
        d = tmp_path_factory.mktemp(kind)
        if kind == "random":
            hf = make_target(d, seed=4, vocab_size=16, chars=CHARS, lm_head_std=0.2)
        else:
            hf = make_target(d, seed=4, vocab_size=16, chars=CHARS, lm_head_std=0.25, bigram=0.005, kv_heads=2)
        base = Engine.load(d, gamma=0, max_seq_len=32)
        draft = Eagle3Draft.random(base.model.config, seed=2) if kind == "random" else bigram_draft(hf, base.model)
        if kind == "random":
            with torch.no_grad():
                draft.lm_head.weight.mul_(50.0)  # a confident, mostly wrong draft: q far from p
        out[kind] = (hf, base, draft)
    return out


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=4),
    dict(temperature=1.3, top_p=0.6),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=["t1", "t0.7-k4", "t1.3-p0.6"])
@pytest.mark.parametrize("kind", ["random", "bigram"])
def test_speculative_samples_follow_the_target_distribution(models, kind, setting):
    hf, base, draft = models[kind]
    eng = Engine(base.model, base.tokenizer, draft=draft, gamma=3, max_batch=64, max_seq_len=32, eos_token_ids=[])
    params = [SamplingParams(max_tokens=3, ignore_eos=True, seed=i, **setting) for i in range(N)]
    outs = eng.generate([PROMPT] * N, params)
    samples = [tuple(o.token_ids) for o in outs]
    assert all(len(s) == 3 for s in samples)
    for depth in (2, 3):
        joint = exact_joint(hf, params[0], depth)
        assert chi_square_pvalue([s[:depth] for s in samples], joint) > ALPHA
    s = eng.stats  # both verification outcomes occurred: accepted drafts and residual resamples
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens


def test_plain_sampling_follows_the_target_distribution(models):
    hf, base, _ = models["random"]
    eng = Engine(base.model, base.tokenizer, gamma=0, max_batch=64, max_seq_len=32, eos_token_ids=[])
    params = [SamplingParams(max_tokens=2, ignore_eos=True, seed=i, temperature=0.9, top_k=6) for i in range(N)]
    samples = [tuple(o.token_ids) for o in eng.generate([PROMPT] * N, params)]
    assert chi_square_pvalue(samples, exact_joint(hf, params[0], 2)) > ALPHA


def test_seeded_output_does_not_depend_on_batch_composition(models):
    hf, base, draft = models["bigram"]
    eng = Engine(base.model, base.tokenizer, draft=draft, gamma=3, max_batch=8, max_seq_len=32, eos_token_ids=[])
    mine = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1234)
    [alone] = eng.generate([PROMPT], mine)
    others = [SamplingParams(temperature=t, max_tokens=m, seed=s, ignore_eos=True, top_k=k)
              for t, m, s, k in ((0.0, 5, None, 0), (0.8, 12, 7, 3), (1.5, 2, None, 0), (1.0, 9, 8, 0))]
    crowd = eng.generate([[1, 7], PROMPT, [1, 3, 3, 3, 3], PROMPT, PROMPT], others[:3] + [mine] + others[3:])
    assert crowd[3].token_ids == alone.token_ids
    [again] = eng.generate([PROMPT], mine)
    assert again.token_ids == alone.token_ids
    unseeded = [o.token_ids for o in eng.generate([PROMPT] * 6, SamplingParams(temperature=1.0, max_tokens=12))]
    assert len(set(map(tuple, unseeded))) > 1


def test_a_top_k_beyond_any_vocabulary_is_no_limit(models):
    """top_k of any size (clients send what the API allows, up to unbounded ints) keeps every token."""
    hf, base, draft = models["bigram"]
    eng = Engine(base.model, base.tokenizer, draft=draft, gamma=3, max_batch=2, max_seq_len=32, eos_token_ids=[])
    plain = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=5)
    huge = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=5, top_k=2**64)
    assert eng.generate([PROMPT], huge)[0].token_ids == eng.generate([PROMPT], plain)[0].token_ids
