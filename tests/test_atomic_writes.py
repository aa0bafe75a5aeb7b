"""A full disk while writing a result, a model or a checkpoint leaves the previous file intact and nothing beside
it. The disk fills for real: the writes run in a child process whose file-size limit (RLIMIT_FSIZE) the new version
exceeds, so the kernel refuses the write as a full disk would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    import torch
    from specops.errors import SpecopsError
    from specops.files import save_safetensors, write_json
    from specops.training.train import save_checkpoint

    kind, folder = sys.argv[1], Path(sys.argv[2])
    small, big = 1_000, 400_000  # elements: the first version fits under the limit, the second does not

    def write(n):
        if kind == "json":
            write_json(folder / "result.json", {"values": list(range(n))})
        elif kind == "safetensors":
            save_safetensors({"w": torch.arange(n, dtype=torch.float32)}, folder / "model.safetensors")
        else:
            draft = torch.nn.Linear(n // 100, 100)
            save_checkpoint(folder / "train.pt", 7, draft, torch.optim.AdamW(draft.parameters()), "key")

    write(small)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write then fails with EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        write(big)
    except SpecopsError as e:
        print("refused:", e)
    else:
        print("written")
""")


@pytest.mark.parametrize("kind,name", [("json", "result.json"), ("safetensors", "model.safetensors"),
                                       ("checkpoint", "train.pt")])
def test_a_full_disk_leaves_the_previous_version(tmp_path, kind, name):
    run = subprocess.run([sys.executable, "-c", CHILD, kind, str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("refused: cannot write") and "unchanged" in run.stdout, run.stdout
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left beside it
    path = tmp_path / name
    if kind == "json":
        import json

        assert json.loads(path.read_text()) == {"values": list(range(1_000))}
    elif kind == "safetensors":
        from safetensors.torch import load_file

        assert load_file(str(path))["w"].numel() == 1_000
    else:
        import torch

        assert torch.load(path, weights_only=True)["step"] == 7
