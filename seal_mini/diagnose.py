"""Turn-level failure diagnosis: one label per user turn of a finished episode, from executable evidence.

The evidence for turn k of an episode:
- the turn's call events: parse errors, unknown or not-yet-offered tools, schema violations, execution
  errors (seal_mini.env records them as the episode runs);
- the back-end state after the turn (Episode.turn_states), compared with the state the ground truth
  reaches when it is executed turn by turn on its own fresh instances (as BFCL's checker does);
- the outputs: the ground truth's outputs of turn k must all appear among the model's outputs of turns
  0..k (BFCL's response check works on "all outputs so far" the same way).

The ground-truth reference is the same for all G samples of a task, so it is computed once per task and
kept in an LRU cache that holds the training set. Nothing here evaluates text: reference calls are parsed
with seal_mini.oracle.ground_truth_call and dispatched to the back-end methods directly.

Cost: the rules compare only the back ends a turn could have changed (back ends never touch each
other's state) and walk a state only where it differs. `python -m seal_mini diagnose-check` measures
diagnosing against executing; building a task's reference costs about one ground-truth replay.

Attribution across turns. BFCL compares cumulative states, so once turn k diverges every later turn
diverges too, and its checker stops at the first failing turn. SEAL wants one label per turn, so a later
turn is only blamed for what it changed itself: a part of the state that already differed before the
turn and that neither side touched is inherited, not a new mismatch; where both sides touched it, their
changes are compared (a counter moved by the same amount, the same items appended to a list, the same
members added to a set). The response check is skipped after a divergence, because the reference
outputs then come from a different state than the model is in. Two limits follow: a divergence that
lives only in private attributes (the file system's working directory) surfaces at the first turn where
it changes public state, and ids drawn from a back end's seeded random stream differ once the calls
that consume it differ, which shows up as a new mismatch.

Turns that never began are not_reached. A turn that began but was cut (token budget, call limit) keeps a
failure label its calls prove (invalid call, bad arguments, spurious call, unrepaired error) and is
otherwise not_reached too: it never counts as pass or as a correct abstention.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from seal_mini.bfcl import Task
from seal_mini.config import LABELS
from seal_mini.env import NO_CALL, TurnRecord, format_output, new_instances, public_methods
from seal_mini.oracle import ground_truth_call

FAILURE_LABELS = tuple(z for z in LABELS if z not in ("pass", "correct_abstention", "not_reached"))
"""Labels that say the turn went wrong (not_reached says nothing either way)."""

# What the official checker's error types mean in our labels; used only when a verdict says an episode
# failed and the rules found no failing turn.
CHECKER_ERROR_LABELS = {
    "multi_turn:empty_turn_model_response": "missing_tool_call",
    "multi_turn:instance_state_mismatch": "state_mismatch",
    "multi_turn:execution_response_mismatch": "response_mismatch",
    "multi_turn:irrelevance_error:decoder_success": "spurious_tool_call",
}

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


def _snapshot(instances: dict[str, object], previous: dict | None = None) -> dict[str, dict]:
    """Public state per class, as env.state_of, but cheaper: a class whose state did not change since
    `previous` shares that snapshot (snapshots are never mutated), and a copy is a pickle round trip,
    about three times faster than deepcopy on these states."""
    out = {}
    for name, instance in instances.items():
        public = {k: v for k, v in vars(instance).items() if not k.startswith("_")}
        if previous is not None and public == previous[name]:
            out[name] = previous[name]
        else:
            out[name] = pickle.loads(pickle.dumps(public, protocol=pickle.HIGHEST_PROTOCOL))
    return out


def reference(task: Task) -> Reference:
    """The task's ground-truth reference (cached: all G samples of a task share it)."""
    if task.id in _references:
        _references.move_to_end(task.id)
        return _references[task.id]
    instances = new_instances(task)
    methods = public_methods(instances)
    owners = {name: type(method.__self__).__name__ for name, method in methods.items()}
    initial = _snapshot(instances)
    states, outputs, parsed = [], [], []
    for calls in task.ground_truth:
        turn_outputs, turn_calls = [], []
        for text in calls:
            name, arguments = ground_truth_call(text, methods)
            # Back ends keep (and later grow) the lists passed in: keep a copy of any such argument.
            mutable = any(isinstance(v, (list, dict)) for v in arguments.values())
            turn_calls.append((name, copy.deepcopy(arguments) if mutable else arguments))
            try:
                turn_outputs.append(format_output(methods[name](**arguments)))
            except Exception as e:  # the checker records a raising call the same way
                turn_outputs.append(f"Error during execution: {e}")
        outputs.append(turn_outputs)
        parsed.append(turn_calls)
        states.append(_snapshot(instances, states[-1] if states else initial))
    ref = Reference(initial, states, outputs, parsed, owners)
    _references[task.id] = ref
    if len(_references) > REFERENCE_CACHE_SIZE:
        _references.popitem(last=False)
    return ref


