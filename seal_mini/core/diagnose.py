"""Turn-level failure diagnosis: one label per user turn of a finished episode, from executable evidence.

The evidence for turn k of an episode:
- the turn's call events: parse errors, unknown or not-yet-offered tools, schema violations, execution
  errors (seal_mini.envs.episode records them as the episode runs);
- the back-end state after the turn (Episode.turn_states), compared with the state the reference
  reaches: the ground truth executed turn by turn on its own fresh instances (as BFCL's checker does),
  or, after a failed turn, the ground truth's calls of this turn replayed from the model's own state;
- the outputs: the reference's outputs of turn k must all appear among the model's outputs of turns
  0..k (BFCL's response check works on "all outputs so far" the same way).

The ground-truth reference is the same for all G samples of a task, so it is computed once per task and
kept in an LRU cache that holds the training set. Nothing here evaluates text: reference calls are parsed
with seal_mini.envs.scripted.ground_truth_call and dispatched to the back-end methods directly, and the model's
recorded calls are replayed through seal_mini.envs.harness.run_call, as the episode ran them.

Cost: the rules compare only the back ends a turn could have changed (back ends never touch each
other's state) and walk a state only where it differs. Once a turn failed, the later turns' reference
costs a replay of the model's calls and a copy of its back ends per turn, so diagnosing a failed episode
costs about as much as running it again. `python -m seal_mini diagnose-check` measures diagnosing
against executing; building a task's reference costs about one ground-truth replay.

Attribution across turns. BFCL compares cumulative states, so once turn k diverges every later turn
diverges too, and its checker stops at the first failing turn. SEAL wants one label per turn, so the
first divergence gets the failure label and each later turn is judged against the state the model
actually had: once a turn failed (or the public states parted), the reference for a later turn is the
ground truth's calls of that turn replayed from the model's own back ends at the turn's start (rebuilt
from the model's recorded calls, private state such as the working directory included). A turn that
does the right thing on the state it was given passes; its calls failing on that state (a file an
earlier turn never created) are not a new recovery failure when the reference's calls fail the same way.

Turns that never began are not_reached. A turn that began but was cut (token budget, call limit) keeps a
failure label its calls prove (invalid call, bad arguments, spurious call, unrepaired error) and is
otherwise not_reached too: it never counts as pass or as a correct abstention.
"""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import (
    INSTANCE_PREFIX,
    NO_CALL,
    STATE_LIMIT,
    TRUNCATED,
    TurnRecord,
    call_directly,
    new_instances,
    public_methods,
    state_of,
    unfolded_size,
)
from seal_mini.envs.harness import QWEN_FC, instance_name, method_owners, run_call
from seal_mini.envs.scripted import ground_truth_call
from seal_mini.labels import LABELS, REGISTRY, RegistryError, require_labels, rule_order

# What the official checker's error types mean in our labels; used only when a verdict says an episode
# failed and the rules found no failing turn.
CHECKER_ERROR_LABELS = {
    "multi_turn:empty_turn_model_response": "missing_tool_call",
    "multi_turn:instance_state_mismatch": "state_mismatch",
    "multi_turn:execution_response_mismatch": "response_mismatch",
    "multi_turn:irrelevance_error:decoder_success": "spurious_tool_call",
}
require_labels(CHECKER_ERROR_LABELS.values(), "diagnose.CHECKER_ERROR_LABELS")

DIAGNOSIS_RAISED = "the diagnoser raised"
"""How the reason of a turn starts when diagnosing its episode raised (see diagnose_turns)."""

REFERENCE_CACHE_SIZE = 512
"""Tasks whose ground-truth reference is kept: the 400 training tasks fit, so over a run each task's
reference is built once (all 800 take about 30 MB)."""


# --- the ground-truth reference of a task -----------------------------------------------------------


@dataclass
class Reference:
    """The ground truth of one task executed turn by turn on its own fresh instances."""

    initial_state: dict
    states: list[dict]
    """Public state after each turn."""
    outputs: list[list[str]]
    """The ground truth's outputs per turn, as BFCL formats them."""
    calls: list[list[tuple[str, dict]]]
    """The ground truth's calls per turn as (name, keyword arguments)."""
    owners: dict[str, str]
    """Tool name -> the back-end class that implements it."""


