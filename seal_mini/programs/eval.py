"""`python -m seal_mini eval [RECIPE] [k=v ...]`: held-in BFCL V3 (seal_mini/evaluation/heldin.py), or with
--suite an out-of-distribution suite (seal_mini/evaluation/suites.py), for the backbone, an adapter or a
scripted policy. Results go to <run_dir>/eval/<tag>.json, where the report reads them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seal_mini.config import Config, ConfigError, OodConfig, load_config
from seal_mini.distributed import check_same, run_lock
from seal_mini.engine.policy import load_policy
from seal_mini.envs.scripted import POLICIES
from seal_mini.evaluation.agents import ModelAgent, ScriptedAgent
from seal_mini.evaluation.heldin import eval_tasks, evaluate, print_table
from seal_mini.evaluation.suites import SUITES, check_suites, print_suite, run_suite


def main(argv: list[str]) -> int:
    """`eval`: parse the command line, check the recipe, run held_in_main or suite_main under the run's lock."""
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
    results = [
        evaluate(agent, tasks, cfg, cfg.run_dir / "eval", tag, source=source)
        for agent, tag, source in agents(args, cfg, ScriptedAgent, args.scripted, "")
    ]
    for result in results:
        print_table(result)
    print(json.dumps({r["tag"]: r["success"] for r in results}))
    return 0


def suite_main(args, cfg: Config) -> int:
    """`eval --suite S`: an out-of-distribution suite for the backbone, an adapter or a scripted policy."""
    suite = args.suite
    if args.ids:
        raise ConfigError(f"--ids applies to bfcl_v3 only; for {suite} use ood.max_tasks=N")
    if args.domains:
        if not SUITES[suite].domains:
            raise ConfigError(f"--domains does not apply to {suite}")
        setattr(cfg.ood, SUITES[suite].domains, [d.strip() for d in args.domains.split(",") if d.strip()])
        cfg.validate()
    scripted, prefix = SUITES[suite].scripted, f"{suite}_"
    results = [
        run_suite(suite, agent, cfg, cfg.run_dir / "eval", tag, source=source)
        for agent, tag, source in agents(args, cfg, scripted, f"{prefix}scripted_{args.scripted}", prefix)
    ]
    for result in results:
        print_suite(result)
    print(json.dumps({r["tag"]: {"scores": r["scores"], "mean": r["mean"]} for r in results}))
    return 0


def agents(args, cfg: Config, scripted, scripted_tag: str, prefix: str) -> list[tuple]:
    """(agent, result tag, source) of each evaluation asked for: the scripted policy (made by `scripted`), or
    the backbone and the adapter (each tag named `prefix`base / `prefix`adapter unless --tag names it)."""
    if args.scripted:
        return [(scripted(args.scripted), args.tag or scripted_tag, "")]
    if args.adapter:
        if not Path(args.adapter).is_dir():
            raise ConfigError(f"--adapter {args.adapter}: no such folder")
        cfg.lora.adapter_path = args.adapter  # its files are checked before peft reads them (policy.checked_adapter)
    policy = load_policy(cfg)
    out = []
    if cfg.eval.base_model or not args.adapter:
        out.append((ModelAgent(policy, cfg, adapter=False), args.tag or f"{prefix}base", "base"))
    if args.adapter:
        tag = f"{args.tag}_adapter" if args.tag else f"{prefix}adapter"
        out.append((ModelAgent(policy, cfg, adapter=True), tag, f"adapter {args.adapter}"))
    return out
