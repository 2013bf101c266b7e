"""`bash run.sh RECIPE`: train -> evaluate (backbone and trained adapter, bare benchmark) -> report.

Evaluation is held-in BFCL V3, then each out-of-distribution suite the recipe names (ood.suites).

Re-running the same command after a stop continues where it stopped: training resumes from the last
checkpoint, evaluation from its last finished piece; finished work is never redone.
"""

from __future__ import annotations

import argparse
import json

import yaml

from seal_mini.config import ConfigError, load_config
from seal_mini.runio import latest_checkpoint, read_json


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini pipeline", description="train, evaluate, report")
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    args = parser.parse_args(argv)
    cfg = load_config(args.recipe, args.overrides)
    from seal_mini.ood import check_suites

    check_suites(cfg)  # a missing optional extra is an error now, not after training

    from seal_mini.evaluate import ModelAgent, eval_tasks, evaluate, print_table
    from seal_mini.ood import print_suite, run_suite
    from seal_mini.report import build_report
    from seal_mini.train import train

    run_dir = cfg.run_dir
    resume = latest_checkpoint(run_dir) is not None
    if resume:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        if saved != cfg.to_dict():
            changed = sorted(k for k in cfg.to_dict() if saved.get(k) != cfg.to_dict()[k])
            raise ConfigError(
                f"{run_dir} holds a run made with a different config (sections {changed}); "
                f"rerun with its recipe, or give this one a new name (name=...)"
            )
        print(f"[pipeline] {run_dir} has a checkpoint: continuing that run")
    run_dir, policy = train(cfg, resume=resume)

    tasks = eval_tasks(cfg)
    results, suite_results = [], []
    for which, adapter in [("base", False), ("adapter", True)]:
        if which == "base" and not cfg.eval.base_model:
            continue
        source = f"{run_dir.name}: {'adapter after ' + str(cfg.train.steps) + ' steps' if adapter else 'backbone'}"
        agent = ModelAgent(policy, cfg, adapter=adapter)
        # held-in BFCL V3 (Table 1), then the out-of-distribution suites the recipe names (Table 2)
        for suite in ["bfcl_v3", *cfg.ood.suites]:
            tag = which if suite == "bfcl_v3" else f"{suite}_{which}"
            done = run_dir / "eval" / f"{tag}.json"
            if done.exists() and read_json(done).get("source") == source:  # finished before a stop: keep it
                (results if suite == "bfcl_v3" else suite_results).append(read_json(done))
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