_references: OrderedDict[str, Reference] = OrderedDict()


def reference(task: Task) -> Reference:
    """The task's ground-truth reference (cached: all G samples of a task share it)."""
    if task.id in _references:
        _references.move_to_end(task.id)
        return _references[task.id]
    instances = new_instances(task)
    methods = public_methods(instances)
    owners = {name: type(method.__self__).__name__ for name, method in methods.items()}
    initial = state_of(instances)
    states, outputs, parsed = [], [], []
    for calls in task.ground_truth:
        turn_calls = []
        for text in calls:
            name, arguments = ground_truth_call(text, methods)
            # Back ends keep (and later grow) the lists passed in: keep a copy of any such argument.
            mutable = any(isinstance(v, (list, dict)) for v in arguments.values())
            turn_calls.append((name, copy.deepcopy(arguments) if mutable else arguments))
        outputs.append([call_directly(methods, name, arguments)[0] for name, arguments in turn_calls])
        parsed.append(turn_calls)
        # the reference's snapshots are never mutated: a class that did not change shares the last one
        states.append(state_of(instances, states[-1] if states else initial))
    ref = Reference(initial, states, outputs, parsed, owners)
    _references[task.id] = ref
    if len(_references) > REFERENCE_CACHE_SIZE:
        _references.popitem(last=False)
    return ref


# --- state differences ---------------------------------------------------------------------------

_MISSING = object()


def _child(node, key):
    if isinstance(node, dict):
        return node.get(key, _MISSING)
    if isinstance(node, list):
        return node[key] if isinstance(key, int) and key < len(node) else _MISSING
    return _MISSING if node is _MISSING else getattr(node, key, _MISSING)


def differences(model, ref, path: tuple = (), seen: frozenset = frozenset()) -> list[tuple]:
    """Paths (dict keys, attribute names, list indices) where two states differ: descends where they
    differ and names the deepest differing parts."""
    if model == ref:
        return []
    if type(model) is type(ref) and isinstance(model, dict):
        keys = list(model) + [k for k in ref if k not in model]
    elif type(model) is type(ref) and isinstance(model, list) and len(model) == len(ref):
        keys = range(len(model))
    elif type(model) is type(ref) and hasattr(model, "__dict__") and not isinstance(model, type):
        # Back-end objects (a file system's Directory / File): public attributes, skipping
        # back-references to an enclosing object (a directory's parent), which equality ignores too.
        seen = seen | {id(model), id(ref)}
        keys = [k for k, v in vars(model).items() if not k.startswith("_") and id(v) not in seen]
    else:  # a leaf, or a part only one side has
        return [path]
    out = []
    for key in keys:
        a, b = _child(model, key), _child(ref, key)
        if a != b:  # most parts agree: skip them before anything else
            out += differences(a, b, path + (key,), seen)
    return out


# --- the evidence of one turn -----------------------------------------------------------------------


