"""--gamma-schedule: vLLM's batch-size ranges parsed and checked, carried through the config and its flags, and an
engine on the fixture models whose every round drafts the schedule's γ for its batch size, losslessly."""

from __future__ import annotations

import inspect
import json

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import FIXTURE

from specops.backends import BackendConfig
from specops.cli import app, engine_config
from specops.engine.config import EngineConfig, gamma_at, parse_gamma_schedule
from specops.engine.engine import Engine
from specops.engine.sampling import SamplingParams
from specops.errors import SpecopsError

TARGET, DRAFT = FIXTURE / "target-merged", FIXTURE / "draft-domain"


def test_valid_schedules_and_the_gamma_of_each_batch_size():
    schedule = parse_gamma_schedule("[[1,4,5],[5,16,3],[17,64,1]]")
    assert schedule == ((1, 4, 5), (5, 16, 3), (17, 64, 1))
    assert [gamma_at(schedule, b) for b in (1, 4, 5, 16, 17, 64)] == [5, 5, 3, 3, 1, 1]
    assert gamma_at(schedule, 65) == gamma_at(schedule, 1000) == 1  # beyond the last range: its γ
    assert parse_gamma_schedule([[1, 1, 0]]) == ((1, 1, 0),) and parse_gamma_schedule(schedule) == schedule


@pytest.mark.parametrize("text, message", [
    ("[[1,4,5],", "is not JSON"),
    ("[]", r"non-empty JSON list of \[start, end, γ\] integer triples"),
    ('{"1": 5}', "integer triples"),
    ("[[1,4]]", "integer triples"),
    ("[[1,4,2.5]]", "integer triples"),
    ("[[1,4,true]]", "integer triples"),
    ("[[2,4,5]]", r"range \[2, 4, 5\] must start at batch size 1"),
    ("[[1,4,5],[6,8,3]]", r"range \[6, 8, 3\] leaves batch sizes 5..5 without a γ"),
    ("[[1,4,5],[3,8,3]]", r"range \[3, 8, 3\] overlaps the range before \(it should start at 5\)"),
    ("[[1,4,5],[5,4,3]]", r"range \[5, 4, 3\] ends before it starts"),
    ("[[1,4,-1]]", "γ must be >= 0"),
])
def test_schedule_errors_name_the_flag(text, message):
    with pytest.raises(SpecopsError, match=message) as err:
        parse_gamma_schedule(text)
    assert str(err.value).startswith("--gamma-schedule") and "\n" not in str(err.value)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6)), min_size=1, max_size=6), st.integers(1, 80))
def test_every_batch_size_gets_the_gamma_of_its_range(widths, batch):
    ranges, start = [], 1
    for width, gamma in widths:
        ranges.append([start, start + width - 1, gamma])
        start += width
    schedule = parse_gamma_schedule(json.dumps(ranges))
    inside = [g for s, e, g in ranges if s <= batch <= e]
    assert gamma_at(schedule, batch) == (inside[0] if inside else ranges[-1][2])


def config_from_argv(argv: list[str]) -> EngineConfig:
    """The config ``specops serve`` builds from these flags."""
    params = typer.main.get_command(app).commands["serve"].make_context("serve", list(argv)).params
    return engine_config(**{k: params[k] for k in inspect.signature(engine_config).parameters})


