"""Held-in evaluation under the original protocol: bare environment, official checker, greedy decoding.

No interface, no cue, no changed observation: `Episode` as the benchmark defines it. Every policy goes
through the same path (`evaluate`), models and scripted policies alike, so a scripted ground-truth
replay scoring 100% and an untrained tiny model scoring 0% test the very code that scores real models.
Work is saved task group by task group; a stopped evaluation resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from seal_mini.config import CATEGORIES, Config, ConfigError, OodConfig, load_config
from seal_mini.distributed import check_same, from_rank0, is_main, run_lock, world_size
from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import POLICIES
from seal_mini.evaluation.agents import ModelAgent, ScriptedAgent, eval_identity, play_in_pieces
from seal_mini.runio import read_json, resume_pieces, write_json, write_jsonl_gz

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
    out_dir = Path(out_dir)
    partial = out_dir / f"{tag}.partial"
    identity = eval_identity(agent, cfg, source, [t.id for t in tasks])
    done_rows = from_rank0(resume_pieces, partial, identity)  # resume: the pieces already finished
    done_ids = {r["task_id"] for r in done_rows}
    todo = [t for t in tasks if t.id not in done_ids]
    from tqdm import tqdm

    bar = tqdm(
        total=len(tasks), initial=len(tasks) - len(todo), desc=f"eval {tag}", disable=not progress or not is_main()
    )
    piece = chunk_size * world_size()  # each rank plays chunk_size episodes of a piece at once
    done_rows = play_in_pieces(
        todo,
        piece,
        lambda share: play_tasks(agent, share, bar),
        done_rows,
        lambda n: partial / f"{n:06d}.jsonl.gz",
        bar,
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
        "label_counts": _label_counts(rows),
    }
    if is_main():
        write_jsonl_gz(out_dir / f"{tag}.trajectories.jsonl.gz", rows)
        write_json(out_dir / f"{tag}.json", result)
        shutil.rmtree(partial)
    return result


def play_tasks(agent, tasks: list[Task], progress=None) -> list[dict]:
    """`agent` on each task in the bare environment, scored by the official checker: one row per task."""
    from seal_mini.core.diagnose import diagnose
    from seal_mini.envs.verifier import check_episode

    envs = [Episode(t) for t in tasks]  # BFCL's own limits: env.* shape training episodes only
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


def _label_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        for z in r["labels"]:
            counts[z] = counts.get(z, 0) + 1
    return counts


def eval_tasks(cfg: Config, ids_file: str | None = None) -> list[Task]:
    """The ids to evaluate: an explicit id list file, or the run's split side (eval.split)."""
    from seal_mini.envs.splits import load_split, pick, tasks_for

    if ids_file:
        path = Path(ids_file)
        if not path.is_file():
            raise ConfigError(f"--ids {ids_file}: no such file (a JSON list of task ids)")
        ids = read_json(path, fix="give a JSON list of task ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise ConfigError(f"--ids {ids_file}: expected a JSON list of one or more task ids, got {str(ids)[:80]}")
        return tasks_for(ids, f"--ids {ids_file}")
    split = load_split(cfg)
    ids = split["train"] + split["eval"] if cfg.eval.split == "all" else split[cfg.eval.split]
    return pick(ids, cfg.data.max_eval_tasks)


def print_table(result: dict) -> None:
    cells = " | ".join(f"{k} {100 * v:.2f}%" for k, v in result["success"].items())
    print(f"[eval] {result['tag']} ({result['policy']}, {result['n_tasks']} tasks): {cells}")


def main(argv: list[str]) -> int:
    from seal_mini.evaluation.suites import SUITES, check_suites

    parser = argparse.ArgumentParser(
        prog="python -m seal_mini eval", description="held-in BFCL V3 evaluation, or an out-of-distribution suite"
    )
    parser.add_argument("recipe", nargs="?", help="recipes/X.yaml (model, limits, split); default: built-in defaults")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument("--adapter", help="a trained adapter folder (e.g. runs/NAME/adapter)")
    parser.add_argument("--scripted", help="evaluate a scripted policy instead of a model: " + ", ".join(POLICIES))
    parser.add_argument("--ids", help="a JSON list of task ids instead of the split")
    parser.add_argument(
        "--tag",
        default="",
        help="name of the result files (default: base / adapter, as report reads them; the scripted policy)",
    )
    parser.add_argument("--suite", choices=["bfcl_v3", *SUITES], default="bfcl_v3", help="what to evaluate on")
    domains = [f"{s.name}: {','.join(getattr(OodConfig(), s.domains))}" for s in SUITES.values() if s.domains]
    parser.add_argument("--domains", help=f"{'; '.join(domains)} (default: the recipe's ood)")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.recipe and "=" in args.recipe and not args.recipe.endswith((".yaml", ".yml")):
        args.overrides, args.recipe = [args.recipe, *args.overrides], None  # only overrides were given
    cfg = load_config(args.recipe, args.overrides)
    check_suites(cfg, imports=False)  # the recipe's ood.suites are known ones (their extras matter to the pipeline)
    check_same("settings", {"config": cfg.to_dict(), "args": vars(args)})  # several ranks: one evaluation
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):
        return suite_main(args, cfg) if args.suite != "bfcl_v3" else held_in_main(args, cfg)


