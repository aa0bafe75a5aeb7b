"""--gamma auto: the cost model's choices on synthetic cost tables, the running acceptance, the stored
calibration, and an engine that changes γ between rounds while its outputs stay those of plain decoding."""

from __future__ import annotations

import json

import pytest
from engine_helpers import bigram_draft, make_target

from specops.engine.config import AUTO_GAMMA_MAX, EngineConfig, parse_gamma
from specops.engine.engine import Engine
from specops.engine.gamma import (CALIBRATION_FILE, AdaptiveGamma, StepCosts, calibration_key, choose_gamma,
                                  expected_tokens)
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError


def test_expected_tokens_by_hand():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([1.0, 0.8, 0.5], 3) == pytest.approx(1 + 1 + 0.8 + 0.4)


def rounds(c: float, v: list[float]) -> list[float]:
    """R(γ) = γ·c + v(γ): the textbook cost model, as a table."""
    return [g * c + v[g] for g in range(len(v))]


def test_choice_follows_the_costs_not_the_acceptance():
    """The anchor case: the same acceptance at batch 1 and 32, and the best γ flips with the step costs."""
    accept = [0.7] * 5
    # batch 1: a draft step is 5 % of a target step and verifying 6 tokens costs what 1 does (memory-bound)
    assert choose_gamma(accept, rounds(0.05, [1.0] * 6), 5) == 5
    # batch 32: compute-bound, each verified token adds half a step and a draft step costs 30 %:
    # E(1)/(0.3 + 1.5) = 1.7/1.8 < 1, and longer chains only do worse
    assert choose_gamma(accept, rounds(0.3, [1 + 0.5 * g for g in range(6)]), 5) == 0
    # in between, by hand: γ = 1 → 1.7/1.3 = 1.31, γ = 2 → 2.19/1.6 = 1.37, γ = 3 → 2.53/1.9 = 1.33
    assert choose_gamma(accept, rounds(0.1, [1 + 0.2 * g for g in range(6)]), 5) == 2
    # the tie goes to the smaller γ
    assert choose_gamma([0.0] * 5, [1.0] * 6, 5) == 0


def test_costs_of_an_unmeasured_batch_size_come_from_the_next_measured_one():
    costs = StepCosts([1, 4, 16], [[1, 1.1], [1, 1.2], [1, 1.3]])
    assert costs.at(1) == [1, 1.1] and costs.at(3) == [1, 1.2] and costs.at(64) == [1, 1.3]
    assert StepCosts.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs


def test_running_acceptance_learns_and_decays_back_to_the_prior():
    ctl = AdaptiveGamma(3, StepCosts([1], [rounds(0.05, [1.0] * 4)]), prior=0.6, prior_weight=4)
    assert ctl.acceptance() == pytest.approx([0.6] * 3)
    for _ in range(200):
        ctl.record(3, 1)  # draft 1 kept, draft 2 rejected, draft 3 never reached
    a = ctl.acceptance()
    assert a[0] > 0.95 and a[1] < 0.05 and a[2] == pytest.approx(0.6)
    assert ctl.choose(1) == 1  # a second draft is never kept: one is the best chain
    for _ in range(3000):
        ctl.choose(1)  # rounds that observe nothing (γ = 0 elsewhere) age the estimates
    assert ctl.acceptance() == pytest.approx([0.6] * 3, abs=0.01)


def test_gamma_flag_parsing_and_checks(tmp_path):
    assert parse_gamma("auto") == (AUTO_GAMMA_MAX, True) and parse_gamma("3") == (3, False)
    for bad in ("three", "-1"):
        with pytest.raises(SpecopsError, match="--gamma"):
            parse_gamma(bad)
    make_target(tmp_path / "m")
    with pytest.raises(SpecopsError, match="--gamma auto .* give --draft"):
        EngineConfig(tmp_path / "m", gamma=5, adaptive_gamma=True).validate()
    assert "auto" in EngineConfig(tmp_path / "m", draft=tmp_path, gamma=5, adaptive_gamma=True).argv()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    target = make_target(root / "target", bigram=0.005, kv_heads=2)
    plain = Engine.load(root / "target", max_batch=4, max_seq_len=128)
    bigram_draft(target, plain.model).save(root / "draft")
    return root, plain


PROMPTS = [[1, 5, 9, 14], [1, 30, 31], [1, 22, 8, 8, 40, 41], [1, 17]]


def test_auto_gamma_is_lossless_and_stores_its_costs(tiny):
    root, plain = tiny
    params = SamplingParams(temperature=0.0, max_tokens=40)
    expected = [o.token_ids for o in plain.generate(PROMPTS, params)]
    (root / "draft" / CALIBRATION_FILE).write_text("{not json")  # an unreadable file is measured again, replaced
    auto = Engine.load(root / "target", root / "draft", gamma=AUTO_GAMMA_MAX, adaptive_gamma=True, max_batch=4,
                       max_seq_len=128)
    stored = json.loads((root / "draft" / CALIBRATION_FILE).read_text())
    key = calibration_key(auto.runner, AUTO_GAMMA_MAX)
    assert StepCosts.from_dict(stored[key]) == auto.controller.costs
    assert auto.controller.costs.batch_sizes == [1, 2, 4]
    assert [o.token_ids for o in auto.generate(PROMPTS, params)] == expected  # all four at once
    assert [o.token_ids for o in auto.generate(PROMPTS[:1], params)] == expected[:1]  # alone
    assert auto.stats.num_drafts > 0


def test_the_gamma_used_follows_the_batch_size(tiny):
    """Stored costs (a restart reads them instead of measuring) that make speculation pay only at batch 1:
    alone a request drafts, four together do not, and outputs stay those of plain decoding."""
    root, plain = tiny
    probe = Engine.load(root / "target", root / "draft", gamma=AUTO_GAMMA_MAX, adaptive_gamma=True, max_batch=4,
                        max_seq_len=128)
    key = calibration_key(probe.runner, AUTO_GAMMA_MAX)
    costs = StepCosts([1, 2, 4], [rounds(0.01, [1.0] * 6), rounds(5.0, [1.0] * 6), rounds(5.0, [1.0] * 6)])
    (root / "draft" / CALIBRATION_FILE).write_text(json.dumps({key: costs.to_dict()}))
    auto = Engine.load(root / "target", root / "draft", gamma=AUTO_GAMMA_MAX, adaptive_gamma=True, max_batch=4,
                       max_seq_len=128)
    assert auto.controller.costs == costs
    params = SamplingParams(temperature=0.0, max_tokens=40)
    expected = [o.token_ids for o in plain.generate(PROMPTS, params)]
    together = auto.generate(PROMPTS, params, provenance=True)
    assert [o.token_ids for o in together] == expected
    widths = [len(r["drafts"]) for o in together for r in o.provenance]
    assert widths.count(0) > len(widths) // 2  # four rows: γ = 0 (only the first drafts and the tails draft)
    alone = auto.generate(PROMPTS[:1], params, provenance=True)[0]
    assert alone.token_ids == expected[0]
    assert all(len(r["drafts"]) == AUTO_GAMMA_MAX for r in alone.provenance[:-1])
