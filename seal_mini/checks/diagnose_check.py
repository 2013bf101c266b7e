"""`python -m seal_mini diagnose-check`: prove the diagnoser on injected faults over all 800 tasks.

For every task it replays the ground truth through the environment (the clean episode: every turn must come out
pass or correct_abstention), then injects each fault kind at every turn where it can be made, one fault per
episode, the ground truth everywhere else, and compares the label at the faulted turn with the fault's expected
label. Calls are scripted one per message, as an agent that reads each result before its next call (--parallel:
all calls of a turn in one message, as the oracle does). It also cuts every turn short (token truncation; one call
message over the per-turn limit) and checks that the cut turn never counts as pass and the turns after it are
not_reached.

Some faults leave no trace at their own turn, or another one than intended (a changed value the back end does not
store; a dropped booking that a later cancellation in the same turn would have undone; a broken call whose output
an earlier turn already fetched, which BFCL passes). The official BFCL checker, run on the episode's turns up to
the faulted one, decides which faults are attributable: for EFFECT_KINDS, when it fails that turn with the error
type of the expected label (CHECKER_ERROR); for the kinds whose label is an error (invalid_tool_call,
argument_mismatch, recovery_failure), when it fails that turn at all, since an error on a turn that ends where the
reference does was repaired; for the repaired kinds (expected pass), when it passes it. BY_CONSTRUCTION kinds are
attributable by construction. Accuracy is reported over all faulty episodes and over the attributable ones. The
faulty episodes of every 8th task also get the full official verdict: a failed episode in which the rules find no
failing turn would show there.

A bar on stderr counts the tasks done. Time is CPU time of this process, split into executing episodes, diagnosing
them (the rules) and building each task's ground-truth reference (once per task, shared by all its episodes). The
last line of output is one JSON object with every number printed above it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from tqdm import tqdm

from seal_mini.checks.oracle import practice_tasks, recipe_tasks
from seal_mini.config import CATEGORIES, DiagnosisConfig, nonnegative
from seal_mini.core.diagnose import diagnose_turns, evidence, reference
from seal_mini.core.faults import BUILDERS, FAULTS, REPAIRED, as_pairs, call_blocks, plan, turn_messages
from seal_mini.core.judge import FINER_LABELS, LABEL_DESCRIPTIONS, judge_from_config, tiny_random_judge, turn_prompt
from seal_mini.envs.bfcl import Task, load_tasks
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import DONE_TEXT, play_messages
from seal_mini.envs.verifier import check
from seal_mini.labels import FAILURE_LABELS, LABELS, RegistryError, require_labels

EFFECT_KINDS = tuple(
    "wrong_argument_value dropped_state_call skipped_precondition dropped_read_call other_instance_call".split()
)
"""Kinds whose expected label rests on the fault's effect; the official checker decides if it shows."""
BY_CONSTRUCTION = tuple(
    "spurious_call guessed_value_call no_call_answer hesitant_start wrong_argument_type out_of_enum_value".split()
)
"""Kinds whose label the turn earns by what it holds alone, wherever it ends: a call where none is needed,
no call where one is, a call outside the schema that ran anyway."""
CHECKER_ERROR = {
    "instance_mismatch": "multi_turn:instance_state_mismatch",
    "state_mismatch": "multi_turn:instance_state_mismatch",
    "response_mismatch": "multi_turn:execution_response_mismatch",
}
"""The official checker's error type when the failure of an effect kind's label shows at its turn (BFCL
compares back-end instances attribute by attribute: one error type for instance and state mismatches)."""
FINER_EXPECTED = {"wrong_argument_value": "wrong_value", "dropped_state_call": "missing_step"}
"""The small model's finer state_mismatch cause that each fault kind implies."""
require_labels(CHECKER_ERROR, "diagnose_check.CHECKER_ERROR")
_unchecked = [kind for kind in EFFECT_KINDS if FAULTS[kind][0] not in CHECKER_ERROR]
if _unchecked:
    raise RegistryError(f"diagnose_check: effect kinds {_unchecked} expect labels with no CHECKER_ERROR entry")
ATTEMPTS = 3
"""Draws per task and fault kind before a fault that does not take is counted as not realized."""