# --- state differences, with inheritance ------------------------------------------------------------

_MISSING = object()


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def same_change(model_before, model_after, gt_before, gt_after) -> bool:
    """Did the model's turn change this value the way the ground truth's turn changed its own?"""
    if model_after == gt_after:
        return True
    if model_before == model_after and gt_before == gt_after:
        return True  # an inherited difference neither side touched
    values = (model_before, model_after, gt_before, gt_after)
    if all(_number(v) for v in values):
        return math.isclose(model_after - model_before, gt_after - gt_before, rel_tol=1e-9, abs_tol=1e-9)
    if all(isinstance(v, list) for v in values):  # append-only lists: the same items appended
        m, g = len(model_before), len(gt_before)
        return model_after[:m] == model_before and gt_after[:g] == gt_before and model_after[m:] == gt_after[g:]
    if all(isinstance(v, (set, frozenset)) for v in values):
        added = model_after - model_before == gt_after - gt_before
        return added and model_before - model_after == gt_before - gt_after
    return False


def _child(node, key):
    if isinstance(node, dict):
        return node.get(key, _MISSING)
    if isinstance(node, list):
        return node[key] if isinstance(key, int) and key < len(node) else _MISSING
    return _MISSING if node is _MISSING else getattr(node, key, _MISSING)


def new_differences(
    model_before, model_after, gt_before, gt_after, path: tuple = (), seen: frozenset = frozenset()
) -> list[tuple]:
    """Paths (dict keys, attribute names, list indices) where the states differ after the turn because
    of this turn, not an earlier one. Descends where the two after-states differ, carrying the two
    before-states along, and judges each differing part with same_change."""
    if model_after == gt_after:
        return []
    if type(model_after) is type(gt_after) and isinstance(model_after, dict):
        keys = list(model_after) + [k for k in gt_after if k not in model_after]
    elif type(model_after) is type(gt_after) and isinstance(model_after, list) and len(model_after) == len(gt_after):
        keys = range(len(model_after))
    elif type(model_after) is type(gt_after) and hasattr(model_after, "__dict__") and not isinstance(model_after, type):
        # Back-end objects (a file system's Directory / File): public attributes, skipping
        # back-references to an enclosing object (a directory's parent), which equality ignores too.
        seen = seen | {id(model_after), id(gt_after)}
        keys = [k for k, v in vars(model_after).items() if not k.startswith("_") and id(v) not in seen]
    else:  # a leaf, or a part only one side has
        return [] if same_change(model_before, model_after, gt_before, gt_after) else [path]
    out = []
    for key in keys:
        after = _child(model_after, key), _child(gt_after, key)
        if after[0] != after[1]:  # most parts agree: skip them before anything else
            before = _child(model_before, key), _child(gt_before, key)
            out += new_differences(before[0], after[0], before[1], after[1], path + (key,), seen)
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
    gt_outputs: list[str]
    outputs: list[str]
    """Outputs of every call the model executed in the episode, in order (shared by all turns)..."""
    outputs_so_far: int
    """...of which the first this many were made in turns 0..k."""
    executed: list
    """The turn's CallEvents that reached a back end (execution errors included)."""
    finished: bool
    """The turn ended the normal way: the model answered without a call."""
    differing: list[str]
    """Back-end classes whose state after the turn differs from the ground truth's."""
    moved: set[str]
    """Classes the model called this turn or whose reference state changed: only these can hold a
    difference that is new in this turn."""
    diverged_before: bool
    """The states already differed before this turn."""
    model_before: dict | None
    model_after: dict | None
    """None when the turn's end state was never recorded."""
    gt_before: dict
    gt_after: dict
    _differences: list[tuple] | None = field(default=None, repr=False)

    def made_by_reference(self, event) -> bool:
        """The ground truth makes this very call in this turn. BFCL's reference breaks its own schema in
        a few tasks (a string ticket id where the doc says integer; a held-out tool used one turn before
        its reveal), and the benchmark accepts it: such a soft violation is not the model's fault."""
        return (event.name, event.arguments) in self.gt_calls

    def differences(self) -> list[tuple]:
        """New state differences of this turn (computed once, only when asked)."""
        if self._differences is None:
            self._differences = []
            if self.model_after is not None and self.model_before is not None:
                for cls in self.differing:
                    if cls not in self.moved:  # an inherited difference that neither side touched
                        continue
                    if self.gt_after[cls] is self.gt_before[cls] and self.model_after[cls] == self.model_before[cls]:
                        continue  # touched, but neither side changed it: still only inherited
                    self._differences += [
                        (cls, *path)
                        for path in new_differences(
                            self.model_before[cls], self.model_after[cls], self.gt_before[cls], self.gt_after[cls]
                        )
                    ]
        return self._differences


