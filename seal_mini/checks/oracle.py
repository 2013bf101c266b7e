"""Scripted policies built from the ground truth, replayed through seal_mini's own environment.

`python -m seal_mini oracle` runs three of them over all 800 tasks: the ground truth (must pass
800/800), an empty policy (0/800), and the ground truth without the last call of each turn (0/800).
That shows the environment and the verifier agree with the benchmark before any model is involved.
`oracle --practice [--seed N]` does the same over the practice sets (seal_mini/envs/practice.py), and
`oracle --recipe RECIPE [key=value ...]` over a recipe's split (e.g. a tasks world of your own).
`oracle --splits [FILE ...]` compares BFCL splits: the kit's seeded one, the SEAL release's two (shipped in
recipes/splits/) and any split files given. tests/differential.py goes further: the ground truth and a battery
of perturbed episodes, each scored by the kit and by BFCL's own inference loop and scorer, which must agree.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from seal_mini.config import CATEGORIES, ConfigError, DataConfig, load_config
from seal_mini.envs import practice
from seal_mini.envs.bfcl import Task, load_tasks, make_split, read_split_file
from seal_mini.envs.scripted import POLICIES, replay
from seal_mini.envs.splits import load_split, pick, split_figures


def run_oracle(tasks: list[Task] | None = None) -> dict:
    """Pass counts per policy and category (BFCL V3's tasks, or the ones given)."""
    start = time.perf_counter()
    tasks = load_tasks(CATEGORIES) if tasks is None else tasks
    out: dict = {}
    for policy, make_turns in POLICIES.items():
        counts = {c: {"passed": 0, "total": 0} for c in CATEGORIES}
        for task in tasks:
            _, reward = replay(task, make_turns(task))
            counts[task.category]["passed"] += int(reward)
            counts[task.category]["total"] += 1
        out[policy] = counts
    out["seconds"] = round(time.perf_counter() - start, 2)
    return out


def practice_tasks(seed: int = 0) -> list[Task]:
    """The practice sets of the default sizes (training and held-in), as a practice recipe draws them."""
    d = DataConfig(source="practice", split_seed=seed)
    split = practice.make_split(seed, d.train_per_category, d.heldin_per_category, CATEGORIES)
    return [practice.task(i) for i in split["train"] + split["eval"]]


def recipe_tasks(recipe: str, overrides: list[str] = ()) -> list[Task]:
    """A recipe's training and held-in tasks, as its run draws them (BFCL, practice or a tasks world)."""
    split = load_split(load_config(recipe, overrides))
    return pick(split["train"] + split["eval"], 0)


RELEASE_SPLITS = ("recipes/splits/seal_release.json", "recipes/splits/seal_release_400_split.json")
"""The SEAL release's two splits of BFCL V3 (ids, source and licence in each file)."""


def compare_splits(files: list[str], seed: int = 0) -> dict:
    """split_figures of the kit's seeded split (data.split_seed `seed`), the release's two and `files`."""
    named = {f"kit seed {seed}": make_split(seed=seed)}
    named.update({Path(f).stem: read_split_file(f) for f in [*RELEASE_SPLITS, *files]})
    return split_figures(named)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--differential"]:  # once a mode of this command; a test against BFCL's code now
        raise ConfigError("the differential moved to the tests: PYTHONPATH=. .venv/bin/python tests/differential.py")
    if argv[:1] == ["--splits"]:
        result = compare_splits(argv[1:])
        for name, f in result["splits"].items():
            print(
                f"{name}: {f['train']} train / {f['eval']} held-in; base indices with variants on both sides "
                f"{f['indices_on_both_sides']}; held-in tasks with a same-index twin in training {f['eval_with_train_twin']}"
            )
        for pair, n in result["shared_train"].items():
            print(f"{pair}: {n} training ids shared")
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(prog="python -m seal_mini oracle", description=__doc__.split("\n")[0])
    parser.add_argument("--practice", action="store_true", help="the practice sets (training and held-in) instead")
    parser.add_argument("--seed", type=int, default=0, help="with --practice: the sets' seed (data.split_seed)")
    parser.add_argument("--recipe", help="a recipe's split instead (e.g. data.source: tasks, a world of your own)")
    parser.add_argument("overrides", nargs="*", help="with --recipe: key.sub=value overrides")
    args = parser.parse_args(argv)
    tasks = recipe_tasks(args.recipe, args.overrides) if args.recipe else None
    result = run_oracle(tasks=practice_tasks(args.seed) if args.practice else tasks)
    for policy in POLICIES:
        row = ", ".join(f"{c} {v['passed']}/{v['total']}" for c, v in result[policy].items())
        print(f"{policy:>15}: {row}")
    print(json.dumps(result))
    return 0