def realized(kind: str, episode: Episode, turn: int) -> bool:
    """The environment's own record shows the injected fault happened (checked before diagnosing)."""
    if turn >= len(episode.turns):
        return False
    events = episode.turns[turn].events
    if kind in ("malformed_call", "one_line_call", "fenced_call", "two_calls_one_block", "repaired_malformed_call"):
        return any(e.error_kind == "parse" for e in events)
    if kind == "tool_not_offered":
        return any(e.violation in ("unknown_tool", "not_offered") for e in events)
    if kind == "missing_required_argument":
        return any(e.violation == "missing_required" for e in events)
    if kind == "wrong_argument_type":
        return any(e.violation == "wrong_type" for e in events)
    if kind == "out_of_enum_value":
        return any(e.violation == "not_in_enum" for e in events)
    if kind in ("unrepaired_error", "repaired_failing_call"):
        return any(e.error_kind == "execution" for e in events)
    return True  # the other faults are realized by construction


# --- driving episodes ---------------------------------------------------------------------------------


def drive(task: Task, messages: list[list[str]], max_calls_per_turn: int = 20, cut_turn: int | None = None) -> Episode:
    """An episode of the task driven by scripted assistant messages per turn (see play_messages); with cut_turn,
    truncated after that turn's messages."""
    episode = Episode(task, max_calls_per_turn=max_calls_per_turn)
    play_messages(episode, messages, cut_turn=cut_turn)
    return episode


def _prefix_verdict(task: Task, episode: Episode, turn: int):
    """The official checker on turns 0..turn only: does the fault show at its own turn?"""
    prefix = dataclasses.replace(task, turns=task.turns[: turn + 1], ground_truth=task.ground_truth[: turn + 1])
    return check(prefix, episode.checker_input()[: turn + 1])


# --- the run --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    expected: str
    n: int = 0
    """Faulty episodes diagnosed."""
    tasks: int = 0
    """Tasks where the fault could be made at some turn."""
    not_realized: int = 0
    """Faults whose injection did not take (e.g. a "missing" file name that exists), after retries."""
    correct: int = 0
    attributable: int = 0
    """Faults the official checker sees at their turn as the expected label (all, for other kinds)."""
    attributable_correct: int = 0
    labels: Counter = field(default_factory=Counter)
    checker_types: Counter = field(default_factory=Counter)
    misses: list = field(default_factory=list)


@dataclass
class Timer:
    execute: float = 0.0
    reference: float = 0.0
    rules: float = 0.0
    verify: float = 0.0
    episodes: int = 0
    tasks: int = 0


def _timed(timer: Timer, key: str, fn, *args, **kwargs):
    # CPU time of this process: on a machine shared with other jobs, wall time would also count theirs.
    start = time.process_time()
    out = fn(*args, **kwargs)
    setattr(timer, key, getattr(timer, key) + time.process_time() - start)
    return out


@dataclass
class Run:
    """Everything one diagnose-check run counts."""

    examples: int
    verify_every: int
    tallies: dict = field(default_factory=lambda: {k: Tally(FAULTS[k][0]) for k in BUILDERS})
    confusion: dict = field(default_factory=lambda: {z: Counter() for z in LABELS})
    clean: dict = field(default_factory=lambda: {"episodes": 0, "turns": 0, "labels": Counter(), "failures": []})
    around: dict = field(default_factory=lambda: {"before": Counter(), "after": Counter()})
    cut: dict = field(
        default_factory=lambda: {"episodes": 0, "cut_turn_labels": Counter(), "cut_turn_pass": 0, "later_reached": 0}
    )
    verdicts: Counter = field(default_factory=Counter)
    """(official reward, rules found a failing turn) over a sample of faulty episodes."""
    crashes: list = field(default_factory=list)
    timer: Timer = field(default_factory=Timer)

    def diagnose(self, episode, what: str):
        """The diagnoser on one episode, timed; None (and a counted crash) if it raises."""
        self.timer.episodes += 1
        try:
            return _timed(self.timer, "rules", diagnose_turns, episode)
        except Exception as e:  # counted and shown, never hidden
            self.crashes.append(f"{what} {episode.task.id}: {type(e).__name__}: {e}")
            return None

    def score_fault(self, kind: str, episode, turn: int, note: str) -> None:
        """Diagnose one faulty episode and count the label at its faulted turn."""
        tally = self.tallies[kind]
        diagnoses = self.diagnose(episode, kind)
        if diagnoses is None:
            return
        task, label = episode.task, diagnoses[turn].label
        tally.n += 1
        tally.labels[label] += 1
        tally.correct += label == tally.expected
        self.confusion[tally.expected][label] += 1
        self.around["before"].update(d.label for d in diagnoses[:turn])
        self.around["after"].update(d.label for d in diagnoses[turn + 1 :])
        seen = ""
        if kind not in BY_CONSTRUCTION:
            verdict = _timed(self.timer, "verify", _prefix_verdict, task, episode, turn)
            seen = verdict.error_type or "passes the turn"
            tally.checker_types[verdict.error_type or "passed"] += 1
        if kind in EFFECT_KINDS:
            attributable = seen == CHECKER_ERROR[tally.expected]
        elif tally.expected == "pass":
            attributable = seen == "passes the turn"
        else:
            attributable = kind in BY_CONSTRUCTION or seen != "passes the turn"
        tally.attributable += attributable
        tally.attributable_correct += attributable and label == tally.expected
        if label != tally.expected and len(tally.misses) < self.examples:
            masked = "" if attributable else f" (not attributable: the official checker says {seen})"
            tally.misses.append(f"{task.id} turn {turn} [{note}] -> {label}: {diagnoses[turn].reason}{masked}")
        if self.verify_every and task.index % self.verify_every == 0:
            forced = episode.ended_by == "turn_limit"
            verdict = _timed(self.timer, "verify", check, task, episode.checker_input(), forced)
            self.verdicts[(verdict.reward, any(d.label in FAILURE_LABELS for d in diagnoses))] += 1


