"""`python -m seal_mini sft RECIPE [k=v ...] [--rebuild]`: build a recipe's warm start (seal_mini/training/sft.py)."""

from __future__ import annotations

import argparse
import json

from seal_mini.config import load_config
from seal_mini.distributed import run_lock
from seal_mini.runio import read_json
from seal_mini.training.sft import ensure_warm_start, run_sft


def main(argv: list[str]) -> int:
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
