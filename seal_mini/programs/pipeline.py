"""`bash run.sh RECIPE`: train -> evaluate (backbone and trained adapter, bare benchmark) -> report; and the
commands of the stages alone: `sft`, `train`, `report` (`eval` is seal_mini.programs.eval).

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
from pathlib import Path

from seal_mini.config import Config, ConfigError, config_from_dict, load_config, saved_config
from seal_mini.distributed import from_rank0, is_main, run_lock, world_size
from seal_mini.evaluation.agents import ModelAgent
from seal_mini.evaluation.heldin import eval_tasks, evaluate, print_table
from seal_mini.evaluation.report import build_report
from seal_mini.evaluation.suites import check_suites, print_suite, run_suite
from seal_mini.programs.placement import Job, failure_report, launch_command, run_placed, visible_gpus
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
    check_suites(cfg)  # a missing optional extra is an error now, not after training
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):
        return pipeline(cfg, args.restart)


def run_side_by_side(recipes: list[str], overrides: list[str], gpus_per_run: int, restart: bool) -> int:
    """Several recipes: each its own pipeline, on its own GPUs, as many at once as the GPUs allow
    (seal_mini.programs.placement); without a GPU one after another. Exit code 1 if any run failed."""
    if world_size() > 1:
        raise ConfigError("several recipes place their own runs on the GPUs; start them without torchrun")
    configs = [load_config(recipe, overrides) for recipe in recipes]
    seen: dict = {}
    jobs = []
    for recipe, cfg in zip(recipes, configs, strict=True):
        if cfg.run_dir.resolve() in seen:
            raise ConfigError(
                f"{seen[cfg.run_dir.resolve()]} and {recipe} both run in {cfg.run_dir}; give each recipe its own name"
            )
        seen[cfg.run_dir.resolve()] = recipe
        check_suites(cfg)  # a missing optional extra is an error now, not after training
        command = launch_command(["pipeline", recipe, *overrides, *(["--restart"] if restart else [])], gpus_per_run)
        jobs.append(Job(cfg.name, command, cfg.run_dir.parent / f"{cfg.name}.log"))
    outcomes = run_placed(jobs, visible_gpus(), gpus_per_run)
    failed = failure_report(outcomes)
    if failed:
        print(failed, file=sys.stderr)
    runs = {
        o.job.name: {"run_dir": str(c.run_dir), "exit_code": o.returncode}
        for o, c in zip(outcomes, configs, strict=True)
    }
    print(json.dumps({"runs": runs}))
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
    from seal_mini.training.train import train  # here, not at the top: it loads transformers

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


# --- the stages alone ---------------------------------------------------------------------------------


def resume_config(run_dir: Path, recipe: str | None, overrides: list[str]) -> Config:
    """The config `train --resume RUN_DIR [RECIPE] [k=v ...]` continues with: the run's saved config (or
    the recipe) plus overrides, living where run_dir is now; train() refuses any change to the math."""
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    if any(text.split("=", 1)[0].strip() in ("name", "out_dir") for text in overrides):
        raise ConfigError(f"--resume {run_dir} names the run already; drop the name= / out_dir= overrides")
    cfg = load_config(recipe, overrides) if recipe else config_from_dict(saved_config(run_dir).to_dict(), overrides)
    cfg.out_dir, cfg.name = str(run_dir.parent), run_dir.name  # the folder may have moved
    return cfg


def train_command(argv: list[str]) -> int:
    """`train RECIPE [k=v ...]`, or `train --resume RUN_DIR`: SEAL training (seal_mini/training/train.py). A
    recipe whose run directory holds a run continues it, as a rerun of the pipeline does."""
    from seal_mini.training.train import train

    parser = argparse.ArgumentParser(prog="python -m seal_mini train", description="SEAL training")
    parser.add_argument("recipe", nargs="?", help="recipes/X.yaml (optional with --resume)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (settings in config.RESUME_MAY_CHANGE may change)",
    )
    parser.add_argument(
        "--restart", action="store_true", help="move what the run directory holds aside, start at step 0"
    )
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.recipe and "=" in args.recipe and not args.recipe.endswith((".yaml", ".yml")):
        args.overrides, args.recipe = [args.recipe, *args.overrides], None  # only overrides were given
    if args.resume:
        if args.restart:
            raise ConfigError("--resume continues a run and --restart starts it over; give one of them")
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise ConfigError(f"--resume {run_dir}: no such folder")
    elif not args.recipe:
        raise ConfigError("train needs a recipe (e.g. recipes/cpu_smoke.yaml) or --resume RUN_DIR")
    else:
        cfg = load_config(args.recipe, args.overrides)
        run_dir = cfg.run_dir
    with run_lock(run_dir, " ".join([parser.prog, *argv])):
        if args.resume:  # read the run's config only once no other command can be writing it
            cfg = resume_config(run_dir, args.recipe, args.overrides)
        # the same command again continues the run (as the pipeline does); other settings are refused by name
        run_dir, _ = train(cfg, resume=True, restart=args.restart)
    print(json.dumps({"run_dir": str(run_dir)}))
    return 0


def sft_command(argv: list[str]) -> int:
    """`sft RECIPE [k=v ...] [--rebuild]`: build a recipe's warm start (seal_mini/training/sft.py)."""
    from seal_mini.training.sft import ensure_warm_start, run_sft

    parser = argparse.ArgumentParser(prog="python -m seal_mini sft", description="build the warm start of a recipe")
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument("--rebuild", action="store_true", help="build it again even if an identical one exists")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    cfg = load_config(args.recipe, [*args.overrides, "sft.enabled=true"])
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):  # it writes into the run directory
        path = run_sft(cfg) if args.rebuild else ensure_warm_start(cfg)
    print(json.dumps({"warm_start": str(path), **read_json(path / "sft.json")["stats"]}))
    return 0


def report_command(argv: list[str]) -> int:
    """`report RUN_DIR [RUN_DIR ...] [--out DIR]`: the markdown report with plots (seal_mini/evaluation/report.py)
    of the run directories given, drawn from their files alone; the first is the main run."""
    parser = argparse.ArgumentParser(prog="python -m seal_mini report", description="report from run directories")
    parser.add_argument("runs", nargs="+", help="run directories; the first is the main run")
    parser.add_argument("--out", help="output folder (default: FIRST_RUN/report)")
    args = parser.parse_args(argv)
    runs = [Path(r) for r in args.runs]
    for run in runs:
        if not run.is_dir():
            raise ConfigError(f"report: {run}: no such folder")
    out = Path(args.out) if args.out else runs[0] / "report"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"report --out {out}: that is a file; name a folder for the report")
    path = build_report(runs, out, " ".join([parser.prog, *argv]))
    print(json.dumps({"report": str(path)}))
    return 0