def run_check(
    categories=CATEGORIES,
    limit: int = 0,
    seed: int = 0,
    examples: int = 3,
    turns_per_fault: int = 0,
    parallel: bool = False,
    verify_every: int = 8,
    tasks: list[Task] | None = None,
) -> dict:
    """Clean, faulty and cut-short episodes for every task (BFCL's, or the `tasks` given); returns all the numbers.

    Each fault kind is injected at every turn of a task where it can be made (turns_per_fault > 0:
    at most that many such turns, drawn at random), one fault per episode. The faulty episodes of
    every verify_every-th task (by index) also get the official verdict, to count failed episodes in
    which the rules found no failing turn."""
    tasks = [t for t in tasks or load_tasks(categories) if t.category in categories and (not limit or t.index < limit)]
    run = Run(examples, verify_every)
    timer = run.timer
    timer.tasks = len(tasks)
    for task in tqdm(tasks, desc="diagnose-check", unit="task"):  # the report comes at the end (80 s on BFCL's)
        # The reference is built once per task and shared by all its episodes, as by the G samples of
        # a training group; its cost is timed on its own.
        _timed(timer, "reference", reference, task)
        p = plan(task)
        gt = [as_pairs(calls) for calls in p]
        gt_messages = [turn_messages(call_blocks(calls), parallel) for calls in gt]

        diagnoses = run.diagnose(_timed(timer, "execute", drive, task, gt_messages), "clean") or []
        run.clean["episodes"] += 1
        run.clean["turns"] += len(diagnoses)
        for d in diagnoses:
            run.clean["labels"][d.label] += 1
            expected = "pass" if gt[d.index] else "correct_abstention"
            run.confusion[expected][d.label] += 1
            if d.label != expected:
                run.clean["failures"].append(f"{task.id} turn {d.index}: {d.label} ({d.reason})")

        for kind, builder in BUILDERS.items():
            tally = run.tallies[kind]
            turns = list(range(len(task.turns)))
            if turns_per_fault:
                random.Random(f"{seed}:{task.id}:{kind}").shuffle(turns)
            made = 0
            for turn in turns:
                if turns_per_fault and made == turns_per_fault:
                    break
                rng = random.Random(f"{seed}:{task.id}:{kind}:{turn}")
                episode = built = None
                for _ in range(ATTEMPTS):  # a fault that did not take (a "missing" value that exists) is redrawn
                    built = builder(task, p, turn, rng)
                    if built is None:
                        break
                    blocks, note = built
                    scripted = blocks + [DONE_TEXT] if kind in REPAIRED else turn_messages(blocks, parallel)
                    messages = gt_messages[:turn] + [scripted] + gt_messages[turn + 1 :]
                    episode = _timed(timer, "execute", drive, task, messages)
                    if realized(kind, episode, turn):
                        break
                    episode = None
                if built is None:
                    continue
                made += 1
                if episode is None:
                    tally.not_realized += 1
                else:
                    run.score_fault(kind, episode, turn, note)
            tally.tasks += made > 0

        # Cut short at every turn: truncated after the turn's calls, and over the per-turn call limit.
        any_call = [(c.name, dict(c.arguments)) for calls in p for c in calls][:1]
        for turn in range(len(task.turns)):
            truncated = gt_messages[:turn] + [turn_messages(call_blocks(gt[turn]), parallel, final=None)]
            episodes = [_timed(timer, "execute", drive, task, truncated, cut_turn=turn)]
            calls = gt[turn] or any_call
            if calls:  # one call message too many for a limit of one
                message = "\n".join(call_blocks(calls))
                looping = gt_messages[:turn] + [[message, message, DONE_TEXT]]
                episodes.append(_timed(timer, "execute", drive, task, looping, max_calls_per_turn=1))
            for episode in episodes:
                run.cut["episodes"] += 1
                diagnoses = run.diagnose(episode, f"cut at turn {turn}")
                if diagnoses is None:
                    continue
                labels = [d.label for d in diagnoses]
                run.cut["cut_turn_labels"][labels[turn]] += 1
                run.cut["cut_turn_pass"] += labels[turn] in ("pass", "correct_abstention")
                run.cut["later_reached"] += sum(z != "not_reached" for z in labels[turn + 1 :])

    return _summary(run)