def _short(text, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path_text(path: tuple) -> str:
    return ".".join(str(p) for p in path)


# --- LEARNER EDIT POINT: the rules, in priority order ---------------------------------------------
# Each rule reads a turn's evidence and returns a short reason when it fires ("" when it does not).
# The first rule that fires labels the turn. The order is the paper's priority: invalid_tool_call >
# argument_mismatch > state_mismatch > recovery_failure > missing_tool_call > response_mismatch; the
# two labels for turns whose ground truth makes no call (spurious_tool_call, correct_abstention) apply
# to disjoint turns from the four that need a call, so their place among those does not matter. A
# malformed or invented call outranks everything, also on a turn that needs no call.


def _never_begun(ev: TurnEvidence) -> str:
    return "" if ev.record.messages else "no message in this turn: the episode ended before it"


def _invalid_call(ev: TurnEvidence) -> str:
    for e in ev.record.events:
        if e.error_kind in ("parse", "unknown_tool"):
            return f"{e.error_kind}: {_short(e.error)}"
        if e.violation == "not_offered" and not ev.made_by_reference(e):
            return f"{e.name} called before it was offered"
    return ""


def _bad_arguments(ev: TurnEvidence) -> str:
    for e in ev.record.events:
        if e.error_kind == "arguments" or (
            e.violation in ("wrong_type", "not_in_enum") and not ev.made_by_reference(e)
        ):
            return f"{e.name}: {e.violation or 'arguments'}"
    return ""


def _spurious(ev: TurnEvidence) -> str:
    if ev.needs_call or not ev.record.events:
        return ""
    return f"called {ev.record.events[0].name} on a turn that needs no call"


def _abstained(ev: TurnEvidence) -> str:
    return "" if ev.needs_call or not ev.finished else "no call, as the ground truth"


def _state_differs(ev: TurnEvidence) -> str:
    if not (ev.needs_call and ev.finished and ev.executed):
        return ""
    paths = ev.differences()
    if not paths:
        return ""
    shown = ", ".join(_path_text(p) for p in paths[:3])
    return f"state differs at {_short(shown)}" + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")


def _unrepaired_error(ev: TurnEvidence) -> str:
    # An execution error is repaired when a later call of the same tool in the same turn succeeds.
    events = ev.record.events
    for i, e in enumerate(events):
        if e.error_kind != "execution":
            continue
        if not any(later.name == e.name and later.error_kind is None for later in events[i + 1 :]):
            return f"{e.name} failed ({_short(e.error, 60)}) and was not repaired"
    return ""


def _no_call(ev: TurnEvidence) -> str:
    return "answered without a call" if ev.needs_call and ev.finished and not ev.executed else ""


def _outputs_missing(ev: TurnEvidence) -> str:
    if not (ev.needs_call and ev.finished) or ev.diverged_before:
        return ""
    remaining = ev.outputs[: ev.outputs_so_far]
    missing = []
    for item in ev.gt_outputs:  # a multiset check: each model output can match one reference output
        if item in remaining:
            remaining.remove(item)
        else:
            missing.append(item)
    return f"{len(missing)} expected output(s) missing, e.g. {_short(missing[0], 60)!r}" if missing else ""


def _finished(ev: TurnEvidence) -> str:
    return "state and outputs match the ground truth" if ev.finished else ""


def _cut_short(ev: TurnEvidence) -> str:
    return f"the turn was cut before it ended ({ev.record.ended_by})"


RULES: list[tuple[str, Callable[[TurnEvidence], str]]] = [
    ("not_reached", _never_begun),
    ("invalid_tool_call", _invalid_call),
    ("argument_mismatch", _bad_arguments),
    ("spurious_tool_call", _spurious),
    ("correct_abstention", _abstained),
    ("state_mismatch", _state_differs),
    ("recovery_failure", _unrepaired_error),
    ("missing_tool_call", _no_call),
    ("response_mismatch", _outputs_missing),
    ("pass", _finished),
    ("not_reached", _cut_short),  # always fires: a cut turn with nothing else to say
]
assert all(label in LABELS for label, _ in RULES)


# --- diagnosing an episode --------------------------------------------------------------------------


@dataclass
class TurnDiagnosis:
    index: int
    label: str
    reason: str
    """Why the rule fired, in a few words (for printing and explaining)."""
    detail: str = ""
    """A finer cause picked by the optional small model (seal_mini.judge), else empty."""
    ambiguous: bool = False
    """The rules could not attribute this failure precisely (a candidate for the small model)."""


def evidence(episode) -> list[TurnEvidence]:
    """The evidence of every task turn. Reads only task, turn_records(), turn_states of the episode."""
    task = episode.task
    ref = reference(task)
    records = episode.turn_records()
    states = list(episode.turn_states)
    if len(records) != len(task.turns):
        raise ValueError(f"episode of {task.id} has {len(records)} turn records for {len(task.turns)} turns")
    out, outputs = [], []
    same = dict.fromkeys(ref.initial_state, True)  # per class: the model's state equals the reference's
    for k, record in enumerate(records):
        executed = [e for e in record.events if e.call is not None]
        outputs += [e.output for e in executed]
        model_before = ref.initial_state if k == 0 else (states[k - 1] if k - 1 < len(states) else None)
        model_after = states[k] if k < len(states) else None
        gt_before = ref.initial_state if k == 0 else ref.states[k - 1]
        gt_after = ref.states[k]
        diverged_before = not all(same.values())
        # Back ends never touch each other's state: a class the model did not call this turn kept its
        # state, and where the reference's did not move either (it shares the snapshot object), the
        # comparison of the turn before still holds. Only the rest is compared.
        touched = {ref.owners.get(e.name) for e in executed}
        moved = {cls for cls in same if cls in touched or gt_after[cls] is not gt_before[cls]}
        for cls in same:
            if model_after is None:
                same[cls] = False
            elif cls in moved:
                same[cls] = model_after[cls] == gt_after[cls]
        out.append(
            TurnEvidence(
                record=record,
                gt_calls=ref.calls[k],
                needs_call=bool(ref.calls[k]),
                gt_outputs=ref.outputs[k],
                outputs=outputs,
                outputs_so_far=len(outputs),
                executed=executed,
                finished=record.ended_by == NO_CALL and model_after is not None,
                differing=[cls for cls, ok in same.items() if not ok],
                moved=moved,
                diverged_before=diverged_before,
                model_before=model_before,
                model_after=model_after,
                gt_before=gt_before,
                gt_after=gt_after,
            )
        )
    return out


def label_turn(ev: TurnEvidence) -> tuple[str, str]:
    """(label, reason) of the first rule that fires."""
    for label, rule in RULES:
        reason = rule(ev)
        if reason:
            return label, reason
    raise AssertionError("the last rule always fires")


def diagnose_turns(episode, verdict=None, judge=None) -> list[TurnDiagnosis]:
    """One TurnDiagnosis per task turn: label, reason, and (with a judge) a finer cause where ambiguous.

    `verdict` (seal_mini.verifier.Verdict) is optional evidence: if the official checker failed the
    episode and no rule found a failing turn, the turn the checker names takes the checker's error type
    (BFCL's state-mismatch message names no turn; then nothing changes). In diagnose-check's sample no
    failed episode went without a failing turn. `judge` (seal_mini.judge.LabelJudge) fills `detail`."""
    evidences = evidence(episode)
    out = []
    for k, ev in enumerate(evidences):
        label, reason = label_turn(ev)
        out.append(TurnDiagnosis(k, label, reason, ambiguous=label == "state_mismatch"))
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
