"""`PYTHONPATH=. python tests/differential.py`: the kit's episode and verifier against BFCL's own harness.

For every task this plays the ground truth and a battery of perturbed episodes (PERTURBATIONS) twice:
  kit        seal_mini.envs.episode.Episode, then seal_mini.envs.verifier.check_episode (what training and evaluation use);
  reference  assembled from bfcl-eval's own code only: its multi-turn inference loop
             (BaseHandler.inference_multi_turn_prompting, which Qwen models run) with its Qwen handler, which
             decodes each message and runs the calls through BFCL's eval-based executor, then
             eval_runner._evaluate_single_multi_turn_entry, which decodes every message again and runs
             multi_turn_checker. The one piece replaced is the model: its query is answered from the script.
An episode's script is, per user turn, the assistant messages to send; both sides send them in order until the
turn ends and answer "Done." if the script runs out first (a message that ends a turn early leaves the rest
unsent). The scripts are generated here from the ground truth, never taken from a model, so BFCL's eval() only
ever sees strings this module wrote. Verdicts must agree on every episode, except where the kit refuses on
purpose (REFUSAL_KINDS: code in a name or an argument key, which BFCL evals).

Both sides run under BFCL's names for the kit's model (seal_mini.envs.harness.BFCL_MODEL), and the reference
starts each inference and each scoring as a fresh process would: its instance caches emptied, its back-end
classes' default arguments as first seen. Each query's prompt is compared too: the one BFCL's handler formats
(its _format_prompt on its own chat history) against the kit's (the episode's messages written by
seal_mini.engine.render in `model.tool_format: bfcl`).

Importing eval_runner imports every model handler BFCL has, and with them API clients and parsers the kit does
not install; `reference_modules` imports it with those few packages stubbed (nothing in the multi-turn path
uses them).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import pickle
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace

from seal_mini.config import CATEGORIES, ConfigError, nonnegative
from seal_mini.core.diagnose import diagnose, reference
from seal_mini.core.faults import damaged, one_block, other_value
from seal_mini.envs.bfcl import V3_CLASSES, Task, foreign_tool_names, load_tasks, tasks_by_id, to_chat_tool
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import (
    BFCL_MODEL,
    GUARDS,
    PROTOCOLS,
    QWEN_FC,
    Protocol,
    _fresh_plan,
    bfcl_class,
    first_defaults,
    instance_name,
    source_literals,
)
from seal_mini.envs.scripted import DONE_TEXT, ground_truth_turns, play, play_messages
from seal_mini.envs.toolcalls import format_call
from seal_mini.envs.verifier import check_episode
from seal_mini.runio import FileError

Call = tuple[str, dict]
Script = list[list[str]]

# --- the reference: bfcl-eval's inference loop and scorer --------------------------------------------

INFERENCE_ONLY_PACKAGES = tuple(
    "anthropic cohere google.genai mistralai qwen_agent writerai datamodel_code_generator tree_sitter "
    "tree_sitter_java tree_sitter_javascript openai dotenv tenacity".split()
)
"""Packages BFCL's handlers import for API models and other languages' parsers; stubbed when absent."""


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an empty stand-in module for the absent packages above, while eval_runner is imported."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        from unittest import mock

        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module) -> None:
        pass


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@cache
def reference_modules() -> SimpleNamespace:
    """bfcl-eval's eval_runner, Qwen handler and data loaders (see the module docstring)."""
    if not _installed("overrides"):  # bfcl-eval's handlers need it; the kit's core does not
        raise ConfigError(
            "the differential runs BFCL's own handler, which needs the `overrides` package: "
            "pip install -r requirements-ood.txt (or `.venv/bin/pip install overrides`)"
        )
    missing = tuple(n for n in INFERENCE_ONLY_PACKAGES if not _installed(n))
    stubs = _Stubs(missing)
    sys.meta_path.insert(0, stubs)
    try:
        from bfcl_eval import utils
        from bfcl_eval.eval_checker import eval_runner
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.model_handler.local_inference.llama import LlamaHandler
        from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
    finally:
        sys.meta_path.remove(stubs)
        for name in [m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in missing)]:
            del sys.modules[name]  # later imports of these names fail as they would have
    return SimpleNamespace(
        utils=utils, eval_runner=eval_runner, multi_turn_utils=multi_turn_utils, qwen=QwenFCHandler, llama=LlamaHandler
    )


@cache
def _entries(category: str) -> dict[str, tuple[dict, list]]:
    """Task id -> (BFCL's test entry, ground truth), from BFCL's own loaders."""
    utils = reference_modules().utils
    entries = utils.load_dataset_entry(f"multi_turn_{category}")
    answers = {a["id"]: a["ground_truth"] for a in utils.load_ground_truth_entry(f"multi_turn_{category}")}
    return {e["id"]: (e, answers[e["id"]]) for e in entries}


