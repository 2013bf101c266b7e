"""A run directory as Hugging Face datasets: every rollout, every turn label, every evaluated episode.

    from seal_mini.programs import dataset
    ds = dataset.load("runs/qwen2_5_3b_seal")     # a datasets.DatasetDict derived from the run's files
    ds["trajectories"].to_pandas().groupby("step").reward.mean()
    ds["turns"].filter(lambda r: r["label"] == "state_mismatch")

`python -m seal_mini dataset RUN_DIR` writes the same tables as Parquet under RUN_DIR/datasets/, one file
per split, which `datasets.load_dataset("parquet", data_files="RUN_DIR/datasets/trajectories.parquet",
split="train")` (or pandas, or DuckDB) reads without seal_mini (one split per call: their columns differ). Nothing here is a second source of truth: the tables are
derived on demand from trajectories/*.jsonl.gz and eval/*.trajectories.jsonl.gz, the files training and
evaluation write.

Splits and their columns (`features()` below gives each column's type):
  trajectories  one row per training rollout: run, step, task_id, category, sample (0..G-1 within the
                task's group), reward (the checker's 0/1), error_type, labels and reasons (one per user
                turn), weight (w_j), advantage (w_j * A_j, what the update used), truncated, n_sampled,
                n_tokens, messages (role, content, name: the conversation as the model saw it, interface
                cues included).
  turns         one row per user turn of a training rollout: run, step, task_id, category, sample, turn,
                label, reason, reward, weight, advantage.
  eval          one row per held-in episode (bare benchmark): run, tag (base, adapter, step_NNNN, ...),
                task_id, category, reward, error_type, failed_turn, labels, truncated, n_sampled, messages.
  suites        one row per out-of-distribution episode: run, tag, suite, column, task_id, reward (empty
                for episodes that are not scored, such as BFCL V4 memory's prerequisite conversations),
                truncated, messages, details (the suite's own scoring fields, as JSON text).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from seal_mini.config import CATEGORIES, ConfigError, saved_config
from seal_mini.runio import missing_outputs, names, new_dir, read_json, read_jsonl_gz, run_lock

COLUMNS = {
    "trajectories": "run step task_id category sample reward error_type labels reasons weight advantage truncated "
    "n_sampled n_tokens messages",
    "turns": "run step task_id category sample turn label reason reward weight advantage",
    "eval": "run tag task_id category reward error_type failed_turn labels truncated n_sampled messages",
    "suites": "run tag suite column task_id reward truncated messages details",
}
"""The columns of every split, in order (what they hold: the module docstring)."""
SPLITS = tuple(COLUMNS)


def features() -> dict:
    """The column types of every split (datasets.Features), so empty runs and lists keep their types."""
    from datasets import Features, List, Value

    text = Value("string")
    types = {
        **dict.fromkeys(("step", "sample", "turn", "failed_turn", "n_sampled", "n_tokens"), Value("int64")),
        **dict.fromkeys(("reward", "weight", "advantage"), Value("float64")),
        "truncated": Value("bool"),
        "labels": List(text),
        "reasons": List(text),
        "messages": List({"role": text, "content": text, "name": text}),
    }  # every other column is text
    return {split: Features({c: types.get(c, text) for c in columns.split()}) for split, columns in COLUMNS.items()}


def _messages(messages: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": str(m.get("content", "")), "name": m.get("name")} for m in messages]


def _category(task_id: str) -> str:
    """The BFCL category in a task id (multi_turn_<category>_<index>); rows of older runs lack the field."""
    m = re.fullmatch(r"multi_turn_(.+)_\d+", task_id)
    return m.group(1) if m and m.group(1) in CATEGORIES else ""


def read_trajectories(run_dir: Path) -> list[dict]:
    """Every training rollout of a run, in step and then rollout order."""
    run_dir = Path(run_dir)
    # G of the run: rows of older runs do not record their sample index
    group_size = saved_config(run_dir).rollout.group_size if (run_dir / "config.yaml").exists() else 1
    rows = []
    for path in sorted((run_dir / "trajectories").glob("step_*.jsonl.gz")):
        step = int(path.name.split("_")[1].split(".")[0])
        for i, r in enumerate(read_jsonl_gz(path)):
            rows.append(
                {
                    "run": run_dir.name,
                    "step": step,
                    "task_id": r["task_id"],
                    "category": r.get("category") or _category(r["task_id"]),
                    "sample": r.get("sample", i % group_size),
                    "reward": r["reward"],
                    "error_type": r.get("error_type", ""),
                    "labels": r["labels"],
                    "reasons": r.get("reasons", []),
                    **{k: r[k] for k in ("weight", "advantage", "truncated", "n_sampled", "n_tokens")},
                    "messages": _messages(r["messages"]),
                }
            )
    return rows


def turn_rows(trajectories: list[dict]) -> list[dict]:
    """One row per user turn of each rollout (the diagnoser's label and its reason)."""
    rows = []
    for t in trajectories:
        reasons = t["reasons"] + [""] * (len(t["labels"]) - len(t["reasons"]))
        for turn, (label, reason) in enumerate(zip(t["labels"], reasons, strict=True)):
            rows.append(
                {
                    **{k: t[k] for k in ("run", "step", "task_id", "category", "sample")},
                    "turn": turn,
                    "label": label,
                    "reason": reason,
                    **{k: t[k] for k in ("reward", "weight", "advantage")},
                }
            )
    return rows


def eval_rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(held-in rows, suite rows) of every finished evaluation in the run directory."""
    run_dir = Path(run_dir)
    held_in, suites = [], []
    for result_path in sorted((run_dir / "eval").glob("*.json")):
        result = read_json(result_path)
        episodes = result_path.with_name(f"{result_path.stem}.trajectories.jsonl.gz")
        if not isinstance(result, dict) or not episodes.exists():
            continue
        tag = result.get("tag", result_path.stem)
        for r in read_jsonl_gz(episodes):
            common = {"run": run_dir.name, "tag": tag, "task_id": str(r.get("task_id", ""))}
            if "suite" in result:
                known = {"task_id", "column", "reward", "truncated", "messages"}
                suites.append(
                    {
                        **common,
                        "suite": result["suite"],
                        "column": r.get("column", ""),
                        "reward": None if r.get("reward") is None else float(r["reward"]),  # None: not scored
                        "truncated": bool(r.get("truncated", False)),
                        "messages": _messages(r.get("messages", [])),
                        "details": json.dumps({k: v for k, v in r.items() if k not in known}, default=str),
                    }
                )
            else:
                held_in.append(
                    {
                        **common,
                        "category": r.get("category") or _category(common["task_id"]),
                        "reward": r["reward"],
                        "error_type": r.get("error_type", ""),
                        "failed_turn": r.get("failed_turn"),
                        "labels": r.get("labels", []),
                        "truncated": r.get("truncated", False),
                        "n_sampled": r.get("n_sampled", 0),
                        "messages": _messages(r.get("messages", [])),
                    }
                )
    return held_in, suites


def require_run_dir(run_dir: Path) -> Path:
    if not (run_dir / "config.yaml").exists() and not (run_dir / "eval").is_dir():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml or eval/); give runs/<name>")
    return run_dir


def tables(run_dir: Path) -> dict[str, list[dict]]:
    """Every split of a run as plain rows (the lists the datasets are built from)."""
    run_dir = require_run_dir(Path(run_dir))
    missing = missing_outputs(run_dir)
    if missing:
        print(f"[dataset] warning: {run_dir} lacks {names(missing)}; the tables leave them out", file=sys.stderr)
    trajectories = read_trajectories(run_dir)
    held_in, suites = eval_rows(run_dir)
    return {"trajectories": trajectories, "turns": turn_rows(trajectories), "eval": held_in, "suites": suites}


def load(run_dir: str | Path):
    """A run directory as a datasets.DatasetDict with the splits in SPLITS (empty splits included)."""
    from datasets import Dataset, DatasetDict

    types = features()
    out = {}
    for split, rows in tables(Path(run_dir)).items():
        columns = {name: [r[name] for r in rows] for name in types[split]}  # column-wise: empty splits keep types
        out[split] = Dataset.from_dict(columns, features=types[split])
    return DatasetDict(out)


def write_parquet(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write every split as <out_dir>/<split>.parquet (default RUN_DIR/datasets), the folder replaced whole
    so a reader never sees half of it; returns the paths. A folder holding anything else is refused."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / "datasets"
    ours = {f"{split}.parquet" for split in SPLITS}
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; name a new or empty folder with --out (the file is left as it is)")
    if out_dir.is_dir() and not {p.name for p in out_dir.iterdir()} <= ours:
        raise ConfigError(f"{out_dir} holds files other than {sorted(ours)}; name a new or empty folder with --out")
    datasets = load(run_dir)
    with new_dir(out_dir) as tmp:
        for split, dataset in datasets.items():
            dataset.to_parquet(str(tmp / f"{split}.parquet"))
    return {split: out_dir / f"{split}.parquet" for split in datasets}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seal_mini dataset", description="write a run's rollouts, labels and evaluations as Parquet"
    )
    parser.add_argument("run_dir", help="runs/<name>")
    parser.add_argument("--out", help="folder for the .parquet files (default RUN_DIR/datasets)")
    args = parser.parse_args(argv)
    with run_lock(require_run_dir(Path(args.run_dir)), " ".join([parser.prog, *argv])):  # not while it is written
        paths = write_parquet(args.run_dir, args.out)
    for split, path in paths.items():
        print(f"{split:<13} {path}")
    print(json.dumps({split: str(path) for split, path in paths.items()}))
    return 0
