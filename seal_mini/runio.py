"""The run directory: every file a report needs, each written atomically.

    <out_dir>/<name>/
      config.yaml             resolved config (what actually ran)
      split.json              train / eval task ids
      metrics.jsonl           one JSON line per training step (namespaced keys)
      rounds/step_NNNN.json   interface state, failure profile, rho and label counts of each round
      trajectories/step_NNNN.jsonl.gz   every training trajectory: messages, reward, labels, weight
      eval/<tag>.json         evaluation results (+ eval/<tag>.trajectories.jsonl.gz)
      checkpoint/             adapter, optimizer, scheduler, RNG states, loop state (latest step)
      report/                 report.md and its PNG plots

A crash can leave a *.tmp file behind but never a half-written file under its real name.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import yaml


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, flush to disk, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def write_yaml(path: Path, obj) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0))


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    """Rewrite metrics.jsonl whole (atomically); the loop keeps it short enough for that to be cheap."""
    atomic_write_text(Path(run_dir) / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def swap_in_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Replace `final_dir` by the fully written `tmp_dir`; the old copy survives until the new is in."""
    old = final_dir.with_name(final_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """checkpoint/, or checkpoint.old/ when a crash hit between the two renames of swap_in_dir."""
    for name in ("checkpoint", "checkpoint.old"):
        path = Path(run_dir) / name
        if (path / "state.json").exists():
            return path
    return None


def open_partial(partial: Path, identity: dict) -> bool:
    """The folder of a resumable job's finished pieces. Kept if it holds pieces of this very job (same
    identity: policy, tasks, settings), emptied otherwise; returns whether pieces were kept."""
    partial = Path(partial)
    marker = partial / "identity.json"
    resuming = marker.exists() and read_json(marker) == identity
    if not resuming:
        shutil.rmtree(partial, ignore_errors=True)  # another job's pieces are not ours to reuse
        write_json(marker, identity)
    return resuming