class _ScriptedModel:
    """Stands in for the model of BFCL's handler: each query gets the script's next message, and the prompt
    the handler would have sent is kept."""

    def __init__(self, script: Script, handler):
        self.script, self.turn, self.sent, self.handler, self.prompts = script, -1, 0, handler, []

    def query(self, inference_data: dict):
        """What OSSHandler._query_prompting returns: (a completion response, latency)."""
        self.prompts.append(self.handler._format_prompt(inference_data["message"], inference_data["function"]))
        if inference_data["message"][-1]["role"] not in ("assistant", "tool", "ipython"):  # a new user turn began
            self.turn, self.sent = self.turn + 1, 0
        todo = self.script[self.turn]
        text = todo[self.sent] if self.sent < len(todo) else DONE_TEXT
        self.sent += 1
        usage = SimpleNamespace(prompt_tokens=0, completion_tokens=0)
        return SimpleNamespace(choices=[SimpleNamespace(text=text)], usage=usage), 0.0


@cache
def _handler(protocol: Protocol = QWEN_FC):
    """BFCL's handler for the protocol's model, the class its model config names: QwenFCHandler for Qwen2.5 in
    FC mode, LlamaHandler for ToolACE-2-8B."""
    if protocol is QWEN_FC:
        handler = reference_modules().qwen(BFCL_MODEL, 0.0, f"{BFCL_MODEL}-FC", True)
    else:
        handler = reference_modules().llama(protocol.model, 0.0, protocol.registry, False)
    assert handler.model_name_underline_replaced == protocol.instance_prefix, "the kit's instance names are not BFCL's"
    return handler


def _fresh_process() -> None:
    """What a new process has: no cached instances, every back-end default argument and module data as
    the source writes them (BFCL's inference and its scoring are separate runs)."""
    cache = vars(reference_modules().multi_turn_utils)
    prefixes = tuple(p.instance_prefix + "_" for p in PROTOCOLS.values())  # the checker's names start so too
    for key in [k for k in cache if k.startswith(prefixes)]:
        del cache[key]
    for class_name in V3_CLASSES:
        cls = bfcl_class(class_name)
        for name, defaults in first_defaults(cls).items():
            getattr(cls, name).__defaults__ = copy.deepcopy(defaults)
        # the module data as the source writes it, in the modules themselves (BFCL's TravelAPI drains
        # long_context.py's shared card balances)
        for module, blob in _fresh_plan(cls).data.items():
            vars(importlib.import_module(module)).update(pickle.loads(blob))


@dataclass
class Played:
    """What one side made of a scripted episode."""

    valid: bool
    error_type: str
    prompts: list[str]
    """The prompt of every model query, in order."""


def bfcl_verdict(task: Task, script: Script, protocol: Protocol = QWEN_FC) -> Played:
    """What BFCL's inference loop and eval_runner make of this scripted episode."""
    ref = reference_modules()
    entry, ground_truth = _entries(task.category)[task.id]
    handler = _handler(protocol)
    model = _ScriptedModel(script, handler)
    handler._query_prompting = model.query  # the model's one job, answered by the script
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the loop prints every step
            _fresh_process()
            try:
                responses, _ = handler.inference_multi_turn_prompting(copy.deepcopy(entry), False, True)
            except Exception as e:  # noqa: BLE001 - what BFCL's generation (multi_threaded_inference) records
                responses = f"Error during inference: {e}"
            _fresh_process()
            test_category = task.id.rsplit("_", 1)[0]
            result = ref.eval_runner._evaluate_single_multi_turn_entry(
                handler, task.id, responses, ground_truth, copy.deepcopy(entry), protocol.checker_model, test_category
            )
    finally:
        _fresh_process()  # BFCL never frees its instance caches
    return Played(
        bool(result["valid"]), "" if result["valid"] else result["error"].get("error_type", ""), model.prompts
    )


# --- the kit ------------------------------------------------------------------------------------------


def kit_verdict(task: Task, script: Script, protocol: Protocol = QWEN_FC) -> Played:
    """The same scripted episode through seal_mini's Episode, renderer and verifier."""
    from seal_mini.engine.render import bfcl_text, llama_text

    env = Episode(task, protocol=protocol)
    text = bfcl_text if protocol is QWEN_FC else llama_text
    prompts = play_script(env, script, lambda messages, tools: text(messages, tools, add_generation_prompt=True))
    verdict = check_episode(env)
    return Played(verdict.reward == 1.0, verdict.error_type, prompts)


def play_script(env, script: Script, prompt: Callable | None = None) -> list:
    """Send a script's messages turn by turn ("Done." where a turn's run out); returns prompt(messages,
    tools) of every query (nothing without `prompt`)."""
    prompts = []
    query = None if prompt is None else lambda messages, tools: prompts.append(prompt(messages, tools))
    play_messages(env, script, query)
    return prompts


# --- the battery ----------------------------------------------------------------------------------------
# A builder gets the task, its ground-truth calls per turn and a seeded rng, and returns a script, or
# None where the perturbation cannot be made in that task.


