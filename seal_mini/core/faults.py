"""Faults injected into ground-truth episodes: each kind makes one turn fail in a way a label names.

`plan(task)` lays out a task's reference calls; a builder (BUILDERS[kind]) rewrites one turn of that plan
into the assistant messages of a faulty turn, or says the fault cannot be made there. diagnose-check
uses them to prove the diagnoser (the label at the faulted turn must be the fault's expected label); the
warm start (seal_mini.training.sft) uses them to show the model failures the diagnoser can name.
"""

from __future__ import annotations

import copy
import json

from seal_mini.config import EnvConfig
from seal_mini.envs.bfcl import Task, foreign_tool_names, to_chat_tool
from seal_mini.envs.episode import call_directly, new_instances, public_methods, public_state
from seal_mini.envs.scripted import DONE_TEXT, PlannedCall, ground_truth_effects
from seal_mini.envs.toolcalls import CLOSE, OPEN, ToolCall, format_call, validate_call
from seal_mini.labels import REGISTRY, RegistryError

FAULTS: dict[str, tuple[str, str]] = REGISTRY.faults
"""Fault kind -> (expected label at the faulted turn, what is injected); declared with the labels
(seal_mini/labels.py). Each kind needs its builder in BUILDERS below."""
MAX_MESSAGES_PER_TURN = EnvConfig().max_calls_per_turn
"""BFCL's per-turn limit on tool-calling messages; a longer turn is scripted with several calls per message."""


# --- what each ground-truth call does -----------------------------------------------------------------


plan = ground_truth_effects
"""The ground truth's calls per turn (PlannedCall), each marked by whether it changes the public state."""


def _offered(task: Task, turn: int) -> dict[str, dict]:
    """Tool name -> chat-template tool of the tools offered at a turn (held-out ones from their reveal)."""
    docs = list(task.tools) + [d for t, ds in task.held_out.items() if t <= turn for d in ds]
    return {d["name"]: to_chat_tool(d) for d in docs}


def offered_schemas(task: Task, turn: int) -> dict[str, dict]:
    """Tool name -> JSON-schema parameters of the tools offered at a turn."""
    return {name: tool["function"]["parameters"] for name, tool in _offered(task, turn).items()}


def _fits(task: Task, turn: int, calls: list[PlannedCall]) -> list[bool]:
    """Whether each call fits the tools offered at a turn (offered, arguments as the schema says)."""
    tools = _offered(task, turn)
    out = []
    for c in calls:
        checked = validate_call({"name": c.name, "arguments": c.arguments}, tools)
        out.append(isinstance(checked, ToolCall) and not checked.violation)
    return out


def _clean(task: Task, p: list[list[PlannedCall]], turn: int) -> list[int]:
    """Calls of the turn that fit the tools offered at that turn. A few reference calls break the
    schema themselves (a string ticket id; a held-out tool used before its reveal): a fault is only
    injected into a clean call, so that it is the one problem of its turn."""
    return [i for i, ok in enumerate(_fits(task, turn, p[turn])) if ok]


# --- fault builders: (task, plan, turn, rng) -> (the turn's <tool_call> blocks, note), or None where the
# fault cannot be made at that turn. The turn ends with a final answer; every other turn replays the
# ground truth.


def call_blocks(calls: list[tuple[str, dict]]) -> list[str]:
    return [format_call(n, a) for n, a in calls]


# --- damaged calls: how a model writes a call wrong (these builders' and tests/differential.py's) --------


def damaged(name: str, arguments: dict, how: str) -> str:
    """One call's block written wrong: `broken` (its closing brace missing), `one_line` (the tags on the
    JSON's line), `fenced_json` (a code fence inside the tags), `as_string` (the arguments one JSON string),
    `no_arguments` (no "arguments" key). BFCL's decoder drops the first three without a word."""
    body = json.dumps({"name": name, "arguments": arguments})
    return {
        "broken": f"{OPEN}\n{body[:-1]}\n{CLOSE}",
        "one_line": f"{OPEN}{body}{CLOSE}",
        "fenced_json": f"{OPEN}\n```json\n{body}\n```\n{CLOSE}",
        "as_string": f"{OPEN}\n{json.dumps({'name': name, 'arguments': json.dumps(arguments)})}\n{CLOSE}",
        "no_arguments": f"{OPEN}\n{json.dumps({'name': name})}\n{CLOSE}",
    }[how]


