"""The turn-level diagnoser: rules on real BFCL episodes, profiles against hand numbers, the small model."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from seal_mini.checks import diagnose_check
from seal_mini.config import CATEGORIES, LABELS, ConfigError, DiagnosisConfig
from seal_mini.core import faults
from seal_mini.core.diagnose import (
    RULES,
    diagnose,
    diagnose_turns,
    differences,
    failure_profile,
    trajectory_profile,
)
from seal_mini.envs import practice
from seal_mini.envs.bfcl import load_tasks, tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import DONE_TEXT, ground_truth_turns, scripted_messages
from seal_mini.envs.toolcalls import format_call
from seal_mini.envs.verifier import Verdict, check_episode

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

TASKS = tasks_by_id()


def call(name: str, **arguments) -> str:
    return format_call(name, arguments)


def run(task_id: str, turns: dict[int, list[str]], **limits) -> Episode:
    """Drive an episode: the given assistant messages at some turns, the ground truth at the others."""
    task = TASKS[task_id]
    gt = [scripted_messages(calls) for calls in ground_truth_turns(task)]
    return diagnose_check.drive(task, [turns.get(k, messages) for k, messages in enumerate(gt)], **limits)


# base_0, ground truth per turn:
#   0: cd(document), mkdir(temp), mv(final_report.pdf -> temp)
#   1: cd(temp), grep(final_report.pdf, 'budget analysis')
#   2: sort(final_report.pdf)
#   3: cd(..), mv(previous_report.pdf -> temp), cd(temp), diff(final_report.pdf, previous_report.pdf)
TURN0 = [
    call("cd", folder="document"),
    call("mkdir", dir_name="temp"),
    call("mv", source="final_report.pdf", destination="temp"),
]
TURN1 = [call("cd", folder="temp"), call("grep", file_name="final_report.pdf", pattern="budget analysis")]


def test_clean_ground_truth_of_all_800_tasks_is_pass_or_abstention():
    tasks = load_tasks()
    assert len(tasks) == 800
    bad = []
    for task in tasks:
        turns = ground_truth_turns(task)
        episode = diagnose_check.drive(task, [scripted_messages(calls) for calls in turns])
        labels = diagnose(episode)
        expected = ["pass" if calls else "correct_abstention" for calls in turns]
        if labels != expected:
            bad.append((task.id, labels))
    assert not bad, bad[:5]


@pytest.mark.parametrize(
    "turn1, expected",
    [
        (['<tool_call>\n{"name": "cd", "arguments": {"folder": "temp"}\n</tool_call>', DONE_TEXT], "invalid_tool_call"),
        # BFCL reads calls only with the tags on lines of their own: this turn made no call it can read
        (['<tool_call>{"name": "cd", "arguments": {"folder": "temp"}}</tool_call>'], "invalid_tool_call"),
        (["\n".join([TURN1[0], call("post_to_slack", text="done")]), DONE_TEXT], "invalid_tool_call"),
        (["\n".join([TURN1[0], call("grep", file_name="final_report.pdf")]), DONE_TEXT], "argument_mismatch"),
        (
            ["\n".join([TURN1[0], call("grep", file_name="final_report.pdf", pattern=7)]), DONE_TEXT],
            "argument_mismatch",
        ),
        (
            ["\n".join([call("cd", folder="temp"), call("touch", file_name="notes.txt"), TURN1[1]]), DONE_TEXT],
            "state_mismatch",
        ),
        (
            ["\n".join([TURN1[0], call("grep", file_name="nope.pdf", pattern="budget analysis")]), DONE_TEXT],
            "recovery_failure",
        ),
        (["I did it."], "missing_tool_call"),
        ([TURN1[0], DONE_TEXT], "response_mismatch"),
        # Errors on a turn that still ends where the reference does were repaired: pass, whatever the kind.
        ([TURN1[0], call("grep", file_name="nope.pdf", pattern="budget analysis"), TURN1[1], DONE_TEXT], "pass"),
        # (a message with only an unreadable block ends the turn in BFCL; next to a readable call it does not)
        ([TURN1[0] + '\n<tool_call>\n{"name": "grep", "arguments": {\n</tool_call>', TURN1[1], DONE_TEXT], "pass"),
        (
            [TURN1[0], '<tool_call>\n{"name": "grep", "arguments": {\n</tool_call>', TURN1[1], DONE_TEXT],
            "invalid_tool_call",
        ),
        (["\n".join([*TURN1, call("post_to_slack", text="done")]), DONE_TEXT], "pass"),
        ([TURN1[0], call("grep", file_name="final_report.pdf"), TURN1[1], DONE_TEXT], "pass"),
        (["\n".join(TURN1), DONE_TEXT], "pass"),
    ],
)
def test_hand_written_turn_gets_its_label(turn1, expected):
    episode = run("multi_turn_base_0", {1: turn1})
    labels = diagnose(episode)
    assert labels[1] == expected, diagnose_turns(episode)[1]
    assert labels[0] == "pass"


def test_turns_without_a_reference_call():
    # miss_param_0 turn 3 leaves a parameter out: the right answer is to ask, not to call.
    ok = run("multi_turn_miss_param_0", {3: ["Which file do you mean?"]})
    spurious = run("multi_turn_miss_param_0", {3: [call("ls"), DONE_TEXT]})
    assert diagnose(ok)[3] == "correct_abstention"
    assert diagnose(spurious)[3] == "spurious_tool_call"
    # miss_func_0 reveals `sort` at turn 3: calling it at turn 2, a turn that needs no call, is spurious (SEAL's
    # label for any call on such a turn), although the tool is not offered yet; so is an unreadable call there.
    early = run("multi_turn_miss_func_0", {2: [call("sort", file_name="final_report.pdf"), DONE_TEXT]})
    assert diagnose(early)[2] == "spurious_tool_call"
    broken = run(
        "multi_turn_miss_param_0", {3: ['<tool_call>\n{"name": "ls", "arguments": {}\n</tool_call>', DONE_TEXT]}
    )
    assert diagnose(broken)[3] == "spurious_tool_call", diagnose_turns(broken)[3]


# base_5, ground truth per turn (back ends: GorillaFileSystem, TwitterAPI):
#   0: cd(project), mv(analysis_report.csv -> archive)     1: cat, sort (reads)
#   2: authenticate_twitter, post_tweet(...)               3: comment(tweet_id=0, ...)
TWEET = call("post_tweet", content="Managed to archive important data files!")
MOVE = call("mv", source="analysis_report.csv", destination="archive")


@pytest.mark.parametrize(
    "turn, messages, expected",
    [
        # the wrong object: a tweet in place of the move (the file system is left as it was)
        (0, [call("cd", folder="project"), TWEET, DONE_TEXT], "instance_mismatch"),
        # ...or besides it: the file system is right, the Twitter account was not to be touched
        (0, [call("cd", folder="project"), MOVE, TWEET, DONE_TEXT], "instance_mismatch"),
        # instance outranks state: a wrong move and a tweet
        (
            0,
            [call("cd", folder="project"), call("mv", source="analysis_report.csv", destination="x"), TWEET, DONE_TEXT],
            "instance_mismatch",
        ),
        # the right object with another value is a state mismatch
        (
            0,
            [call("cd", folder="project"), call("mv", source="analysis_report.csv", destination="x"), DONE_TEXT],
            "state_mismatch",
        ),
        # a change too many inside the back end the turn uses is a state mismatch too
        (
            3,
            [call("comment", tweet_id=0, comment_content="Another successful task completed today!"), TWEET, DONE_TEXT],
            "state_mismatch",
        ),
        # reading another back end changes nothing: the turn passes
        (0, [call("cd", folder="project"), MOVE, call("get_user_stats", username="dr_smith"), DONE_TEXT], "pass"),
    ],
)
def test_instance_mismatch_is_a_back_end_the_turn_does_not_use_changed(turn, messages, expected):
    episode = run("multi_turn_base_5", {turn: messages})
    assert not any(e.error_kind for e in episode.turns[turn].events)  # every call ran: the state alone decides
    diagnosis = diagnose_turns(episode)[turn]
    assert diagnosis.label == expected, diagnosis
    assert all(z in ("pass", "correct_abstention") for z in diagnose(episode)[:turn])
    if expected == "instance_mismatch":
        assert "TwitterAPI" in diagnosis.reason


@pytest.mark.parametrize("kind", list(faults.FAULTS))
def test_each_fault_kind_on_hand_picked_tasks(kind):
    expected = faults.FAULTS[kind][0]
    ids = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_miss_func_0", "multi_turn_miss_param_0"]
    ids += ["multi_turn_long_context_0", "multi_turn_base_50", "multi_turn_base_120", "multi_turn_miss_param_150"]
    ids += ["multi_turn_base_5", "multi_turn_base_51"]  # two back ends changed at different turns
    # and practice tasks: their docs write enums out, and their miss_param turns leave out values a model invents
    tasks = [TASKS[i] for i in ids] + [
        practice.task(practice.task_id(0, "train", c, n)) for c in CATEGORIES for n in range(6)
    ]
    checked = 0
    for task in tasks:
        task_id = task.id
        p = faults.plan(task)
        gt = [scripted_messages(faults.as_pairs(calls)) for calls in p]
        for turn in range(len(task.turns)):
            built = faults.BUILDERS[kind](task, p, turn, random.Random(turn))
            if built is None:
                continue
            episode = diagnose_check.drive(task, gt[:turn] + [faults.turn_messages(built[0])] + gt[turn + 1 :])
            if not diagnose_check.realized(kind, episode, turn):
                continue
            if expected != "pass" and kind not in diagnose_check.BY_CONSTRUCTION and check_episode(episode).reward:
                continue  # the turn still ends right (a read whose output an earlier turn showed): nothing to name
            labels = diagnose(episode)
            assert labels[turn] == expected, (task_id, turn, built[1], diagnose_turns(episode)[turn])
            assert all(z in ("pass", "correct_abstention") for z in labels[:turn])
            checked += 1
    assert checked >= 2, f"{kind} was made only {checked} times"


def test_priority_order_is_the_papers():
    order = [label for label, _ in RULES]
    failures = [z for z in order if z in ("invalid_tool_call", "argument_mismatch", "state_mismatch")]
    assert failures == ["invalid_tool_call", "argument_mismatch", "state_mismatch"]
    assert order.index("state_mismatch") < order.index("recovery_failure") < order.index("missing_tool_call")
    assert order.index("missing_tool_call") < order.index("response_mismatch") < order.index("pass")
    assert order[0] == order[-1] == "not_reached"
    assert set(order) == set(LABELS)


@pytest.mark.parametrize(
    "messages, expected",
    [
        # malformed + missing argument + a wrong state: invalid wins
        (["\n".join(["<tool_call>\n{oops\n</tool_call>", call("mkdir"), *TURN0[:2]]), DONE_TEXT], "invalid_tool_call"),
        # missing argument + a wrong state: argument wins
        (
            ["\n".join([call("mkdir"), TURN0[0], call("mkdir", dir_name="tmp"), TURN0[2]]), DONE_TEXT],
            "argument_mismatch",
        ),
        # wrong state + an unrepaired error: state wins
        (
            ["\n".join([TURN0[0], call("cat", file_name="nope"), call("mkdir", dir_name="tmp")]), DONE_TEXT],
            "state_mismatch",
        ),
    ],
)
def test_priority_when_several_signals_hit_one_turn(messages, expected):
    assert diagnose(run("multi_turn_base_0", {0: messages}))[0] == expected


def test_later_turns_are_judged_against_the_state_the_model_had():
    # An extra file at turn 0 puts the file system off the reference for good; later turns do the
    # right thing on the state they were given, so they pass.
    extra = call("touch", file_name="extra.txt")
    episode = run("multi_turn_base_0", {0: ["\n".join([*TURN0, extra]), DONE_TEXT]})
    assert diagnose(episode) == ["state_mismatch", "pass", "pass", "pass"]
    assert "extra.txt" in diagnose_turns(episode)[0].reason
    # Turn 0 never makes the temp folder: the reference calls of turn 1 (cd temp, grep) fail on the
    # model's state exactly as the model's do, which is no new recovery failure; turn 2 then passes too.
    episode = run("multi_turn_base_0", {0: [TURN0[0], DONE_TEXT]})
    labels = diagnose(episode)
    assert labels[0] == "state_mismatch" and labels[1:3] == ["pass", "pass"], diagnose_turns(episode)
    # A private divergence (no cd at turn 0: the working directory differs, public state does not yet)
    # is the failure of turn 0; turn 1 is judged from the directory the model is in.
    episode = run("multi_turn_base_0", {0: ["\n".join(TURN0[1:]), DONE_TEXT]})
    assert diagnose(episode)[0] != "pass"


def test_truncated_and_cut_turns_never_pass():
    # Truncated in turn 1 after its calls, before the final answer.
    episode = run("multi_turn_base_0", {1: ["\n".join(TURN1)]}, cut_turn=1)
    assert diagnose(episode) == ["pass", "not_reached", "not_reached", "not_reached"]
    # Truncated before turn 1 said anything: its first message was cut by the token budget.
    episode = run("multi_turn_base_0", {1: []}, cut_turn=1)
    assert diagnose(episode) == ["pass", "not_reached", "not_reached", "not_reached"]
    reasons = [d.reason for d in diagnose_turns(episode)]
    assert "cut by the token budget" in reasons[1] and "ended before it" in reasons[2]
    # Cut after an unrepaired error: the error is still evidence.
    failing = call("grep", file_name="nope.pdf", pattern="x")
    episode = run("multi_turn_base_0", {1: [failing]}, cut_turn=1)
    assert diagnose(episode)[1:] == ["recovery_failure", "not_reached", "not_reached"]
    # Over the per-turn call limit (BFCL force-quits the episode).
    episode = run("multi_turn_base_0", {1: [call("ls"), call("ls"), DONE_TEXT]}, max_calls_per_turn=1)
    assert episode.ended_by == "turn_limit"
    assert diagnose(episode) == ["pass", "not_reached", "not_reached", "not_reached"]
    # A turn without a reference call cut before its answer is no correct abstention.
    episode = run("multi_turn_miss_param_0", {3: []}, cut_turn=3)
    assert diagnose(episode)[3:] == ["not_reached", "not_reached"]


def test_unfinished_episode_and_wrapper_objects():
    task = TASKS["multi_turn_base_0"]
    episode = Episode(task)
    episode.reset()
    episode.step("\n".join(TURN0))  # turn 0 is still open: no state recorded for it
    assert diagnose(episode) == ["not_reached"] * 4
    # The training interface wraps episodes; only these attributes are read.
    done = run("multi_turn_base_0", {2: ["I did it."]})
    wrapper = SimpleNamespace(
        task=done.task, turn_records=done.turn_records, turn_states=done.turn_states, ended_by=done.ended_by
    )
    assert diagnose(wrapper) == diagnose(done) == ["pass", "pass", "missing_tool_call", "pass"]


def test_a_failed_verdict_with_no_failing_turn_takes_the_checkers_label():
    episode = run("multi_turn_base_0", {})
    verdict = Verdict(0.0, "multi_turn:execution_response_mismatch", 2)
    diagnoses = diagnose_turns(episode, verdict)
    assert [d.label for d in diagnoses] == ["pass", "pass", "response_mismatch", "pass"]
    assert diagnoses[2].ambiguous and diagnoses[2].reason.startswith("checker")
    # A verdict that agrees with a rule label changes nothing.
    assert diagnose(run("multi_turn_base_0", {0: ["no"]}), Verdict(0.0, "multi_turn:empty_turn_model_response", 0))[
        0
    ] == ("missing_tool_call")


def test_differences_by_hand():
    model = {"n": 2, "log": ["x", "y"], "files": {"a": 1, "b": 2}}
    ref = {"n": 2, "log": ["x", "z"], "files": {"a": 1, "c": 3}}
    assert differences(model, model) == []
    assert differences(model, ref) == [("log", 1), ("files", "b"), ("files", "c")]
    assert differences([1], [1, 2]) == [()]  # lists of other lengths differ as a whole


def test_trajectory_profile_by_hand():
    p = trajectory_profile(["pass", "state_mismatch", "pass", "not_reached"])
    assert p == {"pass": 0.5, "state_mismatch": 0.25, "not_reached": 0.25}
    with pytest.raises(ValueError):
        trajectory_profile(["passed"])


def test_failure_profile_by_hand():
    labels = [["pass", "state_mismatch"], ["state_mismatch", "state_mismatch", "not_reached"], ["pass", "pass"]]
    profile = failure_profile(labels, [1.0, 0.0, 1.0])
    # 7 turns: state_mismatch 3 (in trajectories 0 and 1, rewards 1 and 0), pass 3 (trajectories 0, 2).
    assert profile["state_mismatch"] == {"count": 3, "prevalence": 3 / 7, "success_rate": 0.5, "trajectories": 2}
    assert profile["pass"] == {"count": 3, "prevalence": 3 / 7, "success_rate": 1.0, "trajectories": 2}
    assert profile["not_reached"] == {"count": 1, "prevalence": 1 / 7, "success_rate": 0.0, "trajectories": 1}
    assert profile["spurious_tool_call"] == {"count": 0, "prevalence": 0.0, "success_rate": None, "trajectories": 0}
    assert set(profile) == set(LABELS)
    json.dumps(profile)
    with pytest.raises(ValueError):
        failure_profile(labels, [1.0])


# --- the small model -----------------------------------------------------------------------------------


def test_judge_scores_are_mean_description_log_likelihoods():
    import torch

    from seal_mini.core.judge import LABEL_DESCRIPTIONS, tiny_random_judge

    judge = tiny_random_judge(seed=0)
    prompt = "User request: move the file\nAssistant tool calls:\n- (none)\nMost likely cause:"
    descriptions = list(LABEL_DESCRIPTIONS.values())[:3]
    batched = judge.scores(prompt, descriptions)
    for description, score in zip(descriptions, batched, strict=True):
        ids, tail = judge._ids(prompt), judge._ids(" " + description)
        with torch.no_grad():
            logp = judge.model(input_ids=torch.tensor([ids + tail])).logits[0].log_softmax(-1)  # (T, V)
        expected = sum(logp[len(ids) + j - 1, t].item() for j, t in enumerate(tail)) / len(tail)
        assert score == pytest.approx(expected, abs=1e-4)


def test_judge_on_a_policy_in_training_mode():
    from seal_mini.core.judge import tiny_random_judge

    judge = tiny_random_judge(seed=2)
    before = judge.scores("a prompt", ["the first", "the second"])
    judge.model.gradient_checkpointing_enable()
    judge.model.train()  # a policy mid-training: checkpointing would refuse the KV cache in train mode
    assert judge.scores("a prompt", ["the first", "the second"]) == pytest.approx(before, abs=1e-5)
    assert judge.model.training


def test_judge_picks_the_argmax_of_a_closed_set(monkeypatch):
    from seal_mini.core.judge import tiny_random_judge

    judge = tiny_random_judge(seed=1)
    candidates = {"a": "the first", "b": "the second", "c": "the third"}
    label, scores = judge.pick("prompt", candidates)
    assert label in candidates and set(scores) == set(candidates)
    assert scores[label] == max(scores.values())
    monkeypatch.setattr(judge, "scores", lambda prompt, descriptions: [0.1, -2.0, 0.5])
    assert judge.pick("prompt", candidates)[0] == "c"


def test_judge_runs_only_on_ambiguous_turns():
    from seal_mini.core.judge import FINER_LABELS, tiny_random_judge

    judge = tiny_random_judge(seed=0)
    clean = run("multi_turn_base_0", {})
    assert [d.detail for d in diagnose_turns(clean, judge=judge)] == ["", "", "", ""]
    assert judge.turns_judged == 0
    wrong = ["\n".join([TURN0[0], call("mkdir", dir_name="tmp"), TURN0[2]]), DONE_TEXT]
    diagnoses = diagnose_turns(run("multi_turn_base_0", {0: wrong}), judge=judge)
    assert diagnoses[0].label == "state_mismatch"  # the judge never changes a rule label
    assert diagnoses[0].detail in FINER_LABELS["state_mismatch"]
    assert judge.turns_judged == sum(d.label == "state_mismatch" for d in diagnoses)


def test_judge_from_config():
    from seal_mini.core.judge import LabelJudge, judge_from_config

    assert judge_from_config(DiagnosisConfig()) is None  # off by default
    with pytest.raises(ConfigError, match="small_model"):
        judge_from_config(DiagnosisConfig(small_model=True))
    with pytest.raises(ConfigError, match="small_model_name"):
        judge_from_config(DiagnosisConfig(small_model=True, small_model_name="/no/such/model"))

    class Policy:  # a peft model exposes disable_adapter() as a context manager
        def disable_adapter(self):
            raise AssertionError("only called when scoring")

    judge = judge_from_config(DiagnosisConfig(small_model=True), policy=Policy(), tokenizer=object())
    assert isinstance(judge, LabelJudge) and judge.adapter_off == judge.model.disable_adapter


def test_diagnose_check_command_runs_and_ends_with_json(capsys):
    assert diagnose_check.main(["--limit", "1", "--categories", "base", "miss_func"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert "diagnose-check: 100%" in err and "2/2" in err  # a bar over the tasks while it works
    assert result["clean"]["all_pass_or_abstention"]
    assert set(result["faults"]) == set(faults.FAULTS)
    assert result["cut_short"]["cut_turn_pass"] == 0 and result["crash_count"] == 0
    assert result["official_verdict"]["failed_without_a_failing_turn"] == 0
    assert result["timing"]["execute_s"] > 0 and result["timing"]["rules_s"] > 0