_WRITING: list[Protocol] = [QWEN_FC]
"""The protocol whose model the battery writes calls for (run_differential sets it)."""


def _message(calls: list[Call]) -> str:
    """The calls in one message, as the model of the protocol under test writes them."""
    return _WRITING[0].write(calls)


def _script(gt: list[list[Call]], turn: int | None = None, messages: list[str] | None = None) -> Script:
    """The ground truth (each turn's calls in one message), with turn `turn` replaced by `messages`."""
    out = [[_message(calls)] if calls else [] for calls in gt]
    if turn is not None:
        out[turn] = messages
    return out


def _turns_with(gt: list[list[Call]], least: int = 1) -> list[int]:
    return [k for k, calls in enumerate(gt) if len(calls) >= least]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _edit_call(edit: Callable[[Call, Task, random.Random], Call | None]):
    """A builder that changes one call of one turn (picked at random among those `edit` can change)."""

    def build(task, gt, rng):
        options = [(k, i) for k in _turns_with(gt) for i, c in enumerate(gt[k]) if edit(c, task, random.Random(0))]
        if not options:
            return None
        k, i = rng.choice(options)
        calls = list(gt[k])
        calls[i] = edit(calls[i], task, rng)
        return _script(gt, k, [_message(calls)])

    return build


def _one_argument(call: Call, keys: list[str], rng: random.Random, new_value: Callable) -> Call | None:
    """The call with one argument among `keys` (picked at random) set to new_value(its value); None without keys."""
    name, args = call
    if not keys:
        return None
    key = rng.choice(keys)
    return name, {**args, key: new_value(args[key])}


def _wrong_value(call, task, rng):
    keys = [k for k, v in call[1].items() if other_value(v, {}) is not None]
    return _one_argument(call, keys, rng, lambda v: other_value(v, {}))


def _wrong_type(call, task, rng):
    return _one_argument(call, sorted(call[1]), rng, lambda v: 404 if isinstance(v, str) else str(v))


def _unknown_argument(call, task, rng):
    return call[0], {**call[1], "not_a_parameter": 1}


def _missing_argument(call, task, rng):
    name, args = call
    docs = list(task.tools) + [d for ds in task.held_out.values() for d in ds]
    schema = next(to_chat_tool(d) for d in docs if d["name"] == name)["function"]["parameters"]
    required = [k for k in schema.get("required", []) if k in args]
    if not required:
        return None
    key = rng.choice(required)
    return name, {k: v for k, v in args.items() if k != key}


def _one_turn(least: int = 1):
    """A builder that replaces one turn with at least `least` calls (picked at random) by messages(task, calls,
    rng), which rewrites a copy of its calls (None where there is no such turn or messages gives None)."""

    def wrap(messages: Callable[[Task, list[Call], random.Random], list[str] | None]):
        def build(task, gt, rng):
            turns = _turns_with(gt, least)
            if not turns:
                return None
            k = rng.choice(turns)
            written = messages(task, list(gt[k]), rng)
            return None if written is None else _script(gt, k, written)

        return build

    return wrap


@_one_turn()
def _dropped(task, calls, rng):
    calls.pop(rng.randrange(len(calls)))
    return [_message(calls)] if calls else []


@_one_turn()
def _duplicated(task, calls, rng):
    i = rng.randrange(len(calls))
    calls.insert(i, calls[i])
    return [_message(calls)]


@_one_turn(least=2)
def _swapped(task, calls, rng):
    i = rng.randrange(len(calls) - 1)
    calls[i], calls[i + 1] = calls[i + 1], calls[i]
    return [_message(calls)]


@_one_turn(least=2)
def _reordered(task, calls, rng):
    return [_message(calls[::-1])]


def _stepwise(task, gt, rng):
    """One call per message, as an agent that reads each result before its next call."""
    return [[_message([c]) for c in calls] if len(calls) <= 20 else [_message(calls)] for calls in gt]


@_one_turn()
def _not_offered(task, calls, rng):
    """A real BFCL tool of a back end the task does not involve (BFCL's eval: name not defined)."""
    calls.insert(rng.randrange(len(calls) + 1), (rng.choice(foreign_tool_names(task)), {"x": 1}))
    return [_message(calls)]


def _withheld(before: bool):
    """miss_func: the held-out tool's reference call one turn before its reveal, or again one turn after."""

    def build(task, gt, rng):
        for reveal, docs in sorted(task.held_out.items()):
            names = {d["name"] for d in docs}
            uses = [c for calls in gt[reveal:] for c in calls if c[0] in names]
            k = reveal - 1 if before else reveal + 1
            if uses and 0 <= k < len(gt):
                return _script(gt, k, [_message(list(gt[k]) + [uses[0]])])
        return None

    return build


def _empty_turn_call(task, gt, rng):
    """A call on a turn whose ground truth makes none (the task's first reference call, or pwd)."""
    empty = [k for k, calls in enumerate(gt) if not calls]
    reads = [c for calls in gt for c in calls]
    if not empty or not reads:
        return None
    call = ("pwd", {}) if "GorillaFileSystem" in task.involved_classes else reads[0]
    return _script(gt, rng.choice(empty), [_message([call])])


