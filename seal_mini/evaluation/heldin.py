"""Held-in evaluation under the original protocol: bare environment, official checker, greedy decoding.

No interface, no cue, no changed observation: `Episode` as the benchmark defines it. Every policy goes
through the same path (`evaluate`), models and scripted policies alike, so a scripted ground-truth
replay scoring 100% and an untrained tiny model scoring 0% test the very code that scores real models.
Work is saved task group by task group; a stopped evaluation resumes where it stopped. The `eval` command
is seal_mini/programs/eval.py.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

from seal_mini.config import CATEGORIES, EVAL_LIMITS, Config, ConfigError
from seal_mini.core.diagnose import diagnose
from seal_mini.distributed import from_rank0
from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import PROTOCOLS, QWEN_FC, Protocol
from seal_mini.envs.splits import load_split, pick, split_name, tasks_for
from seal_mini.envs.verifier import CHECKER_RAISED, check_episode
from seal_mini.evaluation.agents import ModelAgent, eval_identity, play_in_pieces, save_result
from seal_mini.runio import read_json, resume_pieces

CHUNK = 32
"""Tasks per saved piece of work."""


def success_table(rows: list[dict]) -> dict[str, float]:
    """Success rate per category and their mean (the paper's average over the four categories)."""
    table = {}
    for category in CATEGORIES:
        rewards = [r["reward"] for r in rows if r["category"] == category]
        if rewards:
            table[category] = sum(rewards) / len(rewards)
    table["mean"] = sum(table.values()) / len(table) if table else 0.0
    return table


def evaluate(
    agent,
    tasks: list[Task],
    cfg: Config,
    out_dir: Path,
    tag: str,
    progress: bool = True,
    chunk_size: int = CHUNK,
    source: str = "",
) -> dict:
    """Run `agent` on `tasks` in the bare environment; writes <out_dir>/<tag>.json and trajectories.

    `source` says what made the policy (e.g. which adapter); pieces of a stopped evaluation are reused
    only by an evaluation with the same identity (eval_identity: policy, adapter, tasks, settings).
    Under torchrun each rank plays its share of every piece; rank 0 writes, every rank gets the result."""
    cfg = heldin_config(cfg)
    if isinstance(agent, ModelAgent):  # the held-in limits, not training's
        agent = agent.with_config(cfg)
    out_dir = Path(out_dir)
    partial = out_dir / f"{tag}.partial"
    identity = eval_identity(agent, cfg, source, [t.id for t in tasks])
    done_rows = from_rank0(resume_pieces, partial, identity)  # resume: the pieces already finished
    done_ids = {r["task_id"] for r in done_rows}
    todo = [t for t in tasks if t.id not in done_ids]
    done_rows = play_in_pieces(
        todo,
        chunk_size,
        lambda share, bar: play_tasks(agent, share, bar, PROTOCOLS[cfg.model.protocol]),
        done_rows,
        lambda n: partial / f"{n:06d}.jsonl.gz",
        f"eval {tag}",
        progress,
    )

    by_id = {r["task_id"]: r for r in done_rows}
    rows = [by_id[t.id] for t in tasks]
    result = {
        "tag": tag,
        "policy": agent.name,
        "source": source,
        "n_tasks": len(rows),
        "success": success_table(rows),
        "passed": {c: sum(r["reward"] for r in rows if r["category"] == c) for c in CATEGORIES},
        "total": {c: sum(1 for r in rows if r["category"] == c) for c in CATEGORIES},
        "label_counts": dict(Counter(z for r in rows for z in r["labels"])),
        "split": split_name(cfg),
        "limits": {k: getattr(cfg.rollout, k) for k in EVAL_LIMITS},
        # episodes a token limit cut: a message cut short, or the episode ended (a first prompt over the limit
        # included: never played), per category
        "cut": {
            c: sum(bool(r.get("truncated") or r.get("n_cut")) for r in rows if r["category"] == c) for c in CATEGORIES
        },
        "checker_raised": sum(r["error_type"] == CHECKER_RAISED for r in rows),  # failed, the run went on
    }
    return save_result(out_dir, tag, rows, result)


def heldin_config(cfg: Config) -> Config:
    """A copy of cfg whose rollout limits are held-in evaluation's (eval.limits)."""
    cfg = copy.deepcopy(cfg)
    if cfg.eval.limits == "paper":
        for key, value in EVAL_LIMITS.items():
            larger = getattr(cfg.rollout, key) if key in ("max_prompt_tokens", "max_total_tokens") else 0
            setattr(cfg.rollout, key, max(value, larger))
        cfg.validate()
    return cfg


def play_tasks(agent, tasks: list[Task], progress=None, protocol: Protocol = QWEN_FC) -> list[dict]:
    """`agent` on each task in the bare environment (following `protocol`'s BFCL handler), scored by the
    official checker: one row per task."""
    envs = [Episode(t, protocol=protocol) for t in tasks]  # BFCL's own limits: env.* shape training episodes only
    records = agent.run(envs, progress=progress) if envs else []  # the bar moves as each episode finishes
    rows = []
    for task, env, record in zip(tasks, envs, records, strict=True):
        verdict = check_episode(env)
        rows.append(
            {
                "task_id": task.id,
                "category": task.category,
                "reward": verdict.reward,
                "error_type": verdict.error_type,
                "failed_turn": verdict.failed_turn,
                "labels": diagnose(env, verdict),
                **record,
            }
        )
    return rows


def eval_tasks(cfg: Config, ids_file: str | None = None) -> list[Task]:
    """The ids to evaluate: an explicit id list file, or the run's split side (eval.split)."""
    split = load_split(cfg)  # a tasks world's ids are known from here on
    if ids_file:
        path = Path(ids_file)
        if not path.is_file():
            raise ConfigError(f"--ids {ids_file}: no such file (a JSON list of task ids)")
        ids = read_json(path, fix="give a JSON list of task ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise ConfigError(f"--ids {ids_file}: expected a JSON list of one or more task ids, got {str(ids)[:80]}")
        return tasks_for(ids, f"--ids {ids_file}")
    ids = split["train"] + split["eval"] if cfg.eval.split == "all" else split[cfg.eval.split]
    return pick(ids, cfg.data.max_eval_tasks)


def print_table(result: dict) -> None:
    """One line: the success rate per category and their mean."""
    cells = " | ".join(f"{k} {100 * v:.2f}%" for k, v in result["success"].items())
    print(f"[eval] {result['tag']} ({result['policy']}, {result['n_tasks']} tasks): {cells}")
