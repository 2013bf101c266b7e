"""The turn-level failure labels, each declared once: everything the kit knows about a label sits in its entry.

An entry (Label) gives a label's name, its utility rho (the weight a trajectory's advantage gets per share
of its turns with this label), its priority among the diagnoser's rules, the description the optional
small model scores (seal_mini.core.judge), the finer causes that model may pick, the guideline the
training interface shows when the label's failures are frequent (seal_mini.core.interface), and the
faults diagnose-check injects to prove the label (seal_mini.core.faults). The tables the rest of the kit
reads (LABELS, DEFAULT_RHO, GUIDELINES, FAULTS, ...) are views of these entries, built below.

Adding a label is one entry in ENTRIES plus its rule: a function in seal_mini/core/diagnose.py bound to
the label with @rule("the_label"). A fault named in an entry also needs its builder in
seal_mini/core/faults.py (BUILDERS). An incomplete entry stops the import with a RegistryError that names
the label and what it lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class RegistryError(ValueError):
    """A label entry (or a table that names labels) is incomplete or inconsistent; the message says which."""


@dataclass(frozen=True)
class Guideline:
    """A capability-level guideline (phi_cap) selected by the failures of its label."""

    id: str
    text: str
    order: int
    """Place among all guidelines: with the loop open the first top_k are shown, and in a closed loop
    guidelines that score the same keep this order."""
    raises: tuple[str, ...] = ()
    """Fault kinds this guideline makes more likely in a backbone that follows cues (sft.cue_compliance): the
    side effects real models show (told to be cautious, they answer without a call more often; told to act,
    they guess values they should ask for)."""


@dataclass(frozen=True)
class Fault:
    """A fault diagnose-check injects into a ground-truth episode; the faulted turn must get its label."""

    kind: str
    what: str
    """What is injected, in a few words."""
    demonstrable: bool = False
    """The warm start may show it (sft.faults accepts the kind); else diagnose-check only."""
    repaired_as: str = ""
    """The fault kind (a label-pass one) that shows the same error repaired: a demonstration with error
    feedback shown repairs the error this way with probability sft.cue_compliance."""


@dataclass(frozen=True)
class Label:
    """One turn-level label and everything that depends on it."""

    name: str
    rho: float | None = None
    """Default utility rho(z); a recipe may override it (diagnosis.rho)."""
    rho_reason: str = ""
    """Where rho comes from: "paper", or why the kit chose it where the paper gives no value."""
    priority: int | None = None
    """When several rules fire on one turn, the highest priority wins (rules are tried highest first)."""
    failure: bool = True
    """The label says the turn went wrong (pass, correct_abstention and not_reached do not)."""
    rho_moves: bool = True
    """The moving rho (diagnosis.rho_update: ema) moves it with the round's profile; False holds it at its
    base value (a passed turn, or one never reached, carries no failure to emphasise)."""
    description: str = ""
    """What the label means, as the small model scores it (every failure label needs one)."""
    finer: dict[str, str] = field(default_factory=dict)
    """Finer causes the small model may pick within this label: name -> description."""
    guideline: Guideline | None = None
    faults: tuple[Fault, ...] = ()


# --- LEARNER EDIT POINT: the labels ---------------------------------------------------------------------
# Declared in the order tables and reports list them. rho: the paper's values where it gives one
# (spurious 2.0, abstention 1.8, missing/empty 1.5, state 1.0, response 0.9, instance 0.6, pass 1.0);
# the kit's own choice, with its reason, for the labels the paper leaves without a value. Priority:
# the paper's order (invalid > argument > state > recovery > missing > response), with instance above
# state as the authors' release orders them. The labels of turns whose ground truth makes no call
# (spurious_tool_call, correct_abstention) apply to other turns than the ones that need a call, so
# their place among those does not matter.
ENTRIES: tuple[Label, ...] = (
    Label(
        "pass",
        rho=1.0,
        rho_reason="paper",
        priority=0,
        failure=False,
        rho_moves=False,
        faults=(
            Fault("repaired_malformed_call", "one call of a turn broken next to the others, then sent again correctly"),
            Fault(
                "repaired_failing_call",
                "a read-only call fails, then is sent again correctly (after the call it needs first)",
            ),
        ),
    ),
    Label("correct_abstention", rho=1.8, rho_reason="paper", priority=60, failure=False),
    Label(
        "invalid_tool_call",
        rho=1.5,
        rho_reason="a format failure is as cheap to learn from as a missing call and as decisive (nothing "
        "executes), so it gets the same emphasis as missing_tool_call",
        priority=90,
        description="The assistant wrote a tool call that could not be read or named a tool not offered.",
        guideline=Guideline(
            "well_formed_calls",
            'Write every call as one valid JSON object with "name" and "arguments" between a <tool_call> line '
            "and a </tool_call> line, naming only listed tools.",
            order=6,
        ),
        faults=(
            Fault(
                "malformed_call",
                "one call of the turn is written as broken JSON",
                demonstrable=True,
                repaired_as="repaired_malformed_call",
            ),
            Fault("tool_not_offered", "one call names a tool the task does not offer (yet)", demonstrable=True),
            Fault("one_line_call", "one call written <tool_call>{...}</tool_call> on one line (BFCL reads none)"),
            Fault("fenced_call", "one call's JSON inside a ```json fence between the tags"),
            Fault("two_calls_one_block", "two calls' JSON objects in one <tool_call> block"),
        ),
    ),
    Label(
        "argument_mismatch",
        rho=1.2,
        rho_reason="between state (1.0) and missing (1.5): the model chose the right tool and the fix is "
        "local, so it gets a mild boost",
        priority=80,
        description="The assistant called a real tool with missing, unknown or wrongly typed arguments.",
        guideline=Guideline(
            "follow_the_schema",
            "Give every required argument, use only the parameters a tool declares, and give values of the "
            "declared types.",
            order=7,
        ),
        faults=(
            Fault("missing_required_argument", "one call leaves out a required argument", demonstrable=True),
            Fault("wrong_argument_type", "one argument gets a value of another JSON type", demonstrable=True),
            Fault(
                "out_of_enum_value",
                "an argument with allowed values gets a near miss outside them (another case, a plural)",
                demonstrable=True,
            ),
        ),
    ),
    Label(
        "spurious_tool_call",
        rho=2.0,
        rho_reason="paper",
        priority=70,
        description="The assistant called a tool although this request should be answered without tools.",
        guideline=Guideline(
            "cautious_call",
            "Call a tool only when the request needs one. If nothing asked can be done with a tool, or a "
            "needed detail is missing, answer in text instead of calling.",
            order=1,
            raises=("no_call_answer",),
        ),
        faults=(
            Fault(
                "spurious_call",
                "a state-changing call on a turn whose ground truth makes none (the checker fails it)",
                demonstrable=True,
            ),
            Fault(
                "guessed_value_call",
                "where the user left a value out, the next turn's call made now with a guessed value",
                demonstrable=True,
            ),
        ),
    ),
    Label(
        "instance_mismatch",
        rho=0.6,
        rho_reason="paper",
        priority=50,
        description="The calls changed a part of the system that this request does not concern at all.",
        guideline=Guideline(
            "act_on_the_named_item",
            "Change only what the user asks about: act on the service, account, file or item the request "
            "names, and leave every other part of the system as it is.",
            order=8,
        ),
        faults=(
            Fault(
                "other_instance_call",
                "a state-changing call is replaced by one that changes a back end the turn does not use",
            ),
        ),
    ),
    Label(
        "state_mismatch",
        rho=1.0,
        rho_reason="paper",
        priority=40,
        description="The calls ran but left the system in a different state than the request needs.",
        finer={
            "wrong_target": "The call acted on the wrong item, such as another file, account, ticket or person.",
            "wrong_value": "The call acted on the right item but with a wrong value, amount, text or setting.",
            "missing_step": "One of the needed actions was skipped, so part of the request was never done.",
            "extra_step": "An action the user did not ask for was carried out and changed something.",
            "wrong_order": "The right actions were carried out in an order that gave a different result.",
        },
        guideline=Guideline(
            "state_aware",
            "Keep track of the current state (where you are, what exists, what earlier calls returned) and "
            "base each call on it; make exactly the changes asked for, no more.",
            order=3,
        ),
        faults=(
            Fault(
                "wrong_argument_value",
                "a state-changing call gets another value of the right type",
                demonstrable=True,
            ),
            Fault("dropped_state_call", "a state-changing call of a multi-call turn is left out", demonstrable=True),
            Fault(
                "skipped_precondition",
                "a call a later state-changing call of the turn needs (a cd, a brake) is left out",
                demonstrable=True,
            ),
        ),
    ),
    Label(
        "recovery_failure",
        rho=1.2,
        rho_reason="the error was shown and not repaired; the same mild boost as argument_mismatch",
        priority=30,
        description="A call returned an error and the assistant answered without fixing it.",
        guideline=Guideline(
            "check_target_exists",
            "Before acting on a file, record or item, make sure it exists in the current state; when a call "
            "fails, find out why and retry with a corrected call before you answer.",
            order=4,
        ),
        faults=(
            Fault(
                "unrepaired_error",
                "a read-only call fails (its precondition skipped, or a wrong name) and is never retried",
                demonstrable=True,
                repaired_as="repaired_failing_call",
            ),
        ),
    ),
    Label(
        "missing_tool_call",
        rho=1.5,
        rho_reason="paper (BFCL's empty_turn_model_response)",
        priority=20,
        description="The assistant answered without calling any tool although the request needed one.",
        guideline=Guideline(
            "act_when_a_tool_fits",
            "When a listed tool can do what the user asks, call it in this turn rather than describing what "
            "you would do.",
            order=2,
            raises=("guessed_value_call",),
        ),
        faults=(
            Fault("no_call_answer", "a final answer without a call where one is needed", demonstrable=True),
            Fault(
                "hesitant_start",
                "the first turn that needs a call answered without it, the later turns as they should be",
                demonstrable=True,
            ),
        ),
    ),
    Label(
        "response_mismatch",
        rho=0.9,
        rho_reason="paper",
        priority=10,
        description="The calls ran but the information the user asked for was never fetched.",
        finer={
            "not_fetched": "The information the user asked for was never looked up with a tool.",
            "wrong_item_read": "The assistant looked up a different item than the one the user asked about.",
        },
        guideline=Guideline(
            "match_requested_format",
            "Give the user the information they asked for, taken from the tool outputs, in the form they requested.",
            order=5,
        ),
        faults=(
            Fault("dropped_read_call", "a read-only call whose output the turn shows is left out", demonstrable=True),
        ),
    ),
    Label(
        "not_reached",
        rho=1.0,
        rho_reason="turns the episode never got to carry no evidence either way",
        priority=100,
        failure=False,
        rho_moves=False,
    ),
)
# --- end of the edit point --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registry:
    """The views of the checked entries that the kit reads."""

    labels: tuple[str, ...]
    """Every label, in declaration order."""
    by_priority: tuple[str, ...]
    """Every label, highest priority first: the order the diagnoser tries their rules."""
    failure_labels: tuple[str, ...]
    rho: dict[str, float]
    rho_held: tuple[str, ...]
    """Labels the moving rho never moves."""
    descriptions: dict[str, str]
    """Failure label -> its description for the small model."""
    finer: dict[str, dict[str, str]]
    guidelines: dict[str, tuple[str, str]]
    """Guideline id -> (the label whose failures select it, the text), in guideline order."""
    faults: dict[str, tuple[str, str]]
    """Fault kind -> (expected label at the faulted turn, what is injected)."""
    demonstrable_faults: tuple[str, ...]
    raises: dict[str, tuple[str, ...]]
    """Guideline id -> the fault kinds it makes more likely in a cue-following backbone (its side effects)."""
    repairs: dict[str, str]
    """Fault kind -> the kind that shows its error repaired (with error feedback shown)."""


def _duplicates(values) -> list:
    seen, out = set(), []
    for v in values:
        if v in seen and v not in out:
            out.append(v)
        seen.add(v)
    return out


def _check_entry(entry: Label) -> list[str]:
    """What one entry lacks, as "label X: problem" lines."""
    name = entry.name
    problems = []
    if entry.rho is None:
        problems.append("no rho (its default utility)")
    elif not entry.rho > 0:
        problems.append(f"rho must be > 0 so that weights never flip a sign, got {entry.rho}")
    if not entry.rho_reason:
        problems.append('no rho_reason ("paper", or why the kit chose this value)')
    if entry.priority is None:
        problems.append("no priority (its place among the rules)")
    if entry.failure and not entry.description:
        problems.append("no description for the small model (every failure label needs one)")
    if entry.guideline is not None:
        if not entry.failure:
            problems.append(f"guideline {entry.guideline.id!r} on a label that is no failure (nothing selects it)")
        if not entry.guideline.id or not entry.guideline.text:
            problems.append("a guideline without an id or a text")
    for fault in entry.faults:
        if not fault.kind or not fault.what:
            problems.append("a fault without a kind or a description of what is injected")
    for cause, text in entry.finer.items():
        if not text:
            problems.append(f"finer cause {cause!r} without a description")
    return [f"label {name!r}: {p}" for p in problems]


def build(entries: tuple[Label, ...] | list[Label]) -> Registry:
    """Check every entry and build the views; a RegistryError lists everything that is missing."""
    entries = tuple(entries)
    problems = [p for entry in entries for p in _check_entry(entry)]
    if any(not e.name for e in entries):
        problems.append("an entry without a name")
    for name in _duplicates(e.name for e in entries):
        problems.append(f"label {name!r} is declared twice")
    for priority in _duplicates(e.priority for e in entries if e.priority is not None):
        same = [e.name for e in entries if e.priority == priority]
        problems.append(f"labels {same} share priority {priority}: the rule order would be ambiguous")
    guidelines = [(e.guideline, e.name) for e in entries if e.guideline is not None]
    for gid in _duplicates(g.id for g, _ in guidelines):
        problems.append(f"guideline id {gid!r} is used by labels {[n for g, n in guidelines if g.id == gid]}")
    for order in _duplicates(g.order for g, _ in guidelines):
        problems.append(f"guidelines {[g.id for g, _ in guidelines if g.order == order]} share order {order}")
    faults = [(f, e.name) for e in entries for f in e.faults]
    for kind in _duplicates(f.kind for f, _ in faults):
        problems.append(f"fault kind {kind!r} is declared under labels {[n for f, n in faults if f.kind == kind]}")
    kinds = {f.kind: name for f, name in faults}
    passing = {e.name for e in entries if not e.failure}
    for g, _ in guidelines:
        for kind in g.raises:
            if kind not in kinds:
                problems.append(f"guideline {g.id!r} raises {kind!r}, which is no declared fault kind")
    for f, _ in faults:
        if f.repaired_as and kinds.get(f.repaired_as) not in passing:
            problems.append(f"fault {f.kind!r} is repaired as {f.repaired_as!r}, which is no fault of a passing label")
    if problems:
        raise RegistryError("incomplete label registry:\n  " + "\n  ".join(problems))
    return Registry(
        labels=tuple(e.name for e in entries),
        by_priority=tuple(e.name for e in sorted(entries, key=lambda e: -e.priority)),
        failure_labels=tuple(e.name for e in entries if e.failure),
        rho={e.name: e.rho for e in entries},
        rho_held=tuple(e.name for e in entries if not e.rho_moves),
        descriptions={e.name: e.description for e in entries if e.failure},
        finer={e.name: dict(e.finer) for e in entries if e.finer},
        guidelines={g.id: (name, g.text) for g, name in sorted(guidelines, key=lambda gn: gn[0].order)},
        faults={f.kind: (name, f.what) for f, name in faults},
        demonstrable_faults=tuple(f.kind for f, _ in faults if f.demonstrable),
        raises={g.id: g.raises for g, _ in guidelines if g.raises},
        repairs={f.kind: f.repaired_as for f, _ in faults if f.repaired_as},
    )


def rule_order(registry: Registry, rules: dict[str, Callable]) -> list[tuple[str, Callable]]:
    """(label, rule) for every label, highest priority first; a label without a rule, or a rule for no
    label, is a RegistryError."""
    problems = [
        f"label {z!r}: no rule (bind a function in seal_mini/core/diagnose.py with @rule({z!r}))"
        for z in registry.labels
        if z not in rules
    ]
    problems += [
        f"rule {fn.__name__} is bound to {z!r}, which is no label"
        for z, fn in rules.items()
        if z not in registry.labels
    ]
    if problems:
        raise RegistryError("incomplete diagnoser rules:\n  " + "\n  ".join(problems))
    return [(z, rules[z]) for z in registry.by_priority]


def require_labels(names, where: str) -> None:
    """A table elsewhere names labels: each must exist (RegistryError naming the table and the label)."""
    known = REGISTRY.labels
    unknown = [z for z in names if z not in known]
    if unknown:
        raise RegistryError(f"{where} names {unknown}, which are no labels; labels are {list(known)}")


REGISTRY = build(ENTRIES)

LABELS = REGISTRY.labels
DEFAULT_RHO = REGISTRY.rho
RHO_HELD = REGISTRY.rho_held
FAILURE_LABELS = REGISTRY.failure_labels
"""Labels that say the turn went wrong (not_reached says nothing either way)."""
FAULT_KINDS = REGISTRY.demonstrable_faults
"""Fault kinds a demonstration can carry (sft.faults)."""