@_one_turn()
def _malformed(task, calls, rng):
    blocks = [format_call(n, a) for n, a in calls]
    i = rng.randrange(len(blocks))
    blocks[i] = damaged(*calls[i], "broken")
    return ["\n".join(blocks)]


def _written(form: str):
    """A turn's calls written in another form: one_line, fenced_json, fenced_message, as_string, no_arguments,
    with_prose, think."""

    @_one_turn()
    def build(task, calls, rng):
        damage = form in ("one_line", "fenced_json", "as_string", "no_arguments")
        text = "\n".join(damaged(*c, form) if damage else format_call(*c) for c in calls)
        if form == "fenced_message":
            text = f"```\n{text}\n```"
        if form == "with_prose":
            text = f"Let me do that for you.\n{text}\nThat should be all."
        if form == "think":  # BFCL's Qwen handler drops everything up to </think>: these calls are never made
            text = f"<think>\nI will call:\n{text}\n</think>\n\nI have done it."
        return [text]

    return build


def _reasoning(task, gt, rng):
    """A thinking model (Qwen3-8B): a <think> block before each message's calls, one call a message. BFCL's
    prompts keep the reasoning of the messages since the last user turn and drop the earlier ones'."""
    think = lambda k, m: f"<think>\nTurn {k}: {rng.choice(['next', 'then', 'now'])} this.\n</think>\n\n{m}"  # noqa: E731
    return [[think(k, m) for m in messages] for k, messages in enumerate(_stepwise(task, gt, rng))]


@_one_turn(least=2)
def _two_in_one_block(task, calls, rng):
    return ["\n".join([one_block(calls[:2]), *(format_call(n, a) for n, a in calls[2:])])]


@_one_turn()
def _repaired(task, calls, rng):
    """A message whose calls are all broken, then the correct calls: BFCL ends the turn on the first."""
    return ["\n".join(damaged(*c, "broken") for c in calls), _message(calls), DONE_TEXT]


def _broken_only_call(task, gt, rng):
    """A read-only turn whose calls were made at the end of the turn before; in the turn itself the only
    call has an unknown argument. BFCL runs it (an error), so the turn is not empty and the outputs it
    needs are already there: it passes."""
    states = reference(task).states
    options = [k for k in range(1, len(gt)) if gt[k] and gt[k - 1] and states[k] == states[k - 1]]
    if not options:
        return None
    k = rng.choice(options)
    script = _script(gt, k - 1, [_message(list(gt[k - 1]) + list(gt[k]))])
    name, args = gt[k][0]
    script[k] = [_message([(name, {**args, "not_a_parameter": 1})])]
    return script


@_one_turn()
def _builtin(task, calls, rng):
    """A Python builtin as a tool: BFCL's eval calls it (and print(text=...) raises); the kit refuses it."""
    return [_message(calls + [("print", {"text": "done"})])]


def _non_finite(task, gt, rng):
    """A number written as 1e999: JSON reads infinity, BFCL writes it as inf, which eval cannot name."""
    options = [
        (k, i, key)
        for k in _turns_with(gt)
        for i, (_, args) in enumerate(gt[k])
        for key, v in args.items()
        if _is_number(v)
    ]
    if not options:
        return None
    k, i, key = rng.choice(options)
    calls = list(gt[k])
    calls[i] = (calls[i][0], {**calls[i][1], key: 10**400})
    return _script(gt, k, [_message(calls).replace("1" + "0" * 400, "1e999")])


def _step_limit(last: bool):
    """A turn's calls, then 20 more tool-calling messages (an unknown tool): BFCL force-quits the entry,
    which fails it unless this was its last turn."""

    def build(task, gt, rng):
        k = len(gt) - 1 if last else rng.randrange(len(gt) - 1) if len(gt) > 1 else None
        if k is None:
            return None
        noise = [_message([("no_such_tool", {"attempt": i})]) for i in range(20)]
        return _script(gt, k, ([_message(gt[k])] if gt[k] else [noise[0]]) + noise)

    return build


def _mention_method(call, task, rng):
    """A string argument that mentions a method: BFCL writes the instance's global name into it."""
    keys = sorted(k for k, v in call[1].items() if isinstance(v, str))
    return _one_argument(call, keys, rng, lambda v: f"{v} see {call[0]}(x)")


def _large_integer(call, task, rng):
    """A number beyond 2**53: a number all the same, which BFCL runs (where no guard refuses the call:
    costly_math_call plays those)."""
    name, args = call
    guard = GUARDS.get(name, lambda a: "")
    keys = sorted(k for k, v in args.items() if _is_number(v) and not guard({**args, k: 2**60}))
    return _one_argument(call, keys, rng, lambda v: 2**60)


def _code_in_name(call, task, rng):
    """A name that is code: BFCL's eval runs print(), then the call after `or`; the kit refuses it."""
    return f"print() or {call[0]}", call[1]