def one_block(calls: list[tuple[str, dict]]) -> str:
    """Several calls' JSON objects in one block (BFCL's decoder drops the block)."""
    objects = "\n".join(json.dumps({"name": n, "arguments": a}) for n, a in calls)
    return f"{OPEN}\n{objects}\n{CLOSE}"


def other_value(value, spec: dict):
    """Another value of the same JSON type (inside the enum when there is one), or None."""
    if "enum" in spec:
        others = [v for v in spec["enum"] if v != value]
        return others[0] if others else None
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list) and value:
        return value[:-1] if len(value) > 1 else [other_value(value[0], {})]
    return None


def turn_messages(blocks: list[str], parallel: bool = False, final: str | None = DONE_TEXT) -> list[str]:
    """A turn's assistant messages: one call per message, as an agent that reads each result before
    its next call (parallel: all calls in one message, as the oracle scripts), then the final answer."""
    # A turn needing more calls than the per-turn message limit (a few long_context turns) can only
    # be done with several calls per message.
    parallel = parallel or len(blocks) > MAX_MESSAGES_PER_TURN
    calls = (["\n".join(blocks)] if parallel else list(blocks)) if blocks else []
    return calls + ([final] if final is not None else [])


def as_pairs(calls: list[PlannedCall]) -> list[tuple[str, dict]]:
    return [(c.name, dict(c.arguments)) for c in calls]


def _not_offered(task, p, turn, rng):
    if not p[turn]:
        return None
    calls = as_pairs(p[turn])
    i = rng.randrange(len(calls))
    # miss_func: a held-out tool called (with the arguments the ground truth later gives it) before
    # its reveal. Elsewhere: a real BFCL tool of a back end the task does not involve.
    for reveal, docs in sorted(task.held_out.items()):
        names = {d["name"] for d in docs}
        later = [c for calls_ in p[reveal:] for c in calls_ if c.name in names]
        if turn < reveal and later:
            calls[i] = (later[0].name, dict(later[0].arguments))
            return call_blocks(calls), f"held-out {later[0].name} before its reveal"
    offered = {d["name"] for d in task.tools} | {d["name"] for ds in task.held_out.values() for d in ds}
    foreign = [name for name in foreign_tool_names(task) if name not in offered]
    calls[i] = (rng.choice(foreign), calls[i][1])
    return call_blocks(calls), f"{calls[i][0]} instead of {p[turn][i].name}"


def _argument_fault(pick):
    """A builder that changes one call's arguments: pick(call, schema, rng) -> (arguments, note) or None."""

    def build(task, p, turn, rng):
        schemas = offered_schemas(task, turn)
        options = [i for i in _clean(task, p, turn) if pick(p[turn][i], schemas[p[turn][i].name], None)]
        if not options:
            return None
        i = rng.choice(options)
        calls = as_pairs(p[turn])
        arguments, note = pick(p[turn][i], schemas[calls[i][0]], rng)
        calls[i] = (calls[i][0], arguments)
        return call_blocks(calls), f"{calls[i][0]}: {note}"

    return build


def _choose(options: list, rng):
    """rng.choice, or the first option when only asked whether there is one (rng None)."""
    return options[0] if rng is None else rng.choice(options)


def _drop_required(call, schema, rng):
    present = [a for a in schema.get("required", []) if a in call.arguments]
    if not present:
        return None
    arg = _choose(present, rng)
    return {k: v for k, v in call.arguments.items() if k != arg}, f"without {arg}"


_OTHER_TYPE = {"string": 404, "integer": "7", "number": "7.5", "boolean": "yes", "array": "x", "object": "x"}


def _retype(call, schema, rng):
    props = schema.get("properties", {})
    typed = [a for a in call.arguments if props.get(a, {}).get("type") in _OTHER_TYPE]
    if not typed:
        return None
    arg = _choose(typed, rng)
    value = _OTHER_TYPE[props[arg]["type"]]
    return {**call.arguments, arg: value}, f"{arg} as {type(value).__name__}"


def _revalue(call, schema, rng):
    if not call.changes_state:
        return None
    props = schema.get("properties", {})
    options = [a for a, v in call.arguments.items() if other_value(v, props.get(a, {})) is not None]
    if not options:
        return None
    arg = _choose(options, rng)
    return {**call.arguments, arg: other_value(call.arguments[arg], props.get(arg, {}))}, f"{arg} changed"


