"""train-draft end to end on a seeded random tiny target: layout, report, resume after interruption, bad input."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specops.errors import SpecopsError
from specops.fixtures.drafts import general_records
from specops.models.eagle3 import Eagle3Draft
from specops.models.llama import LlamaConfig
from specops.models.target import load_target
from specops.training import data, pipeline
from specops.training.cli import app
from specops.training.train import TrainConfig


def make_target(out: Path, layers: int = 8, hidden: int = 32, seed: int = 0) -> Path:
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    from specops.fixtures import corpus
    from specops.fixtures import recipe as fixtures
    from specops.fixtures import tokenizer as tok_lib

    tok = tok_lib.train(corpus.documents(300, seed=0), 400)
    cfg = HFConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                   max_position_embeddings=256, tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
                   bos_token_id=tok.token_to_id(tok_lib.BOS), eos_token_id=tok.token_to_id(tok_lib.EOT),
                   pad_token_id=tok.token_to_id(tok_lib.PAD))
    torch.manual_seed(seed)
    fixtures.save_model(LlamaForCausalLM(cfg), tok, replace(fixtures.QUICK, max_positions=256), out)
    return out



@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Fixed thread count: deterministic, and tiny models only slow down on shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return make_target(tmp_path_factory.mktemp("target") / "tiny")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in general_records(40, seed=5)]
    path.write_text("\n".join(lines + ["not json", '{"other": 1}']) + "\n", encoding="utf-8")
    return path


def job(target: Path, out: Path, source: pipeline.Source, **kw) -> pipeline.Job:
    train = TrainConfig(epochs=2, batch_size=8, ttt_steps=2, checkpoint_every=2, seed=3)
    return pipeline.Job(**{"target": target, "out": out, "source": source, "draft_vocab_size": 64,
                           "max_new_tokens": 10, "eval_prompts": 4, "train": train, **kw})


@pytest.fixture(scope="module")
def baseline(target, prompts_file, tmp_path_factory) -> tuple[Path, dict]:
    """One uninterrupted run the other tests compare against."""
    out = tmp_path_factory.mktemp("baseline") / "draft"
    return out, pipeline.run(job(target, out, pipeline.Source("file", str(prompts_file))))


def test_writes_a_loadable_draft_with_report(target, prompts_file, baseline):
    out, report = baseline
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "train_report.json"]
    assert not (out.parent / ".draft.partial").exists()
    p = report["prompts"]
    assert (p["source"], p["heldout"], p["skipped_lines"]) == (f"prompts from {prompts_file}", 4, 2)
    assert p["train"] + p["heldout"] <= 40 and p["train"] == report["data"]["examples"] > 20
    assert json.loads((out / "train_report.json").read_text()) == report
    after = report["acceptance"]["after"]
    assert after["prompts"] == 4 and after["num_drafts"] > 0 and 1.0 <= after["mean_acceptance_length"] <= 4.0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
    model, _ = load_target(target)
    draft = Eagle3Draft.load(out, model)
    assert int(draft.t2d.sum()) == 64 and report["target"] == os.path.relpath(target.resolve(), out.resolve())


def stop_at(job_: pipeline.Job, stage: str, step: int) -> None:
    """Run ``job_`` until its progress reports ``step`` of ``stage``, and stop it there as Ctrl-C would."""

    def stop(name, done, total, fields):
        if name == stage and done == step:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipeline.run(job_, stop)


def test_interrupted_run_resumes_to_the_same_weights(target, prompts_file, baseline, tmp_path):
    source = pipeline.Source("file", str(prompts_file))
    out = tmp_path / "b"
    stop_at(job(target, out, source), "train", 3)
    partial = tmp_path / ".b.partial"
    assert not out.exists() and (partial / "train.pt").is_file()
    shards = {p.name: p.stat().st_mtime_ns for p in (partial / "data").glob("*-*")}
    assert any(n.startswith("answers-") for n in shards) and any(n.startswith("features-") for n in shards)

    seen = {}

    def record_shards(stage, done, total, fields):
        if stage == "train" and not seen:
            seen.update({p.name: p.stat().st_mtime_ns for p in (partial / "data").glob("*-*")})

    report = pipeline.run(job(target, out, source), record_shards)
    assert seen == shards  # finished shards were reused, not rewritten
    assert report["training"]["resumed_at"] == 2
    assert (out / "model.safetensors").read_bytes() == (baseline[0] / "model.safetensors").read_bytes()


def test_a_run_stopped_after_training_reports_the_training_it_resumed_from(target, prompts_file, baseline, tmp_path):
    """Stopped in its evaluation, the next call trains nothing and still reports the loss and accuracy of the last
    tenth of the steps, as the uninterrupted run does."""
    source = pipeline.Source("file", str(prompts_file))
    out = tmp_path / "e"
    stop_at(job(target, out, source), "evaluate", 1)
    report = pipeline.run(job(target, out, source))
    done = baseline[1]["training"]
    assert report["training"]["resumed_at"] == done["steps"]
    assert report["training"]["final_loss"] == pytest.approx(done["final_loss"])
    assert report["training"]["step_accuracy"] == pytest.approx(done["step_accuracy"])
    assert done["final_loss"] > 0


def test_online_training_matches_the_cached_data_path(target, prompts_file, baseline, tmp_path):
    online = pipeline.run(job(target, tmp_path / "o", pipeline.Source("file", str(prompts_file)), online=True))
    assert online["data"]["mode"] == "online"
    # Cached features are bf16-rounded, online ones are not: same run otherwise, so close but not bit-equal.
    assert online["training"]["final_loss"] == pytest.approx(baseline[1]["training"]["final_loss"], rel=0.05)


def test_fine_tuning_an_init_draft_reports_before_and_after(target, prompts_file, baseline, tmp_path):
    source = pipeline.Source("file", str(prompts_file))
    report = pipeline.run(job(target, tmp_path / "second", source, init=baseline[0], draft_vocab_size=None))
    assert report["init"] == os.path.relpath(baseline[0].resolve(), (tmp_path / "second").resolve())
    assert report["draft_vocab_size"] == 64
    assert report["acceptance"]["before"] == baseline[1]["acceptance"]["after"]  # same draft, same prompts
    assert "before (the `--init` draft)" in (tmp_path / "second" / "README.md").read_text()


# -- bad input ----------------------------------------------------------------------------------------------------


def test_target_without_the_tapped_layers(tmp_path, prompts_file):
    shallow = make_target(tmp_path / "shallow", layers=4)
    with pytest.raises(SpecopsError, match="three distinct target layers"):
        pipeline.run(job(shallow, tmp_path / "d", pipeline.Source("file", str(prompts_file))))


def test_prompts_file_without_usable_lines(target, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"neither": "key"}\n["a list"]\n{"query": ""}\n\n', encoding="utf-8")
    with pytest.raises(SpecopsError, match=r"no usable requests \(4 lines skipped"):
        pipeline.run(job(target, tmp_path / "d", pipeline.Source("file", str(bad))))


def test_init_draft_that_does_not_fit(target, prompts_file, tmp_path):
    other = LlamaConfig.from_dict({**json.loads((target / "config.json").read_text()), "hidden_size": 64})
    Eagle3Draft.random(other, draft_vocab_size=50).save(tmp_path / "wide")
    with pytest.raises(SpecopsError, match="--init draft does not fit the target: .*hidden size"):
        pipeline.run(job(target, tmp_path / "d", pipeline.Source("file", str(prompts_file)), init=tmp_path / "wide"))


def test_out_that_is_not_a_draft_is_never_replaced(target, prompts_file, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(SpecopsError, match="not an EAGLE-3 draft directory"):
        pipeline.run(job(target, tmp_path / "notes", pipeline.Source("file", str(prompts_file))))
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_full_disk_while_caching(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    cache = data.ShardCache(tmp_path / "cache", "k")
    path = cache.path("features", 0, ".safetensors")
    os.symlink("/dev/full", path.with_name(path.name + ".tmp"))  # the kernel answers ENOSPC to every write
    with pytest.raises(SpecopsError, match="disk full while caching training data"):
        cache.write_tensors(path, {"taps": torch.zeros(4096, 8)})
    assert not path.exists()


def test_cli_needs_exactly_one_prompt_source(target, tmp_path):
    result = CliRunner().invoke(app, ["--target", str(target), "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert result.output.strip() == "error: give exactly one of --prompts FILE.jsonl or --synthetic N"


def test_a_sigkilled_train_draft_resumes_to_the_same_weights(target, prompts_file, tmp_path):
    """`specops train-draft` killed with SIGKILL as soon as its first checkpoint exists, then run again: the draft
    equals an uninterrupted run's, byte for byte, and nothing of the partial state is left."""
    import signal
    import subprocess
    import sys
    import time

    def argv(out: Path) -> list[str]:
        return [sys.executable, "-m", "specops", "train-draft", "--target", str(target), "--out", str(out),
                "--prompts", str(prompts_file), "--draft-vocab-size", "64", "--max-new-tokens", "10",
                "--eval-prompts", "4", "--epochs", "20", "--batch-size", "8", "--ttt-steps", "2",
                "--checkpoint-every", "2", "--seed", "3"]

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    whole = subprocess.run(argv(tmp_path / "whole"), env=env, capture_output=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]

    out = tmp_path / "killed"
    proc = subprocess.Popen(argv(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / ".killed.partial" / "train.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and checkpoint.exists() and not out.exists()  # killed mid-training

    again = subprocess.run(argv(out), env=env, capture_output=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    report = json.loads((out / "train_report.json").read_text())
    assert report["training"]["resumed_at"] > 0
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert not (tmp_path / ".killed.partial").exists()