def _owner_class(task: Task, name: str) -> str:
    return next(c for c in task.involved_classes if hasattr(bfcl_class(c), name))


def _code_in_key(call, task, rng):
    """An argument key that is code spelling the call with its first argument positional, the rest cut off
    by a comment: BFCL's eval runs it; the kit refuses a positional argument."""
    name, args = call
    method = getattr(bfcl_class(_owner_class(task, name)), name)
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    if not args or not params or next(iter(args)) != params[0]:
        return None
    first, *rest = args.items()
    key = ",".join([repr(first[1])] + [f"{k}={v!r}" for k, v in rest]) + ")#"
    return name, {key: 0}


def _through_own_instance(call, task, rng):
    """A tool called through its instance's global name: BFCL's eval finds no such attribute on the
    instance (an AttributeError); the kit refuses an instance's name."""
    name, args = call
    return f"{instance_name(_WRITING[0].instance_prefix, task.id, _owner_class(task, name))}.{name}", args


def _checker_instance(task, gt, rng):
    """A read-only attribute chain on the checker's ground-truth instance, added to a later turn: undefined
    while BFCL's loop plays (a NameError on both sides), defined when its scorer evals it there (a string
    comes back); the kit's checker gets a stand-in, and the verdict is the same."""
    options = [k for k in _turns_with(gt) if k > 0]
    if not options:
        return None
    k = rng.choice(options)
    checker = _WRITING[0].checker_model
    target = instance_name(f"{checker}_ground_truth_eval", task.id, rng.choice(task.involved_classes))
    return _script(gt, k, [_message([(f"{target}.__class__.__name__.upper", {})] + list(gt[k]))])


COSTLY_CALLS = (
    ("power", {"base": 3, "exponent": 2**20 + 1}),
    ("logarithm", {"value": 10, "base": 2, "precision": 10_001}),
    ("square_root", {"number": 2, "precision": 10_001}),
    ("round_number", {"number": 7, "decimal_places": -10_001}),
)
"""Calls just past the harness's GUARDS, which BFCL still finishes in a fraction of a second."""


@_one_turn()
def _costly(task, calls, rng):
    """A guarded math call added to a turn (the kit refuses it, BFCL runs it)."""
    if "MathAPI" not in task.involved_classes:
        return None
    return [_message(calls + [rng.choice(COSTLY_CALLS)])]


def _posts_without(gt, key: str) -> list[tuple[int, int]]:
    return [
        (k, i) for k, calls in enumerate(gt) for i, (n, a) in enumerate(calls) if n == "post_tweet" and key not in a
    ]


def _explicit_empty_lists(task, gt, rng):
    """Every post_tweet the ground truth makes without tags or mentions, given empty lists for them."""
    if not _posts_without(gt, "mentions") and not _posts_without(gt, "tags"):
        return None
    edited = [[(n, {"tags": [], "mentions": [], **a} if n == "post_tweet" else a) for n, a in calls] for calls in gt]
    return _script(edited)


def _mention_own_post(task, gt, rng):
    """The ground truth, plus, at the start of the next turn, a mention in a tweet it posted without
    mentions. In BFCL's fresh process the model's tweet and the ground truth's hold the same default list,
    so both get the mention and the states still agree; back ends that did not share it would differ."""
    outputs = reference(task).outputs
    options = [
        (k, i) for k, i in _posts_without(gt, "mentions") if k + 1 < len(gt) and "id" in json.loads(outputs[k][i])
    ]
    if not options:
        return None
    k, i = rng.choice(options)
    mention = ("mention", {"tweet_id": json.loads(outputs[k][i])["id"], "mentioned_usernames": ["@extra"]})
    return _script(gt, k + 1, [_message([mention, *gt[k + 1]])])


def _play_first_turn(task: Task, calls: list[Call]) -> None:
    """Play an episode of the task (these calls in its first turn, none after), check and diagnose it, as
    training does in the same process."""
    episode = Episode(task)
    play(episode, [calls] + [[] for _ in task.turns[1:]])
    diagnose(episode, check_episode(episode))


def _grow_shared_default() -> None:
    """An episode that posts a tweet without mentions and then mentions in it: in a process whose back ends
    shared post_tweet's default list, later tweets would carry the mention."""
    task = tasks_by_id(["base"])["multi_turn_base_5"]
    login = {k: task.initial_config["TwitterAPI"][k] for k in ("username", "password")}
    calls = [
        ("authenticate_twitter", login),
        ("post_tweet", {"content": "x"}),
        ("mention", {"tweet_id": 0, "mentioned_usernames": ["@a"]}),
    ]
    _play_first_turn(task, calls)


LONG_CONTEXT = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.long_context"


