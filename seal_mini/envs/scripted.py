"""Scripted policies built from a task's ground truth, replayed through seal_mini's own environment.

The ground truth as calls (`ground_truth_turns`), the assistant messages that carry them, and `play`, which
drives any episode with them. The oracle program, the diagnoser's reference, the fault injector, the
warm start's demonstrations and held-in evaluation of a scripted policy all replay tasks this way.
"""

from __future__ import annotations

import ast
import copy
import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass

from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode, new_instances, public_methods, public_state
from seal_mini.envs.harness import QWEN_FC, Protocol
from seal_mini.envs.verifier import check_episode

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


def ground_truth_turns(task: Task, drop_last: bool = False) -> list[list[tuple[str, dict]]]:
    """The ground truth as (name, arguments) calls per turn; drop_last leaves out each turn's last call."""
    methods = public_methods(new_instances(task))
    turns = [[ground_truth_call(c, methods) for c in calls] for calls in task.ground_truth]
    return [calls[:-1] for calls in turns] if drop_last else turns


@dataclass
class PlannedCall:
    name: str
    arguments: dict
    changes_state: bool
    """Executing it changed the public state of its back end (in the ground truth's own run)."""
    owner: str = ""
    """The back-end class that implements it."""


def ground_truth_effects(task: Task) -> list[list[PlannedCall]]:
    """The ground truth run once on fresh back ends: per turn, its calls, each marked by whether executing
    it changed its back end's public state."""
    instances = new_instances(task)
    methods = public_methods(instances)
    turns = []
    for calls in ground_truth_turns(task):
        effects = []
        for name, arguments in calls:
            instance = methods[name].__self__
            before = pickle.loads(pickle.dumps(public_state(instance)))
            try:
                methods[name](**copy.deepcopy(arguments))  # back ends keep (and later grow) lists passed in
            except Exception:  # noqa: BLE001 - a raising reference call changes nothing we need to know
                pass
            changed = public_state(instance) != before
            effects.append(PlannedCall(name, arguments, changed, type(instance).__name__))
        turns.append(effects)
    return turns


def scripted_messages(turn_calls: list[tuple[str, dict]], protocol: Protocol = QWEN_FC) -> list[str]:
    """Assistant messages for one turn: all its calls in one message (written as `protocol`'s model writes
    them), then a closing answer."""
    return ([protocol.write(turn_calls)] if turn_calls else []) + [DONE_TEXT]


def play_messages(
    env, script: list[list[str]], on_query: Callable | None = None, cut_turn: int | None = None
) -> list[dict]:
    """Reset an episode and send scripted assistant messages per turn, as BFCL's inference loop takes them: a
    message that ends the turn leaves the rest of that turn's messages unsent, and a turn whose messages run out
    gets the final answer (with cut_turn, that turn is truncated instead). on_query(messages, tools) sees the
    conversation before each message is sent; returns the conversation."""
    messages, tools = env.reset()
    for k, texts in enumerate(script):
        if env.done:
            break
        # DONE_TEXT, a message without calls, always ends its turn
        answer = [] if k == cut_turn else [DONE_TEXT]
        for text in [*texts, *answer]:
            if on_query is not None:
                on_query(messages, tools)
            messages.append({"role": "assistant", "content": text})
            result = env.step(text)
            messages += result.observation
            if result.turn_done:
                break
        else:  # the cut turn's messages ran out
            env.truncate()
    return messages


def play(env, turns: list[list[tuple[str, dict]]]) -> list[dict]:
    """Reset an episode and drive it with scripted assistant messages; returns the conversation."""
    protocol = getattr(env, "protocol", QWEN_FC)
    return play_messages(env, [scripted_messages(turn_calls, protocol) for turn_calls in turns])


def replay(task: Task, turns: list[list[tuple[str, dict]]], **limits) -> tuple[Episode, float]:
    """Drive an episode with scripted assistant messages; returns it and its reward."""
    episode = Episode(task, **limits)
    play(episode, turns)
    return episode, check_episode(episode).reward


POLICIES: dict[str, Callable[[Task], list]] = {
    "ground_truth": ground_truth_turns,
    "empty": lambda task: [[] for _ in task.turns],
    "drop_last_call": lambda task: ground_truth_turns(task, drop_last=True),
}
