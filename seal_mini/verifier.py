"""Reward = the official bfcl-eval multi_turn_checker's verdict on an episode's executed calls.

The checker re-executes the model's calls and the ground truth turn by turn on fresh instances and
compares state and outputs. It evaluates call strings with eval(): it only ever sees the canonical
strings seal_mini built from validated calls (an offered public method name and Python literals of
parsed JSON), never model text. It caches back-end instances in its module's globals and never frees
them; every check here uses a unique name and removes its instances afterwards, so memory stays flat.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from seal_mini.bfcl import Task

_counter = itertools.count()


@dataclass
class Verdict:
    reward: float
    """1.0 if the checker passes the episode, else 0.0."""
    error_type: str = ""
    """The checker's error type (e.g. multi_turn:instance_state_mismatch), empty on success."""
    failed_turn: int | None = None
    """Turn at which the checker stopped, if it failed."""
    details: dict = field(default_factory=dict)


def _failed_turn(result: dict) -> int | None:
    """The checker names the turn in most messages; a state mismatch carries the executed turns."""
    m = re.search(r"turn (\d+)", result.get("error_message", ""))
    if m:
        return int(m.group(1))
    executed = result.get("execution_result")
    return len(executed) - 1 if executed else None


def check(task: Task, checker_input: list[list[list[str]]], forced_quit: bool = False) -> Verdict:
    """Score one episode with the official checker (and its irrelevance check, as BFCL does)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        multi_turn_checker,
        multi_turn_irrelevance_checker,
    )

    if forced_quit:  # BFCL marks a task that hit the step limit as failed without checking it
        return Verdict(0.0, "multi_turn:force_terminated", len(checker_input) - 1, {})
    model_name = f"seal_mini_check_{next(_counter)}"
    entry = {"id": task.id, "initial_config": task.initial_config, "involved_classes": task.involved_classes}
    try:
        result = multi_turn_checker(checker_input, task.ground_truth, entry, task.id.rsplit("_", 1)[0], model_name)
        if result["valid"]:
            result = multi_turn_irrelevance_checker(checker_input, task.ground_truth)
    finally:
        cache = vars(multi_turn_utils)
        for key in [k for k in cache if k.startswith(model_name + "_")]:
            del cache[key]
    if result["valid"]:
        return Verdict(1.0)
    message = result.get("error_message", "")
    details = {"error_message": message}
    if "details" in result and "differences" in result["details"]:
        # States can be huge (long_context file systems): keep a readable excerpt of each difference.
        details["differences"] = {k: repr(v)[:500] for k, v in result["details"]["differences"].items()}
    if "details" in result and "missing_items" in result["details"]:
        details["missing_items"] = [str(m)[:500] for m in result["details"]["missing_items"]]
    return Verdict(0.0, result.get("error_type", ""), _failed_turn(result), details)


def check_episode(episode) -> Verdict:
    """The verdict on a finished episode (or interface wrapper): its records, and BFCL's force quit."""
    from seal_mini.env import TURN_LIMIT

    return check(episode.task, episode.checker_input(), forced_quit=episode.ended_by == TURN_LIMIT)