def held_in_main(args, cfg: Config) -> int:
    """`eval`: held-in BFCL V3 for the backbone, an adapter or a scripted policy."""
    tasks = eval_tasks(cfg, args.ids)
    out_dir = cfg.run_dir / "eval"
    results = []
    if args.scripted:
        results.append(evaluate(ScriptedAgent(args.scripted), tasks, cfg, out_dir, args.tag or args.scripted))
    else:
        policy = load_policy_for(cfg, args.adapter)
        if cfg.eval.base_model or not args.adapter:
            tag = args.tag or "base"
            results.append(evaluate(ModelAgent(policy, cfg, adapter=False), tasks, cfg, out_dir, tag, source="base"))
        if args.adapter:
            tag = f"{args.tag}_adapter" if args.tag else "adapter"
            adapter = ModelAgent(policy, cfg, adapter=True)
            results.append(evaluate(adapter, tasks, cfg, out_dir, tag, source=f"adapter {args.adapter}"))
    for result in results:
        print_table(result)
    print(json.dumps({r["tag"]: r["success"] for r in results}))
    return 0


def load_policy_for(cfg: Config, adapter: str | None):
    """The recipe's model, with a trained adapter folder if one is given."""
    from seal_mini.engine.policy import load_policy

    if adapter:
        if not Path(adapter).is_dir():
            raise ConfigError(f"--adapter {adapter}: no such folder")
        cfg.lora.adapter_path = adapter  # its files are checked before peft reads them (policy.checked_adapter)
    return load_policy(cfg)


def suite_main(args, cfg: Config) -> int:
    """`eval --suite S`: an out-of-distribution suite for the backbone, an adapter or a scripted policy."""
    from seal_mini.evaluation.suites import SUITES, print_suite, run_suite

    suite = args.suite
    if args.ids:
        raise ConfigError(f"--ids applies to bfcl_v3 only; for {suite} use ood.max_tasks=N")
    if args.domains:
        if not SUITES[suite].domains:
            raise ConfigError(f"--domains does not apply to {suite}")
        setattr(cfg.ood, SUITES[suite].domains, [d.strip() for d in args.domains.split(",") if d.strip()])
        cfg.validate()
    out_dir = cfg.run_dir / "eval"
    results = []
    if args.scripted:
        agent = SUITES[suite].scripted(args.scripted)
        results.append(run_suite(suite, agent, cfg, out_dir, args.tag or f"{suite}_scripted_{args.scripted}"))
    else:
        policy = load_policy_for(cfg, args.adapter)
        if cfg.eval.base_model or not args.adapter:
            agent = ModelAgent(policy, cfg, adapter=False)
            results.append(run_suite(suite, agent, cfg, out_dir, args.tag or f"{suite}_base", source="base"))
        if args.adapter:
            agent = ModelAgent(policy, cfg, adapter=True)
            tag = f"{args.tag}_adapter" if args.tag else f"{suite}_adapter"
            results.append(run_suite(suite, agent, cfg, out_dir, tag, source=f"adapter {args.adapter}"))
    for result in results:
        print_suite(result)
    print(json.dumps({r["tag"]: {"scores": r["scores"], "mean": r["mean"]} for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
