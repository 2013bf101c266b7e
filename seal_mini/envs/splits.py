"""A run's tasks: the train / held-in split and tasks by id, of BFCL V3, the practice sets or a tasks world.

BFCL's tasks come from seal_mini.envs.bfcl, the practice tasks from seal_mini.envs.practice, a world of your
own from seal_mini.envs.world; a recipe's data.source says which, and everything downstream takes `Task`s
from here without asking. A tasks world's ids are known once its split has been loaded (`load_split`).
"""

from __future__ import annotations

import itertools

from seal_mini.config import Config, ConfigError
from seal_mini.envs import practice, world
from seal_mini.envs.bfcl import Task, make_split, read_split_file, tasks_by_id
from seal_mini.envs.practice import practice_split


def load_split(cfg: Config) -> dict[str, list[str]]:
    """The run's train / eval ids: an explicit id file, the seeded split by base-task index, (data.source:
    practice) the seeded practice sets, or (data.source: tasks) each task's own side of its tasks file."""
    if cfg.data.source != "bfcl" and cfg.data.split_file:
        raise ConfigError(
            "data.split_file applies to data.source=bfcl; practice sets come from data.split_seed, a tasks "
            "file's tasks name their own side (split: train or heldin)"
        )
    if cfg.data.source == "practice":
        return practice_split(cfg)
    if cfg.data.source == "tasks":
        return world.world_split(cfg)
    if cfg.data.split_file:
        split = read_split_file(cfg.data.split_file)
    else:
        split = make_split(cfg.data.train_per_category, cfg.data.split_seed, cfg.data.categories)
    keep = tuple(f"multi_turn_{c}_" for c in cfg.data.categories)
    return {side: [i for i in ids if i.startswith(keep)] for side, ids in split.items()}


def split_name(cfg: Config) -> str:
    """Which split a run's numbers are on, in a few words (the report names it beside every table)."""
    d = cfg.data
    if d.source == "practice":
        return f"practice sets, seed {d.split_seed}"
    if d.source == "tasks":
        return f"tasks file {d.tasks_file}"
    if d.split_file:
        release = " (the SEAL release's, exp/SEAL.yaml)" if d.split_file.endswith("seal_release.json") else ""
        return f"split file {d.split_file}{release}"
    return f"the kit's split by base-task index, seed {d.split_seed}"


def tasks_for(ids: list[str], what: str, cfg: Config | None = None) -> list[Task]:
    """The tasks of ids (BFCL V3, practice, or a tasks world's: cfg's, or one loaded before); `what` names the
    option in the error on unknown ones."""
    if cfg is not None and cfg.data.source == "tasks":
        world.load(cfg.data.tasks_file, cfg.data.tool_classes)
    own = lambda i: practice.is_practice(i) or i in world.TASKS  # noqa: E731
    known = tasks_by_id() if not all(own(i) for i in ids) else {}
    tasks, unknown = [], []
    for i in ids:
        try:
            tasks.append(practice.task(i) if practice.is_practice(i) else world.TASKS.get(i) or known[i])
        except (KeyError, ConfigError):
            unknown.append(i)
    if unknown:
        shown = ", ".join(repr(i) for i in unknown[:5])
        raise ConfigError(
            f"{what}: no such BFCL V3 task, practice task or task of the run's tasks file ({shown}; ids look like "
            "multi_turn_base_12, practice_0_heldin_base_3 or a tasks file's own)"
        )
    return tasks


def pick(ids: list[str], limit: int) -> list[Task]:
    """Tasks for ids (BFCL, practice or a tasks world's); with a limit, spread it over the categories (first N
    of each)."""
    tasks = tasks_for(ids, "the run's split")
    if not limit:
        return tasks
    per_category: dict[str, list[Task]] = {}
    for t in tasks:
        per_category.setdefault(t.category, []).append(t)
    rounds = itertools.zip_longest(*per_category.values())  # the first of each category, then the second, ...
    return [t for row in rounds for t in row if t is not None][:limit]


def split_figures(splits: dict[str, dict[str, list[str]]]) -> dict:
    """What each named BFCL split is and how they overlap: per split, its tasks per side, the base-task
    indices with variants on both sides and the held-in tasks with a same-index twin in training (both 0
    for a split made by index); per pair, the training ids they share."""

    def index(task_id: str) -> int:
        return int(task_id.rsplit("_", 1)[1])

    out: dict = {"splits": {}, "shared_train": {}}
    for name, split in splits.items():
        train_idx = {index(i) for i in split["train"]}
        out["splits"][name] = {
            "train": len(split["train"]),
            "eval": len(split["eval"]),
            "indices_on_both_sides": len(train_idx & {index(i) for i in split["eval"]}),
            "eval_with_train_twin": sum(index(i) in train_idx for i in split["eval"]),
        }
    names = list(splits)
    for k, a in enumerate(names):
        for b in names[k + 1 :]:
            out["shared_train"][f"{a} / {b}"] = len(set(splits[a]["train"]) & set(splits[b]["train"]))
    return out