def _near_miss(call, schema, rng):
    """An argument with allowed values (an enum) gets a near miss outside them: another case, a plural; what a
    model writes that copied the word from the request ("start" for START)."""
    props = schema.get("properties", {})
    options = {}
    for arg, value in call.arguments.items():
        allowed = props.get(arg, {}).get("enum")
        if isinstance(value, str) and allowed:
            misses = [m for m in (value.lower(), value.upper(), value.capitalize(), value + "s") if m not in allowed]
            options[arg] = misses[0]
    if not options:
        return None
    arg = _choose(sorted(options), rng)
    return {**call.arguments, arg: options[arg]}, f"{arg}={options[arg]!r} (allowed: {props[arg]['enum']})"


def _final_reads(calls: list[PlannedCall]) -> list[int]:
    """Read-only calls after which the turn calls nothing else of the same back end: leaving one out or
    making it fail touches the turn's outputs only, not a later call through hidden state (a `cd`
    moves the file system's private working directory and every later file call with it)."""
    return [
        i for i, c in enumerate(calls) if not c.changes_state and not any(d.owner == c.owner for d in calls[i + 1 :])
    ]


def _drop(want_state: bool):
    def build(task, p, turn, rng):
        calls = p[turn]
        if len(calls) < 2:  # leaving out the only call would make a missing_tool_call instead
            return None
        options = [i for i, c in enumerate(calls) if c.changes_state] if want_state else _final_reads(calls)
        if not options:
            return None
        kept = as_pairs(calls)
        dropped = kept.pop(rng.choice(options))
        return call_blocks(kept), f"{dropped[0]} left out"

    return build


def _changing_here(task: Task, p: list[list[PlannedCall]], turn: int, i: int, candidates: list[PlannedCall]):
    """The candidates that change their back end's public state when run in place of call i of the turn,
    after the ground truth up to it (a call that changed state at its own turn may not here: a login
    already done, a precondition not met yet)."""
    instances = _replayed(task, [c for calls in p[:turn] for c in calls] + p[turn][:i])
    out = []
    for c in candidates:
        method = public_methods(copy.deepcopy(instances))[c.name]
        before = copy.deepcopy(public_state(method.__self__))
        try:
            method(**copy.deepcopy(c.arguments))
        except Exception:  # noqa: BLE001 - a raising call changes nothing
            continue
        if public_state(method.__self__) != before:
            out.append(c)
    return out


def _other_instance(task, p, turn, rng):
    """One state-changing call of the turn is replaced by a state-changing call the ground truth makes at
    another turn on a back end this turn does not use: the wrong object is acted on."""
    targets = [i for i in _clean(task, p, turn) if p[turn][i].changes_state]
    if not targets:
        return None
    left_alone = {c.owner for calls in p for c in calls} - {c.owner for c in p[turn]}
    pool = [c for t, calls in enumerate(p) if t != turn for c in calls if c.changes_state and c.owner in left_alone]
    pool = [c for c, ok in zip(pool, _fits(task, turn, pool), strict=True) if ok]
    if not pool:
        return None
    i = rng.choice(targets)
    pool = _changing_here(task, p, turn, i, pool)
    if not pool:
        return None
    other = rng.choice(pool)
    calls = as_pairs(p[turn])
    calls[i] = (other.name, dict(other.arguments))
    return call_blocks(calls), f"{other.name} ({other.owner}) instead of {p[turn][i].name}"


def _spurious(task, p, turn, rng):
    """A call on a turn that needs none, picked among the task's state-changing calls that change the state
    at this point, so the checker fails it (it passes a call that changes nothing)."""
    if p[turn]:
        return None
    offered = offered_schemas(task, turn)
    pool = _changing_here(task, p, turn, 0, [c for calls in p for c in calls if c.name in offered and c.changes_state])
    if not pool:
        return None
    c = rng.choice(pool)
    return call_blocks([(c.name, dict(c.arguments))]), f"{c.name} called"


