"""Files every layer reads and writes: JSON, JSON Lines and safetensors, with one error for a bad file.

Written files are stable (sorted keys, fixed metadata) so that rebuilding anything gives byte-identical files,
world-readable, since a saved model is shared data that servers running as other users load, and whole: each is
written beside its place and renamed over it, so a full disk or a kill mid-write leaves the previous version.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Literal

from specops.errors import SpecopsError


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecopsError(f"cannot read {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecopsError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise SpecopsError(f"{path}: not valid JSON ({e.msg})") from None


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: a hidden sibling file, flushed to disk, then renamed over ``path``. On
    failure the previous file is untouched and nothing is left beside it; a full disk is a SpecopsError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in _FULL:
            raise SpecopsError(f"cannot write {path}: {os.strerror(e.errno)} ({len(payload) / 1e6:.1f} MB); "
                               "the previous version, if any, is unchanged") from None
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Stable JSON on disk: sorted keys, UTF-8, two-space indent, trailing newline."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path, on_bad: Literal["raise", "skip"] = "raise") -> tuple[list[tuple[int, dict]], int]:
    """The JSON objects of a JSON Lines file with their line numbers, and how many lines were skipped.

    Blank lines are ignored. A line that is not a JSON object raises a SpecopsError naming ``path:line``, or with
    ``on_bad="skip"`` is counted and passed over; the caller checks what each object must hold.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecopsError(f"cannot read {path}: file not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecopsError(f"cannot read {path}: {e}") from None
    rows, skipped = [], 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            problem = None if isinstance(obj, dict) else "each line must be a JSON object"
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg})"
        if problem is None:
            rows.append((lineno, obj))
        elif on_bad == "skip":
            skipped += 1
        else:
            raise SpecopsError(f"{path}:{lineno}: {problem}")
    return rows, skipped


def save_safetensors(tensors: dict, path: str | Path) -> None:
    """Write ``tensors`` with sorted keys and fixed metadata (no timestamps), readable by every user."""
    from safetensors.torch import save

    write_atomic(path, save({k: tensors[k] for k in sorted(tensors)}, metadata={"format": "pt"}))
    Path(path).chmod(0o644)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a directory: the shards a ``model.safetensors.index.json`` lists, else every
    ``*.safetensors`` file."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index)["weight_map"].values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise SpecopsError(f"{model_dir}: shard(s) listed in the index are missing: {', '.join(missing)}")
        paths = [model_dir / f for f in files]
    else:
        paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise SpecopsError(f"{model_dir}: no *.safetensors weights found")
    return paths


def safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, read from the file's header alone, so a loader can check a checkpoint against its
    config before reading any weights. A file shorter than its header says (a copy or download cut off) or with
    no header at all is refused here, naming the file."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= size - 8:
            raise SpecopsError(f"{path}: truncated or not a safetensors file ({size} bytes, no complete header)")
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            shapes = {k: tuple(int(d) for d in v["shape"]) for k, v in header.items() if k != "__metadata__"}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise SpecopsError(f"{path}: truncated or not a safetensors file (its header is not safetensors JSON)") \
                from None
    needed = 8 + n + max(ends, default=0)
    if size < needed:
        raise SpecopsError(f"{path}: truncated ({size} bytes; its header describes {needed})")
    return shapes


def checkpoint_shapes(paths: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Every tensor of a checkpoint's files: its shape and the file that holds it (headers only)."""
    return {k: (shape, p) for p in paths for k, shape in safetensors_shapes(p).items()}


def check_shapes(found: dict[str, tuple[tuple[int, ...], Path]], expected: dict[str, tuple[int, ...]],
                 layout: str) -> None:
    """Refuse a checkpoint (``checkpoint_shapes``) whose tensor names or shapes are not ``expected``, the ones
    ``layout`` (the config that implies them, as the user knows it) calls for; the error names the file."""
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        files = sorted({str(p) for _, p in found.values()})
        where = files[0] if len(files) == 1 else f"{Path(files[0]).parent}/*.safetensors" if files else "the weights"
        parts = [f"{label} {len(names)} tensor(s) ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                 for label, names in (("missing", missing), ("unexpected", unexpected)) if names]
        raise SpecopsError(f"{where} does not match {layout}: {'; '.join(parts)}")
    for k, (shape, p) in sorted(found.items()):
        if shape != tuple(expected[k]):
            raise SpecopsError(f"{p}: {k} has shape {shape}, expected {tuple(expected[k])} from {layout}")


def load_safetensors(paths: list[Path]) -> dict:
    """All tensors of ``paths`` (checked with ``safetensors_shapes`` first, so only rarer damage surfaces here)."""
    from safetensors import safe_open

    tensors = {}
    for p in paths:
        try:
            with safe_open(str(p), framework="pt") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
            raise SpecopsError(f"{p}: not a readable safetensors file ({e})") from None
    return tensors
