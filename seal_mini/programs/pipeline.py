"""`bash run.sh RECIPE`: train -> evaluate (backbone and trained adapter, bare benchmark) -> report.

Evaluation is held-in BFCL V3, then each out-of-distribution suite the recipe names (ood.suites).

Re-running the same command after a stop continues where it stopped: training resumes from the last
checkpoint, evaluation from its last finished piece; finished work is never redone.

Under torchrun every rank runs this (seal_mini.distributed). Several recipes are independent runs: each
becomes its own pipeline process, placed on its own GPUs (seal_mini.programs.placement), its output in
<out_dir>/<name>.log.
"""

from __future__ import annotations

import argparse
import json
import sys

from seal_mini.config import ConfigError, load_config
from seal_mini.distributed import from_rank0, is_main, run_lock, world_size
from seal_mini.runio import FileError, read_json


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini pipeline", description="train, evaluate, report")
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("more", nargs="*", help="more recipes (each its own run, side by side), then key.sub=value")
    parser.add_argument("--restart", action="store_true", help="move what the run directory holds aside, start over")
    parser.add_argument(
        "--gpus-per-run", type=int, default=1, help="with several recipes: GPUs (ranks under torchrun) each run gets"
    )
    args = parser.parse_args(argv)
    is_recipe = [a.endswith((".yaml", ".yml")) and "=" not in a for a in args.more]  # base=x.yaml overrides
    recipes = [args.recipe] + [a for a, r in zip(args.more, is_recipe, strict=True) if r]
    overrides = [a for a, r in zip(args.more, is_recipe, strict=True) if not r]
    if len(recipes) > 1:
        return run_side_by_side(recipes, overrides, args.gpus_per_run, args.restart)
    cfg = load_config(args.recipe, overrides)
    from seal_mini.evaluation.suites import check_suites

    check_suites(cfg)  # a missing optional extra is an error now, not after training
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):
        return pipeline(cfg, args.restart)


def run_side_by_side(recipes: list[str], overrides: list[str], gpus_per_run: int, restart: bool) -> int:
    """Several recipes: each its own pipeline, on its own GPUs, as many at once as the GPUs allow
    (seal_mini.programs.placement); without a GPU one after another. Exit code 1 if any run failed."""
    from seal_mini.evaluation.suites import check_suites
    from seal_mini.programs.placement import Job, failure_report, launch_command, run_placed, visible_gpus

    if world_size() > 1:
        raise ConfigError("several recipes place their own runs on the GPUs; start them without torchrun")
    configs = [load_config(recipe, overrides) for recipe in recipes]
    seen: dict = {}
    for recipe, cfg in zip(recipes, configs, strict=True):
        if cfg.run_dir.resolve() in seen:
            raise ConfigError(
                f"{seen[cfg.run_dir.resolve()]} and {recipe} both run in {cfg.run_dir}; give each recipe its own name"
            )
        seen[cfg.run_dir.resolve()] = recipe
        check_suites(cfg)  # a missing optional extra is an error now, not after training
    options = ["--restart"] if restart else []
    jobs = [
        Job(
            cfg.name,
            launch_command(["pipeline", recipe, *overrides, *options], gpus_per_run),
            cfg.run_dir.parent / f"{cfg.name}.log",
        )
        for recipe, cfg in zip(recipes, configs, strict=True)
    ]
    outcomes = run_placed(jobs, visible_gpus(), gpus_per_run)
    failed = failure_report(outcomes)
    if failed:
        print(failed, file=sys.stderr)
    print(
        json.dumps(
            {
                "runs": {
                    o.job.name: {"run_dir": str(c.run_dir), "exit_code": o.returncode}
                    for o, c in zip(outcomes, configs, strict=True)
                }
            }
        )
    )
    return 1 if failed else 0


def finished(path, source: str) -> dict | None:
    """An evaluation result finished before a stop, if it is this one; a damaged one is redone."""
    if not path.exists():
        return None
    try:
        result = read_json(path)
    except FileError as e:
        print(f"[pipeline] {str(e).split(';')[0]}: evaluating again")
        return None
    return result if result.get("source") == source else None


def pipeline(cfg, restart: bool = False) -> int:
    """Train (or continue training), evaluate backbone and adapter, write the report."""
    from seal_mini.evaluation.agents import ModelAgent
    from seal_mini.evaluation.heldin import eval_tasks, evaluate, print_table
    from seal_mini.evaluation.report import build_report
    from seal_mini.evaluation.suites import print_suite, run_suite
    from seal_mini.training.train import train

    run_dir, policy = train(cfg, resume=True, restart=restart)

    tasks = eval_tasks(cfg)
    results, suite_results = [], []
    for which, adapter in [("base", False), ("adapter", True)]:
        if which == "base" and not cfg.eval.base_model:
            continue
        # what made the policy, without the run's name: a moved or renamed run keeps its finished results
        source = f"adapter after {cfg.train.steps} steps" if adapter else "backbone"
        agent = ModelAgent(policy, cfg, adapter=adapter)
        # held-in BFCL V3 (Table 1), then the out-of-distribution suites the recipe names (Table 2)
        for suite in ["bfcl_v3", *cfg.ood.suites]:
            tag = which if suite == "bfcl_v3" else f"{suite}_{which}"
            done = from_rank0(finished, run_dir / "eval" / f"{tag}.json", source)
            if done is not None:  # finished before a stop: keep it
                (results if suite == "bfcl_v3" else suite_results).append(done)
            elif suite == "bfcl_v3":
                results.append(evaluate(agent, tasks, cfg, run_dir / "eval", tag, source=source))
            else:
                suite_results.append(run_suite(suite, agent, cfg, run_dir / "eval", tag, source=source))
    if not is_main():  # rank 0 writes the report
        return 0
    for result in results:
        print_table(result)
    for result in suite_results:
        print_suite(result)
    report = build_report([run_dir], run_dir / "report")
    print(f"[pipeline] report: {report}")
    print(json.dumps({"run_dir": str(run_dir), "report": str(report), **{r["tag"]: r["success"] for r in results}}))
    return 0