def _guess(value):
    """What a model that does not ask writes for a value the user has not given yet ("untitled", 1)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        stem, dot, ext = value.rpartition(".")
        guess = f"untitled.{ext}" if dot and stem and ext.isalnum() else "untitled"
        return guess if guess != value else "new"
    if isinstance(value, (int, float)):
        return type(value)(2 if value == 1 else 1)
    return None


def _user_text(task: Task, turn: int) -> str:
    return " ".join(str(m.get("content", "")) for m in task.turns[turn] if m.get("role") == "user")


def _guessed(task, p, turn, rng):
    """Where the user left a value out (a turn that needs no call, whose next turn gives the value), the next
    turn's calls made now, with a guess for the value the next turn gives: the checker fails the changed state."""
    if p[turn] or turn + 1 >= len(p) or not any(c.changes_state for c in p[turn + 1]):
        return None
    offered = offered_schemas(task, turn)
    later, earlier = _user_text(task, turn + 1), " ".join(_user_text(task, t) for t in range(turn + 1))
    calls, guessed = as_pairs(p[turn + 1]), []
    for k, (name, arguments) in enumerate(calls):
        given = [a for a, v in arguments.items() if str(v) in later and str(v) not in earlier and _guess(v) is not None]
        arg = rng.choice(given) if given and name in offered else None
        if arg is not None:
            calls[k] = (name, {**arguments, arg: _guess(arguments[arg])})
            guessed.append(f"{name}({arg}={calls[k][1][arg]!r})")
        # every other text value must be one the user has said: a value only a lookup's output gives (a user
        # id, a stock symbol) would be copied from nowhere, and the guess spreads to it
        if any(isinstance(v, str) and v not in earlier for a, v in arguments.items() if a != arg):
            return None
    if not guessed or any(name not in offered for name, _ in calls):
        return None
    return call_blocks(calls), "guessed " + ", ".join(guessed)


def _no_call(task, p, turn, rng):
    return ([], "answered without a call") if p[turn] else None


def _hesitant(task, p, turn, rng):
    first = next((i for i, calls in enumerate(p) if calls), None)
    return ([], "the first request that needs a call answered without it") if turn == first else None


def _replayed(task: Task, calls: list[PlannedCall]) -> dict[str, object]:
    """A task's fresh back ends after running `calls` on them (a call that raises, as in an episode)."""
    instances = new_instances(task)
    methods = public_methods(instances)
    for c in calls:
        call_directly(methods, c.name, c.arguments)
    return instances


def _run_turn(task: Task, p: list[list[PlannedCall]], turn: int, calls: list[tuple[str, dict]]):
    """The ground truth of the turns before `turn`, then `calls`: each call's outcome (call_directly) and the
    public state after them."""
    instances = _replayed(task, [c for earlier in p[:turn] for c in earlier])
    methods = public_methods(instances)
    outcomes = [call_directly(methods, name, arguments) for name, arguments in calls]
    return outcomes, {cls: public_state(instance) for cls, instance in instances.items()}


def _without(calls: list, i: int) -> list:
    return calls[:i] + calls[i + 1 :]


def _needed_by(task, p, turn, i: int, state_changing: bool) -> list[int]:
    """Later calls of the turn whose outcome changes when call i is left out (i is their precondition: a cd
    before a file call, a brake before the engine), among the state-changing ones or the final reads."""
    calls = as_pairs(p[turn])
    reference, _ = _run_turn(task, p, turn, calls)
    without, _ = _run_turn(task, p, turn, _without(calls, i))
    pool = [j for j, c in enumerate(p[turn]) if c.changes_state] if state_changing else _final_reads(p[turn])
    return [j for j in pool if j > i and without[j - 1] != reference[j]]


def _skipped_precondition(task, p, turn, rng):
    """A call that a later state-changing call of the turn needs is left out: that call then fails or acts
    elsewhere, and the state differs."""
    options = [i for i in range(len(p[turn]) - 1) if _needed_by(task, p, turn, i, state_changing=True)]
    if not options:
        return None
    i = rng.choice(options)
    return call_blocks(_without(as_pairs(p[turn]), i)), f"{p[turn][i].name} skipped"


def _failing_read(task, p, turn, rng):
    """A final read of the turn made to fail, as (the turn's calls with it failing, index of the failing call,
    the calls that repair it, note), or None: its precondition (a call that changes no public state, such as
    a cd) left out, else one of its string arguments pointing at nothing."""
    calls, clean = as_pairs(p[turn]), _clean(task, p, turn)
    skipped = [
        (i, j)
        for i, c in enumerate(p[turn][:-1])
        if not c.changes_state and not _needed_by(task, p, turn, i, state_changing=True)  # only reads miss it
        for j in _needed_by(task, p, turn, i, state_changing=False)
        if _run_turn(task, p, turn, _without(calls, i))[0][j - 1][1]  # the read then fails
    ]
    if skipped:
        i, j = rng.choice(skipped)
        return _without(calls, i), j - 1, [calls[i], calls[j]], f"{calls[i][0]} skipped, so {calls[j][0]} fails"
    schemas = offered_schemas(task, turn)
    # other names the task uses (a file of another folder, another ticket's title): a wrong one a model picks
    names = sorted({v for c in (c for t in p for c in t) for v in c.arguments.values() if isinstance(v, str)})
    options = []  # (call, argument, the turn's calls with it): a free-text argument that makes the read fail
    for i in (i for i in _final_reads(p[turn]) if i in clean):
        props = schemas[calls[i][0]].get("properties", {})
        for arg, value in calls[i][1].items():
            if isinstance(value, str) and "enum" not in props.get(arg, {}):  # else it is an argument_mismatch
                for wrong in rng.sample(names, len(names)) + ["no_such_" + value]:  # a wrong name, at random
                    broken = calls[:i] + [(calls[i][0], {**calls[i][1], arg: wrong})] + calls[i + 1 :]
                    if wrong != value and _run_turn(task, p, turn, broken)[0][i][1]:
                        options.append((i, arg, broken))
                        break
    if not options:
        return None
    i, arg, broken = rng.choice(options)
    return broken, i, [calls[i]], f"{calls[i][0]}({arg}={broken[i][1][arg]!r}) fails"


