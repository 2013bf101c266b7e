"""`python -m seal_mini train RECIPE [k=v ...]`, or `train --resume RUN_DIR`: SEAL training (the loop is
seal_mini/training/train.py). A recipe whose run directory holds a run continues it, as a rerun of the
pipeline does: stopping and rerunning the same command continues where it stopped."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seal_mini.config import Config, ConfigError, config_from_dict, load_config, saved_config
from seal_mini.distributed import run_lock
from seal_mini.training.train import train


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


def main(argv: list[str]) -> int:
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