def _card_booking(task, gt, rng):
    """A flight booked on one of long_context.py's credit cards before a turn's calls. TravelAPI puts those
    cards into its instances as they are: BFCL's scorer gives the model's and the ground truth's instances
    the same card objects, so the model's booking drains the balance the ground truth's bookings then meet."""
    if not task.long_context or "TravelAPI" not in task.involved_classes:
        return None
    token = task.initial_config.get("TravelAPI", {}).get("access_token")
    k = next(iter(_turns_with(gt)), None)
    if token is None or k is None:
        return None
    booking = {
        "access_token": token,
        "card_id": rng.choice(sorted(source_literals(LONG_CONTEXT)["CREDIT_CARD_EXTENSION"])),
        "travel_date": "2026-12-25",
        "travel_from": "SFO",
        "travel_to": "LAX",
        "travel_class": rng.choice(["economy", "business", "first"]),
    }
    return _script(gt, k, [_message([("book_flight", booking), *gt[k]])])


def _drain_shared_card() -> None:
    """An episode that books first-class flights on a long_context.py card: in a process whose back ends
    shared those cards, later episodes would meet a drained balance."""
    task = tasks_by_id(["long_context"])["multi_turn_long_context_198"]
    token = task.initial_config["TravelAPI"]["access_token"]
    booking = {"access_token": token, "card_id": "1234567812345678", "travel_date": "2026-12-25"}
    booking |= {"travel_from": "SFO", "travel_to": "LAX", "travel_class": "first"}
    _play_first_turn(task, [("book_flight", booking)] * 3)


BEFORE_KIT: dict[str, Callable[[], None]] = {
    "explicit_empty_lists_after_shared_default_grew": _grow_shared_default,
    "card_booking_after_a_card_was_drained": _drain_shared_card,
}
"""Kinds whose kit side first plays another episode in the same process (the reference is a fresh process)."""

# --- the battery for Python call lists (BFCL's LlamaHandler: ToolACE-2) ---------------------------------


def _python(call: Call, positional: int = 0, value=repr) -> str:
    """One call in Python syntax, its first `positional` arguments without their keys, each value written by `value`."""
    name, args = call
    items = list(args.items())
    parts = [value(v) for _, v in items[:positional]] + [f"{k}={value(v)}" for k, v in items[positional:]]
    return f"{name}({', '.join(parts)})"


def _call_list(write: Callable[[list[Call], random.Random], str | None]):
    """A builder that writes one turn's calls as `write` does (None where it cannot)."""

    def build(task, gt, rng):
        options = [k for k in _turns_with(gt) if write(gt[k], random.Random(0)) is not None]
        if not options:
            return None
        k = rng.choice(options)
        return _script(gt, k, [write(gt[k], rng)])

    return build


def _positional(calls, rng):
    """The first call with its first argument written positionally: BFCL's decoder keeps keyword arguments
    only, so the back end misses that one."""
    if not calls[0][1]:
        return None
    return "[" + ", ".join([_python(calls[0], positional=1), *(_python(c) for c in calls[1:])]) + "]"


def _rewritten(picks: Callable[[object], bool], write: Callable[[object], str]):
    """A call list in Python syntax with each value that `picks` written by `write` (None where it picks none)."""

    def text(calls, rng):
        if not any(picks(v) for _, a in calls for v in a.values()):
            return None
        return "[" + ", ".join(_python(c, value=lambda v: write(v) if picks(v) else repr(v)) for c in calls) + "]"

    return text


PYTHON_KINDS: dict[str, Callable] = {
    "call_list_without_brackets": _call_list(lambda calls, rng: ", ".join(_python(c) for c in calls)),
    "call_list_with_prose": _call_list(lambda calls, rng: f"I will do that now. {_message(calls)}"),
    "call_list_fenced": _call_list(lambda calls, rng: f"```python\n{_message(calls)}\n```"),
    "call_list_in_backticks": _call_list(lambda calls, rng: f"`{_message(calls)}`"),
    "call_list_positional_argument": _call_list(_positional),
    # lists written as tuples: BFCL's decoder keeps them tuples, so the back end gets tuples
    "call_list_tuples_for_lists": _call_list(_rewritten(lambda v: isinstance(v, list), lambda v: repr(tuple(v)))),
    # a positive number written +N: BFCL's decoder negates any unary operand, so the back end gets -N
    "call_list_unary_plus": _call_list(_rewritten(lambda v: _is_number(v) and v > 0, lambda v: f"+{v!r}")),
    # string arguments that are identifiers written without quotes: BFCL's decoder reads a name as its text
    "call_list_bare_names": _call_list(_rewritten(lambda v: isinstance(v, str) and v.isidentifier(), str)),
    # a number written as an operation (N + 0): BFCL's decoder eval()s it and runs the call; the kit evaluates no
    # model text, so the message does not decode and the turn ends
    "call_list_operation": _call_list(
        _rewritten(lambda v: isinstance(v, int) and not isinstance(v, bool), lambda v: f"{v!r} + 0")
    ),
}
"""Ways of writing a Python call list that BFCL's LlamaHandler reads in its own way (llama_prompt only)."""

