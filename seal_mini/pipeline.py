"""`bash run.sh RECIPE`: train -> evaluate (backbone and trained adapter, bare benchmark) -> report.

Evaluation is held-in BFCL V3, then each out-of-distribution suite the recipe names (ood.suites).

Re-running the same command after a stop continues where it stopped: training resumes from the last
checkpoint, evaluation from its last finished piece; finished work is never redone.
"""

from __future__ import annotations

import argparse
import json

from seal_mini.config import load_config
from seal_mini.runio import FileError, read_json, run_lock


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini pipeline", description="train, evaluate, report")
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument("--restart", action="store_true", help="move what the run directory holds aside, start over")
    args = parser.parse_args(argv)
    cfg = load_config(args.recipe, args.overrides)
    from seal_mini.ood import check_suites

    check_suites(cfg)  # a missing optional extra is an error now, not after training
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):
        return pipeline(cfg, args.restart)


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
    from seal_mini.evaluate import ModelAgent, eval_tasks, evaluate, print_table
    from seal_mini.ood import print_suite, run_suite
    from seal_mini.report import build_report
    from seal_mini.train import train

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
            done = finished(run_dir / "eval" / f"{tag}.json", source)
            if done is not None:  # finished before a stop: keep it
                (results if suite == "bfcl_v3" else suite_results).append(done)
            elif suite == "bfcl_v3":
                results.append(evaluate(agent, tasks, cfg, run_dir / "eval", tag, source=source))
            else:
                suite_results.append(run_suite(suite, agent, cfg, run_dir / "eval", tag, source=source))
    for result in results:
        print_table(result)
    for result in suite_results:
        print_suite(result)
    report = build_report([run_dir], run_dir / "report")
    print(f"[pipeline] report: {report}")
    print(json.dumps({"run_dir": str(run_dir), "report": str(report), **{r["tag"]: r["success"] for r in results}}))
    return 0