def _precision_recall(confusion: dict[str, Counter]) -> dict[str, dict]:
    out = {}
    for z in LABELS:
        support = sum(confusion[z].values())
        predicted = sum(row[z] for row in confusion.values())
        hit = confusion[z][z]
        if support or predicted:
            out[z] = {
                "precision": round(hit / predicted, 4) if predicted else None,
                "recall": round(hit / support, 4) if support else None,
                "support": support,
            }
    return out


def _summary(run: Run) -> dict:
    faults = {}
    timer, clean, cut = run.timer, run.clean, run.cut
    for kind, t in run.tallies.items():
        faults[kind] = {
            "expected": t.expected,
            "episodes": t.n,
            "accuracy": round(t.correct / t.n, 4) if t.n else None,
            "attributable": t.attributable,
            "attributable_accuracy": round(t.attributable_correct / t.attributable, 4) if t.attributable else None,
            "tasks": t.tasks,
            "not_realized": t.not_realized,
            "labels": dict(t.labels.most_common()),
            "misses": t.misses,
        }
        if t.checker_types:
            faults[kind]["checker_at_fault_turn"] = dict(t.checker_types.most_common())
    n = max(timer.episodes, 1)
    execute_ms = 1000 * timer.execute / n
    timing = {
        "episodes": timer.episodes,
        "tasks": timer.tasks,
        "execute_s": round(timer.execute, 3),
        "diagnose_s": round(timer.rules + timer.reference, 3),
        "rules_s": round(timer.rules, 3),
        "reference_s": round(timer.reference, 3),
        "verify_s": round(timer.verify, 3),
        "execute_ms_per_episode": round(execute_ms, 3),
        "rules_ms_per_episode": round(1000 * timer.rules / n, 3),
        "reference_ms_per_task": round(1000 * timer.reference / max(timer.tasks, 1), 3),
        # Diagnosing one more episode of a task whose reference is built (the G samples of a group):
        "rules_over_execute": round(timer.rules / max(timer.execute, 1e-9), 4),
        # Everything, the reference of each task included, over everything executed here:
        "diagnose_over_execute": round((timer.rules + timer.reference) / max(timer.execute, 1e-9), 4),
    }
    return {
        "clean": {
            "episodes": clean["episodes"],
            "turns": clean["turns"],
            "labels": dict(clean["labels"].most_common()),
            "all_pass_or_abstention": not clean["failures"],
            "failures": clean["failures"][:20],
        },
        "faults": faults,
        "confusion": {z: dict(row.most_common()) for z, row in run.confusion.items() if row},
        "per_label": _precision_recall(run.confusion),
        "turns_before_fault": dict(run.around["before"].most_common()),
        "turns_after_fault": dict(run.around["after"].most_common()),
        "cut_short": {**cut, "cut_turn_labels": dict(cut["cut_turn_labels"].most_common())},
        "official_verdict": {
            "episodes": sum(run.verdicts.values()),
            "failed_with_a_failing_turn": run.verdicts[(0.0, True)],
            "failed_without_a_failing_turn": run.verdicts[(0.0, False)],
            "passed_with_a_failing_turn": run.verdicts[(1.0, True)],
            "passed_without": run.verdicts[(1.0, False)],
        },
        "crashes": run.crashes[:20],
        "crash_count": len(run.crashes),
        "timing": timing,
    }