@dataclass(slots=True)
class TurnEvidence:
    """Everything the rules may read about one turn (built by `evidence`)."""

    record: TurnRecord
    gt_calls: list[tuple[str, dict]]
    """The ground truth's calls of this turn, (name, keyword arguments)."""
    needs_call: bool
    """The ground truth makes at least one call in this turn."""
    ref_outputs: list[str]
    """The outputs of the ground truth's calls of this turn, run from the reference's starting state."""
    outputs: list[str]
    """Outputs of every call the model made in the episode, in order (shared by all turns)..."""
    outputs_so_far: int
    """...of which the first this many were made in turns 0..k."""
    executed: list
    """The turn's CallEvents that were decoded and run (errors included): what the checker executes."""
    finished: bool
    """The turn ended the normal way: a message that decoded to no call."""
    differing: list[str]
    """Back-end classes whose state after the turn differs from the reference's."""
    from_model_state: bool
    """The reference is the ground truth replayed from the model's own state at the turn's start (an
    earlier turn failed or the states had parted); else it is the ground truth's own run."""
    ref_instances: set[str]
    """Back-end classes the ground truth's calls of this turn use (read or change)."""
    model_after: dict | None
    """None when the turn's end state was never recorded."""
    ref_after: dict
    _differences: list[tuple] | None = field(default=None, repr=False)

    def made_by_reference(self, event) -> bool:
        """The ground truth makes this very call in this turn. BFCL's reference breaks its own schema in
        a few tasks (a string ticket id where the doc says integer; a held-out tool used one turn before
        its reveal), and the benchmark accepts it: such a soft violation is not the model's fault."""
        return (event.name, event.arguments) in self.gt_calls

    def differences(self) -> list[tuple]:
        """State differences after this turn (computed once, only when asked)."""
        if self._differences is None:
            self._differences = []
            for cls in self.differing if self.model_after is not None else []:
                model, ref = self.model_after[cls], self.ref_after[cls]
                # a state too large to walk differs as a whole
                paths = differences(model, ref) if max(map(unfolded_size, (model, ref))) <= STATE_LIMIT else [()]
                self._differences += [(cls, *path) for path in paths]
        return self._differences

    def missing_outputs(self) -> list[str]:
        """Reference outputs of this turn that no model output of turns 0..k matches (BFCL's response
        check: a multiset check over all outputs so far)."""
        remaining = self.outputs[: self.outputs_so_far]
        missing = []
        for item in self.ref_outputs:
            if item in remaining:
                remaining.remove(item)
            else:
                missing.append(item)
        return missing

    def ends_right(self) -> bool:
        """The turn needs calls and ended where the reference does: same state, its outputs shown. Errors
        on the way to such an end were repaired."""
        return (
            self.needs_call
            and self.finished
            and bool(self.executed)
            and not self.differences()
            and not self.missing_outputs()
        )