QWEN_ONLY = tuple(
    "malformed_json one_line_tags fenced_json fenced_message two_objects_one_block parse_error_then_repair "
    "arguments_as_string no_arguments_key prose_around_calls think_block reasoning_before_calls code_in_name "
    "code_in_key".split()
)
"""Kinds about <tool_call> JSON blocks (qwen_fc only)."""

PERTURBATIONS: dict[str, Callable] = {
    "ground_truth": lambda task, gt, rng: _script(gt),
    "ground_truth_stepwise": _stepwise,
    "dropped_call": _dropped,
    "duplicated_call": _duplicated,
    "swapped_calls": _swapped,
    "reordered_calls": _reordered,
    "wrong_value": _edit_call(_wrong_value),
    "unknown_argument": _edit_call(_unknown_argument),
    "missing_argument": _edit_call(_missing_argument),
    "wrong_type": _edit_call(_wrong_type),
    "tool_not_offered": _not_offered,
    "withheld_before_reveal": _withheld(before=True),
    "withheld_after_reveal": _withheld(before=False),
    "call_on_empty_turn": _empty_turn_call,
    "malformed_json": _malformed,
    "one_line_tags": _written("one_line"),
    "fenced_json": _written("fenced_json"),
    "fenced_message": _written("fenced_message"),
    "two_objects_one_block": _two_in_one_block,
    "parse_error_then_repair": _repaired,
    "arguments_as_string": _written("as_string"),
    "no_arguments_key": _written("no_arguments"),
    "prose_around_calls": _written("with_prose"),
    "think_block": _written("think"),
    "reasoning_before_calls": _reasoning,
    "broken_only_call": _broken_only_call,
    "python_builtin": _builtin,
    "non_finite_number": _non_finite,
    "step_limit_before_last_turn": _step_limit(last=False),
    "step_limit_in_last_turn": _step_limit(last=True),
    "method_name_in_string": _edit_call(_mention_method),
    "large_integer": _edit_call(_large_integer),
    "explicit_empty_lists": _explicit_empty_lists,
    "explicit_empty_lists_after_shared_default_grew": _explicit_empty_lists,
    "mention_own_default_post": _mention_own_post,
    "costly_math_call": _costly,
    "code_in_name": _edit_call(_code_in_name),
    "code_in_key": _edit_call(_code_in_key),
    "call_through_instance_name": _edit_call(_through_own_instance),
    "checker_instance_attribute": _checker_instance,
    "long_context_card_booking": _card_booking,
    "card_booking_after_a_card_was_drained": _card_booking,
    **PYTHON_KINDS,
}
KINDS = {
    "qwen_fc": tuple(k for k in PERTURBATIONS if k not in PYTHON_KINDS),
    "llama_prompt": tuple(k for k in PERTURBATIONS if k not in QWEN_ONLY),
}
"""The kinds each protocol's battery plays."""
REFUSAL_KINDS = tuple(
    "python_builtin costly_math_call code_in_name code_in_key call_through_instance_name call_list_operation".split()
)
"""Kinds with a call the kit refuses on purpose (it never eval()s model text, and runs nothing that could
keep it busy for hours): the refused call's output is the kit's own line, so prompts differ from the
refusal on, and verdicts may differ; README counts them."""
CI_KINDS = (
    "ground_truth",
    "dropped_call",
    "wrong_value",
    "call_on_empty_turn",  # BFCL never runs its irrelevance checker on multi-turn entries
    "withheld_before_reveal",  # BFCL runs any public method, offered or not
    "broken_only_call",  # BFCL runs and scores calls that break the schema
    "one_line_tags",  # BFCL's decoder wants the tags on lines of their own
    "parse_error_then_repair",  # BFCL ends the turn on a message it cannot decode
    "step_limit_in_last_turn",  # a force quit fails an entry only if a turn is left unplayed
    "method_name_in_string",  # BFCL's instance names, under which a verdict is one verdict
    "large_integer",  # a number is a number
    "explicit_empty_lists_after_shared_default_grew",  # no back-end state survives an episode
    "mention_own_default_post",  # within a check the model's and the ground truth's back ends share defaults
    "long_context_card_booking",  # ... and module data (long_context.py's cards), which no episode may drain
    "card_booking_after_a_card_was_drained",
)
"""The kinds the test suite plays (tests/test_differential.py says on which tasks; the command plays all of them)."""


@dataclass
class Tally:
    episodes: int = 0
    agree: int = 0
    kit_passed: int = 0
    bfcl_passed: int = 0
    same_prompts: int = 0
    """Episodes where every query's prompt is the same text on both sides."""
    disagreements: list = field(default_factory=list)
    prompt_differences: list = field(default_factory=list)


def first_difference(kit: list[str], bfcl: list[str]) -> str:
    """Where two lists of prompts first differ, in a few words ("" if they do not)."""
    if kit == bfcl:
        return ""
    for n, (a, b) in enumerate(zip(kit, bfcl, strict=False)):
        if a != b:
            at = next(i for i in range(min(len(a), len(b)) + 1) if i == min(len(a), len(b)) or a[i] != b[i])
            return f"query {n}, char {at}: kit {a[max(0, at - 30) : at + 50]!r}, BFCL {b[max(0, at - 30) : at + 50]!r}"
    return f"kit made {len(kit)} queries, BFCL {len(bfcl)}"