def test_config_checks_and_flags_round_trip():
    cfg = EngineConfig(TARGET, draft=DRAFT, gamma=1, gamma_schedule="[[1,4,5],[5,64,3]]")
    assert cfg.gamma == 5 and cfg.gamma_schedule == ((1, 4, 5), (5, 64, 3))  # γ: the most drafts a round takes
    argv = cfg.validate().argv()
    assert argv[argv.index("--gamma") + 1] == "5" and argv[argv.index("--gamma-schedule") + 1] == "[[1,4,5],[5,64,3]]"
    assert config_from_argv(argv) == cfg
    assert config_from_argv(["--model", str(TARGET), "--draft", str(DRAFT), "--gamma", "2"]).gamma_schedule is None
    with pytest.raises(SpecopsError, match="--gamma-schedule fixes γ per batch size: it excludes --gamma auto"):
        config_from_argv([*argv, "--gamma", "auto"])
    with pytest.raises(SpecopsError, match="--gamma-schedule drafts up to 5 tokens per round: give --draft"):
        EngineConfig(TARGET, gamma_schedule="[[1,4,5],[5,64,3]]").validate()
    assert EngineConfig(TARGET, gamma_schedule="[[1,64,0]]").validate().gamma == 0  # never drafts: no draft needed
    embedded = BackendConfig(model=TARGET, draft=DRAFT, gamma_schedule=cfg.gamma_schedule, dtype="bf16")
    assert embedded.engine_config() == EngineConfig(TARGET, draft=DRAFT, dtype="bfloat16",
                                                    gamma_schedule=cfg.gamma_schedule)


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason=f"fixture not built: {FIXTURE}")
def test_each_round_drafts_the_schedules_gamma_for_its_batch_size():
    """Six requests of different lengths pass through batch sizes 6..1; a first one alone is admitted at γ = 0 and
    drafts later. Every prefill and round uses the schedule's γ for the running batch; outputs are plain decoding's."""
    from specops.inputs import query_prompt_ids

    schedule = ((1, 1, 0), (2, 3, 1), (4, 16, 3))
    plain = Engine.load(TARGET, max_batch=8, max_seq_len=512)
    queries = ["red running shoes under 80 dollars", "a laptop bag", "wireless earbuds with noise cancelling",
               "a blue kettle", "cheap office chair", "送給媽媽的保溫杯，一千元以內"]
    prompts = [query_prompt_ids(plain.tokenizer, q) for q in queries]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (40, 8, 14, 20, 26, 32)]
    expected = [o.token_ids for o in plain.generate(prompts, params)]

    eng = Engine.load(TARGET, DRAFT, gamma_schedule=schedule, max_batch=8, max_seq_len=512)
    assert eng.gamma == 3
    used = []  # (what, running batch size, γ)
    prefill, launch = eng.runner.prefill, eng.runner.launch

    def spy_prefill(slots, prompts, params, constraints=None, gamma=None):
        used.append(("prefill", len(eng.scheduler.running), gamma))
        return prefill(slots, prompts, params, constraints, gamma)

    def spy_launch(slots, mode, constraints=None, gamma=None):
        used.append(("round", len(slots), gamma))
        return launch(slots, mode, constraints, gamma)

    eng.runner.prefill, eng.runner.launch = spy_prefill, spy_launch
    done = {}
    eng.add_request("r0", prompts[0], params[0])
    for _ in range(3):  # alone: γ = 0 rounds
        eng.step()
    for i in range(1, len(prompts)):
        eng.add_request(f"r{i}", prompts[i], params[i])
    while eng.has_unfinished():
        done.update({so.request_id: so.output for so in eng.step() if so.finished})
    assert [done[f"r{i}"].token_ids for i in range(len(prompts))] == expected
    assert all(g == gamma_at(schedule, batch) for _, batch, g in used), used
    rounds = {(batch, g) for what, batch, g in used if what == "round"}
    assert {b for b, _ in rounds} == set(range(1, 7)) and {g for _, g in rounds} == {0, 1, 3}
    assert ("prefill", 1, 0) in used and ("prefill", 6, 3) in used
    assert eng.stats.num_accepted_tokens > 0


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason=f"fixture not built: {FIXTURE}")
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rounds_run_as_graphs_run_them_change_no_output(temperature):
    """On CUDA every round replays a graph that reads each row's number of drafts on the device, also when γ has
    just switched and rows hold different numbers. Forcing that path on every round here (the CPU runs the same
    round eagerly) changes no token, greedy or sampled, through a schedule that switches γ as requests join a
    first one running alone (its rows then hold 5 drafts, theirs 3) and as the batch drains."""
    from specops.inputs import query_prompt_ids

    schedule = ((1, 1, 5), (2, 3, 1), (4, 16, 3))
    queries = ["red running shoes under 80 dollars", "a laptop bag", "wireless earbuds with noise cancelling",
               "a blue kettle", "cheap office chair", "送給媽媽的保溫杯，一千元以內"]

    def run(as_graphs: bool):
        eng = Engine.load(TARGET, DRAFT, gamma_schedule=schedule, max_batch=8, max_seq_len=512)
        ragged = []
        if as_graphs:
            round_ = eng.runner._round

            def every_round_ragged(b, mode, w, g, ragged_=False, *rest):
                ragged.append(ragged_)
                return round_(b, mode, w, g, True, *rest)

            eng.runner._round = every_round_ragged
        prompts = [query_prompt_ids(eng.tokenizer, q) for q in queries]
        params = [SamplingParams(temperature=temperature, max_tokens=n, seed=7 + n) for n in (40, 8, 14, 20, 26, 32)]
        done = {}
        eng.add_request("r0", prompts[0], params[0])
        for _ in range(2):
            eng.step()
        for i in range(1, len(prompts)):
            eng.add_request(f"r{i}", prompts[i], params[i])
        while eng.has_unfinished():
            done.update({so.request_id: so.output.token_ids for so in eng.step() if so.finished})
        counters = (eng.stats.num_drafts, eng.stats.num_draft_tokens, eng.stats.num_accepted_tokens)
        return [done[f"r{i}"] for i in range(len(prompts))], counters, ragged

    expected, expected_counters, _ = run(False)
    got, counters, ragged = run(True)
    assert got == expected and counters == expected_counters  # the same drafts kept, not only the same tokens
    assert True in ragged and False in ragged  # rounds after a switch were ragged, the others uniform


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason=f"fixture not built: {FIXTURE}")
def test_a_running_engine_switches_schedules_between_requests_and_under_way():
    """``use_gamma_schedule``, as one server measures γ tables side by side: each round then drafts the new table's
    γ, also for requests admitted under the old one (their drafts are verified first), and no output changes."""
    from specops.inputs import query_prompt_ids

    queries = ["red running shoes under 80 dollars", "a laptop bag", "wireless earbuds with noise cancelling"]
    plain = Engine.load(TARGET, max_batch=4, max_seq_len=512)
    prompts = [query_prompt_ids(plain.tokenizer, q) for q in queries]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    expected = [o.token_ids for o in plain.generate(prompts, params)]

    eng = Engine.load(TARGET, DRAFT, gamma=3, max_batch=4, max_seq_len=512)
    drafted = []
    launch = eng.runner.launch
    eng.runner.launch = lambda slots, mode, constraints=None, gamma=None: (
        drafted.append(gamma), launch(slots, mode, constraints, gamma))[1]
    for schedule in ([[1, 4, 1]], [[1, 1, 3], [2, 4, 2]], [[1, 4, 3]]):
        eng.use_gamma_schedule(schedule)
        drafted.clear()
        assert [o.token_ids for o in eng.generate(prompts, params)] == expected
        assert set(drafted) <= {g for *_, g in schedule} and drafted
    for i, p in enumerate(prompts):  # switched with requests in flight
        eng.add_request(f"r{i}", p, params)
    done = {}
    for step in range(400):
        if step == 3:
            eng.use_gamma_schedule([[1, 4, 1]])
            drafted.clear()
        done.update({so.request_id: so.output.token_ids for so in eng.step() if so.finished})
        if not eng.has_unfinished():
            break
    assert [done[f"r{i}"] for i in range(len(prompts))] == expected and set(drafted) == {1}
    with pytest.raises(SpecopsError, match="more than this engine's γ = 3"):
        eng.use_gamma_schedule([[1, 4, 5]])
    with pytest.raises(SpecopsError, match="--gamma-schedule"):
        eng.use_gamma_schedule([[2, 4, 1]])
    with pytest.raises(SpecopsError, match="no draft model"):
        plain.use_gamma_schedule([[1, 4, 1]])
