import json

from typer.testing import CliRunner

from specops.task import prompt
from specops.task.cli import app

runner = CliRunner()


def test_synth_then_score(tmp_path):
    gold = tmp_path / "gold.jsonl"
    r = runner.invoke(app, ["synth", "--n", "30", "--seed", "4", "--lang", "en,zh-TW", "--out", str(gold)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in gold.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 30 and {row["lang"] for row in rows} == {"en", "zh-TW"}

    pred = tmp_path / "pred.jsonl"
    lines = [{"id": row["id"], "text": prompt.format_answer(row["gold"]) if i % 2 else "oops"}
             for i, row in enumerate(rows[:20])]
    pred.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    out = tmp_path / "report.json"
    r = runner.invoke(app, ["score", "--pred", str(pred), "--gold", str(gold), "--json-out", str(out)])
    assert r.exit_code == 0, r.output
    assert "macro F1" in r.output and "free_shipping" in r.output
    report = json.loads(out.read_text())
    assert report["n"] == 30 and report["missing"] == 10
    assert report["exact_match"] == 10 / 30 and report["parse_rate"] == 10 / 30


def test_errors_are_one_line_with_exit_code_2(tmp_path):
    gold = tmp_path / "gold.jsonl"
    runner.invoke(app, ["synth", "--n", "3", "--out", str(gold)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    stranger = tmp_path / "stranger.jsonl"
    stranger.write_text(json.dumps({"id": "nope", "text": "{}"}) + "\n", encoding="utf-8")
    cases = [
        ["score", "--pred", str(tmp_path / "missing.jsonl"), "--gold", str(gold)],
        ["score", "--pred", str(bad), "--gold", str(gold)],
        ["score", "--pred", str(gold), "--gold", str(bad)],
        ["score", "--pred", str(stranger), "--gold", str(gold)],
        ["synth", "--n", "3", "--lang", "fr", "--out", str(tmp_path / "x.jsonl")],
    ]
    for args in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.strip().startswith("error:") and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1
