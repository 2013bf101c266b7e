"""Scripted policies built from the ground truth, replayed through seal_mini's own environment.

`python -m seal_mini oracle` runs three of them over all 800 tasks: the ground truth (must pass
800/800), an empty policy (0/800), and the ground truth without the last call of each turn (0/800).
That shows the environment and the verifier agree with the benchmark before any model is involved.
`oracle --practice [--seed N]` does the same over the practice sets (seal_mini/practice.py).
`python -m seal_mini oracle --differential [options]` goes further: the ground truth and a battery of
perturbed episodes, each scored by the kit and by BFCL's own inference loop and scorer, which must
agree on every one (seal_mini.differential).
"""

from __future__ import annotations

import ast
import inspect
import json
import time
from collections.abc import Callable

from seal_mini.bfcl import Task, load_tasks
from seal_mini.config import CATEGORIES
from seal_mini.env import Episode, new_instances, public_methods
from seal_mini.toolcalls import format_call
from seal_mini.verifier import check_episode

DONE_TEXT = "Done."


def ground_truth_call(text: str, methods: dict) -> tuple[str, dict]:
    """One BFCL reference call string -> (name, keyword arguments), without evaluating anything.

    160 reference calls use positional arguments; they are named from the back-end signature."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain call: {text!r}")
    name = node.func.id
    params = list(inspect.signature(methods[name]).parameters) if node.args else []
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return name, args


def _signatures(task: Task) -> dict:
    return public_methods(new_instances(task))


def ground_truth_turns(task: Task, drop_last: bool = False) -> list[list[tuple[str, dict]]]:
    methods = _signatures(task)
    turns = []
    for calls in task.ground_truth:
        parsed = [ground_truth_call(c, methods) for c in calls]
        turns.append(parsed[:-1] if drop_last and parsed else parsed)
    return turns


def scripted_messages(turn_calls: list[tuple[str, dict]]) -> list[str]:
    """Assistant messages for one turn: all its calls in one message, then a closing answer."""
    calls = "\n".join(format_call(name, args) for name, args in turn_calls)
    return ([calls] if calls else []) + [DONE_TEXT]


def play(env, turns: list[list[tuple[str, dict]]]) -> list[dict]:
    """Reset an episode and drive it with scripted assistant messages; returns the conversation."""
    messages, _ = env.reset()
    for turn_calls in turns:
        for text in scripted_messages(turn_calls):
            messages.append({"role": "assistant", "content": text})
            result = env.step(text)
            messages += result.observation
            if result.turn_done:
                break
        if env.done:
            break
    return messages


def replay(task: Task, turns: list[list[tuple[str, dict]]], **limits) -> tuple[Episode, float]:
    """Drive an episode with scripted assistant messages; returns it and its reward."""
    episode = Episode(task, **limits)
    play(episode, turns)
    return episode, check_episode(episode).reward


POLICIES: dict[str, Callable[[Task], list]] = {
    "ground_truth": lambda task: ground_truth_turns(task),
    "empty": lambda task: [[] for _ in task.turns],
    "drop_last_call": lambda task: ground_truth_turns(task, drop_last=True),
}


def run_oracle(categories=CATEGORIES, limit: int = 0, tasks: list[Task] | None = None) -> dict:
    """Pass counts per policy and category (BFCL V3's tasks, or the ones given)."""
    start = time.perf_counter()
    if tasks is None:
        tasks = load_tasks(categories)
        if limit:
            tasks = [t for t in tasks if t.index < limit]
    out: dict = {}
    for policy, make_turns in POLICIES.items():
        counts = {c: {"passed": 0, "total": 0} for c in categories}
        for task in tasks:
            _, reward = replay(task, make_turns(task))
            counts[task.category]["passed"] += int(reward)
            counts[task.category]["total"] += 1
        out[policy] = counts
    out["seconds"] = round(time.perf_counter() - start, 2)
    return out


def practice_tasks(seed: int = 0) -> list[Task]:
    """The practice sets of the default sizes (training and held-in), as a practice recipe draws them."""
    from seal_mini import practice
    from seal_mini.config import DataConfig

    d = DataConfig(source="practice", split_seed=seed)
    split = practice.make_split(seed, d.train_per_category, d.heldin_per_category, CATEGORIES)
    return [practice.task(i) for i in split["train"] + split["eval"]]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--differential"]:
        from seal_mini import differential

        return differential.main(argv[1:])
    import argparse

    parser = argparse.ArgumentParser(prog="python -m seal_mini oracle", description=__doc__.split("\n")[0])
    parser.add_argument("--practice", action="store_true", help="the practice sets (training and held-in) instead")
    parser.add_argument("--seed", type=int, default=0, help="with --practice: the sets' seed (data.split_seed)")
    args = parser.parse_args(argv)
    result = run_oracle(tasks=practice_tasks(args.seed) if args.practice else None)
    for policy in POLICIES:
        row = ", ".join(f"{c} {v['passed']}/{v['total']}" for c, v in result[policy].items())
        print(f"{policy:>15}: {row}")
    print(json.dumps(result))
    return 0