# --- the optional small model ------------------------------------------------------------------------------


def judge_agreement(judge, categories=CATEGORIES, limit: int = 0, seed: int = 0, turns: int = 70) -> dict:
    """How often the small model's closed-set pick agrees with the rules on faulted turns (and, for two
    state faults, with the finer cause the fault implies). Sampled: `turns` faulty episodes."""
    tasks = [t for t in load_tasks(categories) if not limit or t.index < limit]
    rng = random.Random(f"{seed}:judge")
    kinds = list(FAULTS)
    start = time.perf_counter()
    agree = finer_agree = finer_n = n = 0
    for i in tqdm(range(turns), desc="small-model judge", unit="episode"):
        task, kind = rng.choice(tasks), kinds[i % len(kinds)]
        p = plan(task)
        options = [(t, b) for t in range(len(p)) if (b := BUILDERS[kind](task, p, t, random.Random(i)))]
        if not options:
            continue
        turn, (blocks, _) = rng.choice(options)
        gt_messages = [turn_messages(call_blocks(as_pairs(calls))) for calls in p]
        episode = drive(task, gt_messages[:turn] + [turn_messages(blocks)] + gt_messages[turn + 1 :])
        diagnoses = diagnose_turns(episode)
        rule_label = diagnoses[turn].label
        if rule_label not in FAILURE_LABELS:
            continue
        ev = evidence(episode)[turn]
        picked, _ = judge.pick(turn_prompt(ev), {z: LABEL_DESCRIPTIONS[z] for z in FAILURE_LABELS})
        n += 1
        agree += picked == rule_label
        if kind in FINER_EXPECTED and rule_label == "state_mismatch":
            judge.refine([diagnoses[turn]], {turn: ev})
            finer_n += 1
            finer_agree += diagnoses[turn].detail == FINER_EXPECTED[kind]
    return {
        "turns": n,
        "agreement_with_rules": round(agree / n, 4) if n else None,
        "chance": round(1 / len(FAILURE_LABELS), 4),
        "finer_turns": finer_n,
        "finer_agreement_with_fault": round(finer_agree / finer_n, 4) if finer_n else None,
        "finer_chance": round(1 / len(FINER_LABELS["state_mismatch"]), 4),
        "seconds": round(time.perf_counter() - start, 3),
    }


# --- printing -----------------------------------------------------------------------------------------