def shorten(text, limit: int = 80) -> str:
    """str(text), cut to `limit` characters with "..." where longer."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- LEARNER EDIT POINT: the rules ---------------------------------------------------------------------
# Each rule reads a turn's evidence and returns a short reason when it fires ("" when it does not), and is
# bound to its label with @rule. The rules are tried in the labels' priority (seal_mini/labels.py); the
# first that fires labels the turn. A malformed or invented call outranks everything on a turn that needs a
# call; on a turn that needs none, any call at all (readable or not, offered or not) is a spurious_tool_call,
# as SEAL defines the two labels of such turns (spurious_tool_call, correct_abstention).
# Repaired errors, one treatment: a failed call (error_kind set) counts for invalid_tool_call,
# argument_mismatch or recovery_failure only on a turn that does not end where the reference does
# (TurnEvidence.ends_right); a turn that ends there repaired it. A schema violation that ran anyway
# (not_offered, wrong_type, not_in_enum: BFCL lets them through) is no error to repair and counts wherever
# the turn ends.

RULE_OF: dict[str, Callable[[TurnEvidence], str]] = {}
"""Label -> its rule (filled by @rule)."""


def rule(label: str) -> Callable:
    """Bind the decorated function as the rule of `label` (one rule per label)."""

    def bind(fn: Callable[[TurnEvidence], str]) -> Callable[[TurnEvidence], str]:
        if label in RULE_OF:
            raise RegistryError(f"label {label!r} has two rules: {RULE_OF[label].__name__} and {fn.__name__}")
        RULE_OF[label] = fn
        return fn

    return bind


@rule("not_reached")
def _never_begun(ev: TurnEvidence) -> str:
    if ev.record.messages:
        return ""
    if ev.record.ended_by == TRUNCATED:
        return "the turn's first message was cut by the token budget before it ended"
    return "no message in this turn: the episode ended before it"


@rule("invalid_tool_call")
def _invalid_call(ev: TurnEvidence) -> str:
    if not ev.needs_call:  # a turn that needs no call: spurious_tool_call
        return ""
    for e in ev.record.events:
        if e.error_kind in ("parse", "unknown_tool") and not ev.ends_right():
            return f"{e.error_kind}: {shorten(e.error)}"
        if e.violation == "not_offered" and not ev.made_by_reference(e):
            return f"{e.name} called before it was offered"
    return ""


@rule("argument_mismatch")
def _bad_arguments(ev: TurnEvidence) -> str:
    if not ev.needs_call:
        return ""
    for e in ev.record.events:
        if e.error_kind == "arguments" and not ev.ends_right():
            return f"{e.name}: {e.violation or 'arguments'}"
        if e.violation in ("wrong_type", "not_in_enum") and not ev.made_by_reference(e):
            return f"{e.name}: {e.violation}"
    return ""


@rule("spurious_tool_call")
def _spurious(ev: TurnEvidence) -> str:
    if ev.needs_call or not ev.record.events:
        return ""
    e = ev.record.events[0]
    what = "wrote an unreadable call" if e.error_kind == "parse" else f"called {e.name}"
    return f"{what} on a turn that needs no call"


@rule("correct_abstention")
def _abstained(ev: TurnEvidence) -> str:
    return "" if ev.needs_call or not ev.finished else "no call, as the ground truth"


@rule("instance_mismatch")
def _other_instance_changed(ev: TurnEvidence) -> str:
    """The turn changed a back-end instance (one of the task's BFCL classes: the file system, the message
    service, the trading bot...) that the reference's calls of this turn do not use at all: the model
    acted on the wrong object, in place of or besides the right one. The reference leaves such an
    instance as the turn found it, so any difference there is the model's change. A turn whose state
    differs only inside instances the reference uses (a wrong value, a change too many or too few, the
    right instance left unchanged) is a state_mismatch."""
    if not (ev.needs_call and ev.finished and ev.executed):
        return ""
    others = [cls for cls in ev.differing if cls not in ev.ref_instances]
    if not others:
        return ""
    return f"changed {', '.join(others)}, which the reference does not use in this turn"


@rule("state_mismatch")
def _state_differs(ev: TurnEvidence) -> str:
    if not (ev.needs_call and ev.finished and ev.executed):
        return ""
    paths = ev.differences()
    if not paths:
        return ""
    shown = ", ".join(".".join(map(str, p)) for p in paths[:3])
    return f"state differs at {shorten(shown)}" + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")


@rule("recovery_failure")
def _unrepaired_error(ev: TurnEvidence) -> str:
    if ev.ends_right():
        return ""
    for e in ev.record.events:
        if e.error_kind == "execution" and e.output not in ev.ref_outputs:  # else the reference fails the same way
            return f"{e.name} failed ({shorten(e.error, 60)}) and was not repaired"
    return ""


@rule("missing_tool_call")
def _no_call(ev: TurnEvidence) -> str:
    return "answered without a call" if ev.needs_call and ev.finished and not ev.executed else ""


@rule("response_mismatch")
def _outputs_missing(ev: TurnEvidence) -> str:
    if not (ev.needs_call and ev.finished):
        return ""
    missing = ev.missing_outputs()
    return f"{len(missing)} expected output(s) missing, e.g. {shorten(missing[0], 60)!r}" if missing else ""


@rule("pass")
def _finished(ev: TurnEvidence) -> str:
    return "state and outputs match the reference" if ev.finished else ""


def _cut_short(ev: TurnEvidence) -> str:
    return f"the turn was cut before it ended ({ev.record.ended_by})"


RULES: list[tuple[str, Callable[[TurnEvidence], str]]] = rule_order(REGISTRY, RULE_OF) + [
    ("not_reached", _cut_short),  # always fires: a cut turn that no rule above could label
]
"""(label, rule) in the order they are tried."""


# --- diagnosing an episode --------------------------------------------------------------------------


@dataclass
class TurnDiagnosis:
    index: int
    label: str
    reason: str
    """Why the rule fired, in a few words (for printing and explaining)."""
    detail: str = ""
    """A finer cause picked by the optional small model (seal_mini.core.judge), else empty."""
    ambiguous: bool = False
    """The rules could not attribute this failure precisely (a candidate for the small model)."""


class _ModelReplay:
    """The model's back ends rebuilt from its recorded calls (run as the episode ran them), so that the
    ground truth can be replayed from the state the model actually had, private state included."""

    def __init__(self, task: Task, records: list[TurnRecord], prefix: str = INSTANCE_PREFIX):
        self.instances = new_instances(task)
        self.scope = {instance_name(prefix, task.id, c): i for c, i in self.instances.items()}
        self.owners = method_owners(self.scope)
        for record in records:
            self.advance(record)

    def advance(self, record: TurnRecord) -> None:
        """Run the model's calls of one more turn."""
        for step in record.steps:
            for call in step:
                run_call(call, self.scope, self.owners)

    def reference_turn(self, calls: list[tuple[str, dict]]) -> tuple[dict, list[str]]:
        """(state after, outputs) of the ground truth's calls of a turn, run on a copy of the model's back ends."""
        try:
            instances = pickle.loads(pickle.dumps(self.instances, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - a back end that does not pickle is copied the slow way
            instances = copy.deepcopy(self.instances)
        methods = public_methods(instances)
        outputs = [call_directly(methods, name, arguments)[0] for name, arguments in calls]
        return state_of(instances), outputs


def _same(a, b, sizes: dict[int, int]) -> bool:
    """a == b, where a state unfolding past STATE_LIMIT equals only itself; `sizes` keeps sizes by id."""
    for state in (a, b):
        if id(state) not in sizes:
            sizes[id(state)] = unfolded_size(state)
    return a is b or (max(sizes[id(a)], sizes[id(b)]) <= STATE_LIMIT and a == b)


def _walk(episode) -> list[tuple[TurnEvidence, str, str]]:
    """(evidence, label, reason) of every task turn, in order. Reads only task, turn_records() and
    turn_states of the episode. A turn is judged against the ground truth's own run while every turn
    before it passed and the states agree; after that, against the ground truth replayed from the
    model's state (see the module docstring)."""
    task = episode.task
    ref = reference(task)
    records = episode.turn_records()
    states = list(episode.turn_states)
    if len(records) != len(task.turns):
        raise ValueError(f"episode of {task.id} has {len(records)} turn records for {len(task.turns)} turns")
    out, outputs = [], []
    same = dict.fromkeys(ref.initial_state, True)  # per class: the model's public state equals the reference's
    sizes: dict[int, int] = {}  # of the states compared (all alive until this returns)
    replay: _ModelReplay | None = None
    for k, record in enumerate(records):
        executed = [e for e in record.events if e.call is not None]
        outputs += [e.output for e in executed]
        model_after = states[k] if k < len(states) else None
        gt_before = ref.initial_state if k == 0 else ref.states[k - 1]
        gt_after = ref.states[k]
        # Back ends never touch each other's state, and both sides start the turn from the same state:
        # only a class the model called or the reference changed can differ after it.
        touched = {ref.owners.get(e.name) for e in executed}
        from_model_state = not all(same.values()) or any(z not in ("pass", "correct_abstention") for _, z, _ in out)
        if from_model_state and model_after is not None:
            if replay is None:  # named as the episode's BFCL handler names instances (Qwen FC for a record without)
                replay = _ModelReplay(task, records[:k], getattr(episode, "protocol", QWEN_FC).instance_prefix)
            ref_after, ref_outputs = replay.reference_turn(ref.calls[k])
            candidates = touched | {ref.owners[name] for name, _ in ref.calls[k]}
            replay.advance(record)
        else:
            ref_after, ref_outputs = gt_after, ref.outputs[k]
            candidates = touched | {cls for cls in same if gt_after[cls] is not gt_before[cls]}
        for cls in same:
            if model_after is None:
                same[cls] = False
            elif cls in touched or gt_after[cls] is not gt_before[cls]:
                same[cls] = _same(model_after[cls], gt_after[cls], sizes)
        ev = TurnEvidence(
            record=record,
            gt_calls=ref.calls[k],
            needs_call=bool(ref.calls[k]),
            ref_outputs=ref_outputs,
            outputs=outputs,
            outputs_so_far=len(outputs),
            executed=executed,
            finished=record.ended_by == NO_CALL and model_after is not None,
            differing=[
                c
                for c in ref_after
                if c in candidates and model_after and not _same(model_after[c], ref_after[c], sizes)
            ],
            from_model_state=from_model_state,
            ref_instances={ref.owners[name] for name, _ in ref.calls[k]},
            model_after=model_after,
            ref_after=ref_after,
        )
        out.append((ev, *label_turn(ev)))
    return out


def evidence(episode) -> list[TurnEvidence]:
    """The evidence of every task turn (see _walk)."""
    return [ev for ev, _, _ in _walk(episode)]


def label_turn(ev: TurnEvidence) -> tuple[str, str]:
    """(label, reason) of the first rule that fires."""
    for label, rule in RULES:
        reason = rule(ev)
        if reason:
            return label, reason
    raise AssertionError("the last rule always fires")


def diagnose_turns(episode, verdict=None, judge=None) -> list[TurnDiagnosis]:
    """One TurnDiagnosis per task turn: label, reason, and (with a judge) a finer cause where ambiguous.

    `verdict` (seal_mini.envs.verifier.Verdict) is optional evidence: if the official checker failed the
    episode and no rule found a failing turn, the turn the checker names takes the checker's error type
    (BFCL's state-mismatch message names no turn; then nothing changes). In diagnose-check's sample no
    failed episode went without a failing turn. `judge` (seal_mini.core.judge.LabelJudge) fills `detail`.

    Diagnosis never ends a run: if the rules raise anyway, every turn is not_reached (neutral in rho and
    in the profile) with DIAGNOSIS_RAISED and the error as its reason, which metrics count."""
    try:
        walked = _walk(episode)
    except Exception as e:  # noqa: BLE001 - a back end's bug must not cost the run
        reason = f"{DIAGNOSIS_RAISED}: {type(e).__name__}: {str(e)[:200]}"
        print(f"[diagnose] warning: {episode.task.id}: {reason}; its turns are labelled not_reached")
        return [TurnDiagnosis(k, "not_reached", reason) for k in range(len(episode.task.turns))]
    evidences = [ev for ev, _, _ in walked]
    out = [TurnDiagnosis(k, z, reason, ambiguous=z == "state_mismatch") for k, (_, z, reason) in enumerate(walked)]
    if verdict is not None and verdict.reward == 0.0:
        unexplained = all(d.label in ("pass", "correct_abstention") for d in out)
        turn = verdict.failed_turn
        if unexplained and turn is not None and 0 <= turn < len(out):
            label = CHECKER_ERROR_LABELS.get(verdict.error_type)
            if label:
                out[turn] = TurnDiagnosis(turn, label, f"checker: {verdict.error_type}", ambiguous=True)
    if judge is not None:
        judge.refine(out, evidences)
    return out


def diagnose(episode, verdict=None) -> list[str]:
    """One label per task turn (see RULES)."""
    return [d.label for d in diagnose_turns(episode, verdict)]


# --- profiles: p_j(z) per trajectory, C_t per round -------------------------------------------------


def trajectory_profile(labels: list[str]) -> dict[str, float]:
    """p_j(z): the share of the trajectory's turns labelled z, over all task turns.

    not_reached turns count in the denominator with their own label (rho(not_reached) is neutral), so
    a trajectory cut short is not weighted as if its unplayed turns had passed."""
    if not labels:
        raise ValueError("a trajectory has at least one turn")
    unknown = [z for z in labels if z not in LABELS]
    if unknown:
        raise ValueError(f"unknown labels {unknown}; labels are {LABELS}")
    return {z: labels.count(z) / len(labels) for z in LABELS if z in labels}


def failure_profile(labels_per_traj: list[list[str]], rewards: list[float]) -> dict[str, dict]:
    """C_t: per label, count (turns), prevalence (share of all turns), success_rate (mean reward of the
    trajectories it appears in; None if it appears in none) and trajectories (how many it appears in)."""
    if len(labels_per_traj) != len(rewards):
        raise ValueError(f"{len(labels_per_traj)} trajectories but {len(rewards)} rewards")
    total = sum(len(labels) for labels in labels_per_traj)
    out = {}
    for z in LABELS:
        count = sum(labels.count(z) for labels in labels_per_traj)
        hit = [r for labels, r in zip(labels_per_traj, rewards, strict=True) if z in labels]
        out[z] = {
            "count": count,
            "prevalence": count / total if total else 0.0,
            "success_rate": sum(hit) / len(hit) if hit else None,
            "trajectories": len(hit),
        }
    return out