def _failing(task, p, turn, rng):
    failing = _failing_read(task, p, turn, rng)
    if failing is None:
        return None
    calls, _, _, note = failing
    return call_blocks(calls), note


def _written(form: str, note: str = ""):
    """A builder that writes one call of the turn in a form BFCL's decoder does not read (`damaged`); the
    note says "NAME written FORM" unless given."""

    def build(task, p, turn, rng):
        if not p[turn]:
            return None
        calls = as_pairs(p[turn])
        i = rng.randrange(len(calls))
        blocks = call_blocks(calls)
        blocks[i] = damaged(*calls[i], form)
        return blocks, f"{calls[i][0]} {note or 'written ' + form}"

    return build


def _two_in_one(task, p, turn, rng):
    if len(p[turn]) < 2:
        return None
    calls = as_pairs(p[turn])
    i = rng.randrange(len(calls) - 1)
    blocks = call_blocks(calls[:i]) + [one_block(calls[i : i + 2])] + call_blocks(calls[i + 2 :])
    return blocks, f"{calls[i][0]} + {calls[i + 1][0]}"


REPAIRED = ("repaired_malformed_call", "repaired_failing_call")
"""Kinds scripted as exact messages. Malformed: all of the turn's calls in one message (one of them broken),
then the broken one alone, corrected, in the next message (the repair). Failing: one call per message, the
failing read among them, and right after it the calls that repair it (its precondition, then the read
again). Then the final answer."""


def _repaired_malformed(task, p, turn, rng):
    calls = as_pairs(p[turn])
    if len(calls) < 2:  # the last call, so that the repair runs in the reference's order; another runs next to it
        return None
    name, arguments = calls[-1]
    message = "\n".join(call_blocks(calls[:-1]) + [damaged(name, arguments, "broken")])
    return [message, format_call(name, arguments)], f"{name} broken, then repaired"


def _repaired_failing(task, p, turn, rng):
    failing = _failing_read(task, p, turn, rng)
    if failing is None:
        return None
    calls, i, repair, note = failing
    blocks = call_blocks(calls)
    return blocks[: i + 1] + call_blocks(repair) + blocks[i + 1 :], f"{note}, then repaired"


BUILDERS = {
    "malformed_call": _written("broken", note="broken"),
    "tool_not_offered": _not_offered,
    "missing_required_argument": _argument_fault(_drop_required),
    "wrong_argument_type": _argument_fault(_retype),
    "wrong_argument_value": _argument_fault(_revalue),
    "out_of_enum_value": _argument_fault(_near_miss),
    "dropped_state_call": _drop(want_state=True),
    "dropped_read_call": _drop(want_state=False),
    "spurious_call": _spurious,
    "guessed_value_call": _guessed,
    "skipped_precondition": _skipped_precondition,
    "no_call_answer": _no_call,
    "hesitant_start": _hesitant,
    "unrepaired_error": _failing,
    "other_instance_call": _other_instance,
    "one_line_call": _written("one_line"),
    "fenced_call": _written("fenced_json"),
    "two_calls_one_block": _two_in_one,
    "repaired_malformed_call": _repaired_malformed,
    "repaired_failing_call": _repaired_failing,
}
if set(BUILDERS) != set(FAULTS):
    raise RegistryError(
        f"fault kinds without a builder in seal_mini/core/faults.py: {sorted(set(FAULTS) - set(BUILDERS))}; "
        f"builders of no declared fault kind: {sorted(set(BUILDERS) - set(FAULTS))}"
    )
