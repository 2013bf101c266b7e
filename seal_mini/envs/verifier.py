"""Reward = what BFCL's eval_runner gives a multi-turn entry: the official multi_turn_checker's verdict.

For a multi-turn entry the pinned eval_runner (_evaluate_single_multi_turn_entry) does two things and
nothing else: an entry whose inference was force-quit before its last turn fails as force_terminated,
and every other entry gets multi_turn_checker's verdict on all the calls decoded from each message.
(The package also has a multi_turn_irrelevance_checker; eval_runner imports it and never calls it, so a
call on a turn whose ground truth makes none is executed and not failed.) The episode's records are
that decoded input already (seal_mini.envs.episode), so the checker sees what BFCL's scorer would give it.

The checker re-executes the model's calls and the ground truth turn by turn on fresh instances and
compares state and outputs. It evaluates call strings with eval(), so every string is put through
harness.checker_input_for first: only calls of public tool methods with literal values reach it. If the
checker raises all the same, the episode fails with CHECKER_RAISED and the reason in its details.

The checker runs under the model name BFCL's scorer uses for the episode's model (its harness.Protocol), so
its instance names, which it writes into string arguments that mention a method, are BFCL's: a verdict
is a function of the episode alone. It keeps back-end instances in its module's globals, keyed by that
name and the task id, and never frees them. So each check puts fresh instances there first, the model's
and the ground truth's of one fresh class per back end (what a fresh process has: they share a default
argument, as in BFCL), and removes them afterwards: no check sees another's state, and memory stays flat.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import INFERENCE_ERROR, NOT_REACHED, TURN_LIMIT, new_instances, unfolded_size
from seal_mini.envs.harness import QWEN_FC, checker_input_for, fresh_class, instance_name

CHECKER_RAISED = "seal_mini:checker_raised"
"""The error type of a verdict whose check raised (a back end's bug, not anything model text can cause):
the episode fails and the run goes on; metrics count such verdicts (charts/checker_raised)."""


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


def check(task: Task, checker_input: list[list[list[str]]], forced_quit: bool = False, protocol=None) -> Verdict:
    """Score one episode as eval_runner scores a multi-turn entry (forced_quit: force-quit before its last turn),
    under the names BFCL's scorer gives the model of `protocol` (harness.PROTOCOLS; by default Qwen FC's)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    CHECKER_MODEL = (protocol or QWEN_FC).checker_model  # noqa: N806 - the scorer's model name, as BFCL calls it

    if forced_quit:  # eval_runner: fewer turns than the ground truth means the inference was force-quit
        return Verdict(0.0, "multi_turn:force_terminated", len(checker_input) - 1, {})
    checker_input, replaced = checker_input_for(task, checker_input, CHECKER_MODEL)
    entry = {"id": task.id, "initial_config": task.initial_config, "involved_classes": task.involved_classes}
    cache = vars(multi_turn_utils)
    classes = {c: fresh_class(c) for c in task.involved_classes}
    placed = {}
    for side in (CHECKER_MODEL, f"{CHECKER_MODEL}_ground_truth"):  # the checker's two sets of instances
        for class_name, instance in new_instances(task, classes).items():
            placed[instance_name(f"{side}_eval", task.id, class_name)] = instance
    cache.update(placed)
    try:
        result = multi_turn_checker(checker_input, task.ground_truth, entry, task.id.rsplit("_", 1)[0], CHECKER_MODEL)
    except Exception as e:  # noqa: BLE001 - a verdict all the same: scoring never ends a run
        reason = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"[verifier] warning: the checker raised on {task.id} ({reason}); the episode fails")
        return Verdict(0.0, CHECKER_RAISED, None, {"error_message": reason})
    finally:
        for key in placed:
            cache.pop(key, None)
    replaced_calls = {"replaced_calls": replaced} if replaced else {}
    if result["valid"]:
        return Verdict(1.0, details=replaced_calls)
    details = {"error_message": result.get("error_message", ""), **replaced_calls}
    found = result.get("details", {})
    if "differences" in found:
        # States can be huge (long_context file systems): keep a readable excerpt of each difference.
        details["differences"] = {k: _excerpt(v) for k, v in found["differences"].items()}
    if "missing_items" in found:
        details["missing_items"] = [str(m)[:500] for m in found["missing_items"]]
    return Verdict(0.0, result.get("error_type", ""), _failed_turn(result), details)


def _excerpt(value, chars: int = 500) -> str:
    """The start of repr(value), unless the value unfolds too far to write (see unfolded_size)."""
    n = unfolded_size(value, 20 * chars)
    return repr(value)[:chars] if n <= 20 * chars else f"<more than {20 * chars} objects unfolded: not shown>"


def check_episode(episode) -> Verdict:
    """The verdict on a finished episode (or interface wrapper). BFCL fails an entry whose inference was
    force-quit (more than 20 tool-calling messages in a turn) before its last turn; one force-quit in its
    last turn has every turn and is scored as usual. It fails an entry whose inference stopped with an
    error (a message its prompt cannot write back) as multi_turn:inference_error."""
    if episode.ended_by == INFERENCE_ERROR:
        last = max(r.index for r in episode.turn_records() if r.messages)
        return Verdict(0.0, "multi_turn:inference_error", last, {})
    forced = episode.ended_by == TURN_LIMIT and episode.turn_records()[-1].ended_by == NOT_REACHED
    return check(episode.task, episode.checker_input(), forced_quit=forced, protocol=getattr(episode, "protocol", None))