def run_differential(
    kinds=KINDS["qwen_fc"],
    categories=CATEGORIES,
    limit: int = 0,
    seed: int = 0,
    protocol: str = "qwen_fc",
    every: int = 1,
) -> dict:
    """Per kind: episodes, agreements, passes on each side, same prompts, and the first differences (of the
    tasks whose index is below `limit`, if set, and a multiple of `every`)."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol {protocol}: choose from {', '.join(PROTOCOLS)}")
    unknown = [k for k in kinds if k not in KINDS[protocol]]
    if unknown:
        raise ConfigError(f"--kinds: no kinds {unknown} for {protocol}; its kinds: {', '.join(KINDS[protocol])}")
    _WRITING[0] = PROTOCOLS[protocol]
    try:
        return _run(kinds, categories, limit, seed, PROTOCOLS[protocol], every)
    finally:
        _WRITING[0] = QWEN_FC


def _run(kinds, categories, limit: int, seed: int, protocol: Protocol, every: int) -> dict:
    start = time.perf_counter()
    tallies = {kind: Tally() for kind in kinds}
    for task in load_tasks(categories):
        if (limit and task.index >= limit) or task.index % every:
            continue
        gt = ground_truth_turns(task)
        for kind in kinds:
            script = PERTURBATIONS[kind](task, gt, random.Random(f"{seed}:{task.id}:{kind}"))
            if script is None:
                continue
            BEFORE_KIT.get(kind, lambda: None)()
            kit, bfcl = kit_verdict(task, script, protocol), bfcl_verdict(task, script, protocol)
            t = tallies[kind]
            t.episodes += 1
            t.agree += kit.valid == bfcl.valid
            t.kit_passed += kit.valid
            t.bfcl_passed += bfcl.valid
            if kit.valid != bfcl.valid and len(t.disagreements) < 5:
                t.disagreements.append(
                    f"{task.id}: kit {kit.valid} {kit.error_type}, BFCL {bfcl.valid} {bfcl.error_type}"
                )
            difference = first_difference(kit.prompts, bfcl.prompts)
            t.same_prompts += not difference
            if difference and len(t.prompt_differences) < 5:
                t.prompt_differences.append(f"{task.id}: {difference}")
    out = {kind: vars(t) for kind, t in tallies.items()}
    return {"kinds": out, "seconds": round(time.perf_counter() - start, 1)}


def print_report(result: dict) -> None:
    print(f"{'perturbation':<46} {'episodes':>8} {'agree':>7} {'kit pass':>9} {'BFCL pass':>10} {'same prompts':>13}")
    for kind, t in result["kinds"].items():
        print(
            f"{kind:<46} {t['episodes']:>8} {t['agree']:>7} {t['kit_passed']:>9} {t['bfcl_passed']:>10}"
            f" {t['same_prompts']:>13}"
        )
        for line in t["disagreements"]:
            print(f"    disagree: {line}")
        for line in t["prompt_differences"]:
            print(f"    prompt: {line}")
    kinds = result["kinds"].values()
    total, agree = sum(t["episodes"] for t in kinds), sum(t["agree"] for t in kinds)
    same = sum(t["same_prompts"] for t in kinds)
    print(f"{'all':<46} {total:>8} {agree:>7} {'':>9} {'':>10} {same:>13}   ({result['seconds']} s)")


def positive(text: str) -> int:
    """The argparse type of --every: an integer >= 1."""
    value = nonnegative(text)
    if not value:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tests/differential.py", description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", default="qwen_fc", choices=list(PROTOCOLS), help="the BFCL handler to compare")
    parser.add_argument("--kinds", nargs="+", help="perturbation kinds (default: all of the protocol's)")
    parser.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)
    parser.add_argument("--limit", type=nonnegative, default=0, help="only task indices below this in each category")
    parser.add_argument("--every", type=positive, default=1, help="only task indices that are multiples of this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        reference_modules()  # a missing package is one line now, not a traceback after the first task
        kinds = args.kinds or KINDS[args.protocol]
        result = run_differential(kinds, args.categories, args.limit, args.seed, args.protocol, args.every)
    except (ConfigError, FileError, OSError) as e:  # a wrong option, a damaged file, a full disk: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(result)
    print(json.dumps(result))
    # a refused call's output is the kit's own line, so a refusal kind's prompts and verdicts may differ
    held = [t for kind, t in result["kinds"].items() if kind not in REFUSAL_KINDS]
    return 0 if all(t["agree"] == t["same_prompts"] == t["episodes"] for t in held) else 1


if __name__ == "__main__":  # from the project's folder, with the package on the path (PYTHONPATH=.)
    sys.exit(main(sys.argv[1:]))