def _print_report(result: dict) -> None:
    c = result["clean"]
    print(f"clean ground truth: {c['episodes']} episodes, {c['turns']} turns: {c['labels']}")
    print(f"  every turn pass or correct_abstention: {c['all_pass_or_abstention']}")
    for line in c["failures"]:
        print(f"  ! {line}")
    print("\nfaults (label at the faulted turn):")
    print(f"  {'fault':<26} {'expected':<19} {'n':>5} {'acc':>7} {'attrib.':>8} {'acc':>7}  other labels")
    for kind, f in result["faults"].items():
        acc = "-" if f["accuracy"] is None else f"{f['accuracy']:.3f}"
        oacc = "-" if f["attributable_accuracy"] is None else f"{f['attributable_accuracy']:.3f}"
        others = {z: v for z, v in f["labels"].items() if z != f["expected"]}
        print(
            f"  {kind:<26} {f['expected']:<19} {f['episodes']:>5} {acc:>7} {f['attributable']:>8} {oacc:>7}  {others}"
        )
        print(f"  {'':<26} made in {f['tasks']} tasks; not realized {f['not_realized']} times")
        if "checker_at_fault_turn" in f:
            print(f"  {'':<26} official checker at that turn: {f['checker_at_fault_turn']}")
        for miss in f["misses"]:
            print(f"  {'':<26} miss: {miss}")
    print("\nconfusion (rows expected, columns diagnosed; clean turns included):")
    columns = [z for z in LABELS if any(z in row for row in result["confusion"].values())]
    short = {z: z[:9] for z in columns}
    print(f"  {'':<19}" + "".join(f"{short[z]:>10}" for z in columns))
    for z, row in result["confusion"].items():
        print(f"  {z:<19}" + "".join(f"{row.get(c, 0):>10}" for c in columns))
    print("\nper label:")
    for z, v in result["per_label"].items():
        print(f"  {z:<19} precision {v['precision']}  recall {v['recall']}  support {v['support']}")
    print(f"\nturns before the fault: {result['turns_before_fault']}")
    print(f"turns after the fault:  {result['turns_after_fault']}")
    cs = result["cut_short"]
    print(
        f"\ncut short: {cs['episodes']} episodes, cut turn labelled {cs['cut_turn_labels']}; "
        f"cut turns counted as pass: {cs['cut_turn_pass']}; later turns not labelled not_reached: {cs['later_reached']}"
    )
    v = result["official_verdict"]
    print(
        f"official verdict on {v['episodes']} faulty episodes (every few tasks): failed with a failing turn "
        f"{v['failed_with_a_failing_turn']}, failed without one {v['failed_without_a_failing_turn']}, passed "
        f"with one {v['passed_with_a_failing_turn']}, passed without {v['passed_without']}"
    )
    print(f"diagnoser crashes: {result['crash_count']}")
    for line in result["crashes"]:
        print(f"  crash: {line}")
    t = result["timing"]
    print(
        f"\ntiming: {t['episodes']} episodes; executing {t['execute_s']} s ({t['execute_ms_per_episode']} ms each); "
        f"diagnosing {t['diagnose_s']} s = rules {t['rules_s']} s ({t['rules_ms_per_episode']} ms each) + "
        f"ground-truth reference {t['reference_s']} s ({t['reference_ms_per_task']} ms per task)"
    )
    print(
        f"  diagnosing / executing: {t['rules_over_execute']} per episode once its task's reference exists; "
        f"{t['diagnose_over_execute']} with every reference counted ({t['episodes'] / max(t['tasks'], 1):.1f} "
        f"episodes per task here). CPU seconds. The official checker took {t['verify_s']} s for its calls here."
    )
    if result.get("small_model"):
        s = result["small_model"]
        print(
            f"\nsmall model on {s['turns']} faulted turns: agrees with the rules {s['agreement_with_rules']} "
            f"(chance {s['chance']}); finer state cause matches the fault {s['finer_agreement_with_fault']} "
            f"on {s['finer_turns']} turns (chance {s['finer_chance']}); {s['seconds']} s"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini diagnose-check", description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=nonnegative, default=0, help="only task indices below this in each category")
    parser.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)
    parser.add_argument("--seed", type=int, default=0, help="seed of the faulted-turn draws")
    parser.add_argument("--examples", type=nonnegative, default=3, help="misses shown per fault kind")
    parser.add_argument(
        "--small-model",
        default="",
        help="also measure the small-model judge: 'tiny' (a random tiny Qwen2: mechanism only) or a local model folder",
    )
    parser.add_argument(
        "--turns-per-fault",
        type=nonnegative,
        default=0,
        help="faulted turns per task and kind (0 = every turn where it applies)",
    )
    parser.add_argument(
        "--parallel", action="store_true", help="script all calls of a turn in one message (default: one per message)"
    )
    parser.add_argument(
        "--verify-every",
        type=nonnegative,
        default=8,
        help="official verdict on the faulty episodes of every N-th task (0: none)",
    )
    parser.add_argument(
        "--small-model-turns", type=nonnegative, default=70, help="faulty episodes the small model judges"
    )
    parser.add_argument(
        "--practice", action="store_true", help="the practice sets (training and held-in) instead of BFCL's tasks"
    )
    parser.add_argument("--recipe", help="a recipe's split instead (e.g. data.source: tasks, a world of your own)")
    args = parser.parse_args(argv)
    tasks = practice_tasks(args.seed) if args.practice else recipe_tasks(args.recipe) if args.recipe else None
    result = run_check(
        args.categories,
        args.limit,
        args.seed,
        args.examples,
        args.turns_per_fault,
        args.parallel,
        args.verify_every,
        tasks,
    )
    if args.small_model:
        if args.small_model == "tiny":
            judge = tiny_random_judge(args.seed)
        else:
            judge = judge_from_config(DiagnosisConfig(small_model=True, small_model_name=args.small_model))
        result["small_model"] = judge_agreement(judge, args.categories, args.limit, args.seed, args.small_model_turns)
        result["small_model"]["model"] = args.small_model
    _print_report(result)
    print(json.dumps(result))
    return 0
