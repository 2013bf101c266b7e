import copy
import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from seal_mini.core.diagnose import DIAGNOSIS_RAISED, diagnose
from seal_mini.envs.bfcl import NEW_TOOLS_USER_TEXT, tasks_by_id
from seal_mini.envs.episode import (
    EPISODE_LIMIT,
    NO_CALL,
    NOT_REACHED,
    TRUNCATED,
    TURN_LIMIT,
    Episode,
    new_instances,
    public_methods,
    state_of,
)
from seal_mini.envs.harness import CHECKER_MODEL, INSTANCE_PREFIX, REFUSED_CALL, checker_input_for, instance_name
from seal_mini.envs.scripted import ground_truth_turns, replay, scripted_messages
from seal_mini.envs.toolcalls import MAX_CALL_CHARS, format_call
from seal_mini.envs.verifier import CHECKER_RAISED, check, check_episode

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

TASKS = tasks_by_id()


def call(tool, **arguments):
    return format_call(tool, arguments)


def test_reset_gives_first_turn_and_tools():
    task = TASKS["multi_turn_base_0"]
    messages, tools = Episode(task).reset()
    assert messages == task.turns[0]
    assert tools == task.tools and tools is not task.tools  # the task's BFCL docs, as BFCL's entry has them


def test_calls_execute_record_canonically_and_turns_advance():
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    r = ep.step(call("cd", folder="document") + "\n" + call("mkdir", dir_name="temp"))
    assert not r.turn_done and [m["role"] for m in r.observation] == ["tool", "tool"]
    assert json.loads(r.observation[0]["content"]) == {"current_working_directory": "document"}
    r = ep.step("I created it.")
    assert r.turn_done and not r.done and r.observation == task.turns[1]
    assert ep.checker_input()[0] == [["cd(folder='document')", "mkdir(dir_name='temp')"]]
    records = ep.turn_records()
    assert records[0].ended_by == NO_CALL and records[0].final_text == "I created it."
    assert [t.ended_by for t in records[1:]] == [NOT_REACHED] * (len(task.turns) - 1)


def test_miss_func_reveals_held_out_tools_by_message():
    task = TASKS["multi_turn_miss_func_0"]
    (reveal_turn,) = task.held_out
    ep = Episode(task)
    ep.reset()
    hidden = task.held_out[reveal_turn][0]["name"]
    assert hidden not in ep.offered
    for _ in range(reveal_turn - 1):
        ep.step("ok")
    r = ep.step("ok")
    (message,) = r.observation
    # BFCL's prompting path: the new tools' docs as Python writes the list, then its sentence
    assert message["role"] == "user" and message["content"] == f"{task.held_out[reveal_turn]}\n{NEW_TOOLS_USER_TEXT}"
    assert hidden in ep.offered


def test_tool_used_before_its_reveal_executes_but_is_flagged():
    task = TASKS["multi_turn_miss_func_0"]
    ep = Episode(task)
    ep.reset()
    hidden = task.held_out[3][0]["name"]  # sort
    r = ep.step(call(hidden, file_name="nothing.txt"))
    assert r.events[0].violation == "not_offered" and r.events[0].call is not None


def test_turn_limit_is_bfcl_force_quit():
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task, max_calls_per_turn=3)
    ep.reset()
    for _ in range(3):
        assert not ep.step(call("pwd")).done
    r = ep.step(call("pwd"))
    assert r.done and ep.ended_by == TURN_LIMIT
    assert check(task, ep.checker_input(), forced_quit=True).reward == 0.0
    assert check_episode(ep).error_type == "multi_turn:force_terminated"


def test_force_quit_in_the_last_turn_is_scored_as_usual():
    # eval_runner fails an entry as force_terminated only when it has fewer turns than the ground truth
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    gt = ground_truth_turns(task)
    for turn in gt[:-1]:
        for text in scripted_messages(turn):
            ep.step(text)
    ep.step(scripted_messages(gt[-1])[0])
    for i in range(20):  # 21 tool-calling messages in the last turn: BFCL's force quit
        r = ep.step(call("no_such_tool", attempt=i))
    assert r.done and ep.ended_by == TURN_LIMIT
    assert check_episode(ep).reward == 1.0


def test_every_decoded_call_runs_and_is_scored_as_bfcl_runs_it():
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    r = ep.step(
        "\n".join(
            [
                call("cd", folder="document"),
                call("no_such_tool", x=1),  # BFCL's eval: the name is not defined
                call("mkdir"),  # missing argument: Python's TypeError, as in BFCL
                call("cd", folder="document", path="/etc"),  # unknown argument: the same
                call("print", text="hi"),  # a Python builtin: BFCL would call it; the kit refuses
            ]
        )
    )
    kinds = [(e.error_kind, e.violation) for e in r.events]
    assert kinds == [
        (None, ""),
        ("unknown_tool", "unknown_tool"),
        ("arguments", "missing_required"),
        ("arguments", "unknown_argument"),
        ("unknown_tool", "unknown_tool"),
    ]
    assert r.observation[1]["content"] == "Error during execution: name 'no_such_tool' is not defined"
    assert "missing 1 required positional argument: 'dir_name'" in r.observation[2]["content"]
    assert "not a tool of this task" in r.observation[4]["content"]
    # the checker gets the calls that ran as BFCL writes them, and a stand-in for the unknown name (which
    # the checker could find defined) and the builtin: both fail there harmlessly, as they did here
    assert ep.checker_input()[0] == [
        ["cd(folder='document')", REFUSED_CALL, "mkdir()", "cd(folder='document',path='/etc')", REFUSED_CALL]
    ]
    assert "replaced_calls" not in check(task, ep.checker_input()).details  # recorded in the checker's form


def test_a_message_bfcl_cannot_decode_ends_the_turn():
    task = TASKS["multi_turn_base_0"]
    one_line = '<tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>'
    for text in [one_line, '<tool_call>\n{"name": "cd"}\n</tool_call>', '<tool_call>\n["cd"]\n</tool_call>']:
        ep = Episode(task)
        ep.reset()
        r = ep.step(text)
        assert r.turn_done and r.observation == task.turns[1] and ep.checker_input()[0] == []
        assert [e.error_kind for e in ep.turns[0].events] == ["parse"] and ep.turns[0].final_text == text
    # an unreadable block next to a readable one: BFCL runs the readable one and drops the other silently
    ep = Episode(task)
    ep.reset()
    r = ep.step(one_line + "\n" + call("pwd"))
    assert not r.turn_done and len(r.observation) == 1 and ep.checker_input()[0] == [["pwd()"]]
    # a <think> block is not part of the message BFCL decodes
    ep = Episode(task)
    ep.reset()
    r = ep.step("<think>\n" + call("pwd") + "\n</think>\n\nAll done.")
    assert r.turn_done and ep.turns[0].final_text == "All done." and ep.checker_input()[0] == []


def test_a_call_on_a_turn_that_needs_none_is_not_failed():
    # BFCL's eval_runner never runs its irrelevance checker on multi-turn entries
    task = TASKS["multi_turn_miss_param_0"]
    gt = ground_truth_turns(task)
    (empty,) = [k for k, calls in enumerate(gt) if not calls]
    episode, _ = replay(task, [calls if k != empty else [("pwd", {})] for k, calls in enumerate(gt)])
    assert check_episode(episode).reward == 1.0


def test_the_verifier_gives_the_checker_no_call_but_a_tool_call_with_literal_values():
    task = TASKS["multi_turn_base_0"]
    rest = [[] for _ in task.turns[1:]]
    unsafe = ["print(1)", "__import__('os').getcwd()", "cd(folder=__import__('os').sep)", "cd('document')"]
    for call in unsafe + ["cd(folder=inf)", "undefined_tool()", "cd(folder='a'", "os.kill(pid=1)"]:
        verdict = check(task, [[[call]]] + rest)
        assert verdict.reward == 0.0 and verdict.details["replaced_calls"] == 1, call
    vetted, replaced = checker_input_for(task, [[["cd(folder='document')", "kill(x=1)", "a.b()"]]], CHECKER_MODEL)
    assert vetted == [[["cd(folder='document')", "kill()", REFUSED_CALL]]] and replaced == 2


# --- the checker's own instances, addressed from model text ----------------------------------------------


def checker_instance(task, class_name, side="_ground_truth"):
    """The global name of one of the checker's instances of a task (side "" is its model-side one)."""
    return instance_name(f"{CHECKER_MODEL}{side}_eval", task.id, class_name)


def forged_turns(task):
    """A do-nothing episode that empties the checker's ground-truth instances in its first message, then
    forges the outputs the ground truth gives on emptied instances ("'C' object has no attribute 'x'") by
    reading that attribute of them. Against a checker that evals such names it passed 35 of the first 40
    base tasks (an honest do-nothing episode: 0)."""
    emptied = new_instances(task)
    for instance in emptied.values():
        vars(instance).clear()
    methods = public_methods(emptied)
    turns = []
    for k, calls in enumerate(ground_truth_turns(task)):
        forged = [(checker_instance(task, c) + ".__dict__.clear", {}) for c in task.involved_classes] if k == 0 else []
        for name, arguments in calls:
            try:
                methods[name](**copy.deepcopy(arguments))
            except AttributeError as e:
                m = re.fullmatch(r"'(\w+)' object has no attribute '(\w+)'", str(e))
                if m:
                    forged.append((f"{checker_instance(task, m.group(1))}.{m.group(2)}", {}))
            except Exception:  # noqa: BLE001 - an output this forge cannot copy
                pass
        turns.append(forged)
    return turns


def test_a_forged_episode_naming_the_checkers_instances_scores_nothing_on_any_base_task():
    base = [t for t in TASKS.values() if t.category == "base"]
    assert len(base) == 200
    forged = 0
    for task in base:
        turns = forged_turns(task)
        episode, reward = replay(task, turns)
        assert reward == 0.0, task.id
        # the same strings given to the checker directly, as if an input came from elsewhere
        raw = [[[name + "()" for name, _ in calls]] if calls else [] for calls in turns]
        verdict = check(task, raw)
        assert verdict.reward == 0.0 and verdict.details.get("replaced_calls", 0) > 0, task.id
        forged += sum(len(calls) > len(task.involved_classes) for calls in turns[:1])
    assert forged > 100  # most tasks' forges copy outputs, so the 0.0s are not for want of trying


def test_model_text_writes_no_builtin_or_module_global_through_the_checkers_instances():
    import builtins
    import importlib

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    for task in (TASKS["multi_turn_base_1"], TASKS["multi_turn_long_context_3"]):
        for c in task.involved_classes:
            module = importlib.import_module(CLASS_FILE_PATH_MAPPING[c])
            writes = [
                (f"{checker_instance(task, c)}.__init__.__builtins__.update", {"seal_mini_forged": 1}),
                (f"{checker_instance(task, c)}._load_scenario.__globals__.update", {"seal_mini_forged": 1}),
                (f"{checker_instance(task, c, '')}.__init__.__globals__.update", {"seal_mini_forged": 1}),
                (f"{INSTANCE_PREFIX}_{task.id}_{c}_instance.__init__.__builtins__.update", {"seal_mini_forged": 1}),
            ]
            episode, _ = replay(task, [writes] + [[] for _ in task.turns[1:]])
            diagnose(episode, check_episode(episode))
            check(task, [[[f"{name}(seal_mini_forged=1)" for name, _ in writes]]] + [[] for _ in task.turns[1:]])
            assert not hasattr(builtins, "seal_mini_forged") and "seal_mini_forged" not in vars(module)
            assert episode.turns[0].steps == [[REFUSED_CALL] * len(writes)]


def test_a_call_naming_the_checkers_model_side_instance_gets_a_verdict():
    task = TASKS["multi_turn_base_1"]
    name = checker_instance(task, task.involved_classes[0], "") + "._load_scenario"
    episode, reward = replay(task, [[(name, {})]] + [[] for _ in task.turns[1:]])
    assert reward == 0.0 and len(diagnose(episode, check_episode(episode))) == len(task.turns)


def test_a_checker_or_diagnoser_that_raises_anyway_gives_a_verdict_and_labels(monkeypatch):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker

    from seal_mini.core import diagnose as diagnose_module

    task = TASKS["multi_turn_base_1"]
    episode, _ = replay(task, ground_truth_turns(task))

    def broken(*args, **kwargs):
        raise KeyError("a back end's bug")

    monkeypatch.setattr(multi_turn_checker, "multi_turn_checker", broken)
    monkeypatch.setattr(diagnose_module, "_walk", broken)
    verdict = check_episode(episode)
    assert (
        verdict.reward == 0.0
        and verdict.error_type == CHECKER_RAISED
        and "KeyError" in verdict.details["error_message"]
    )
    labels = diagnose_module.diagnose_turns(episode, verdict)
    assert [d.label for d in labels] == ["not_reached"] * len(task.turns)
    assert all(d.reason.startswith(DIAGNOSIS_RAISED) for d in labels)


def test_episode_limit_and_truncate():
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task, max_calls_per_episode=2)
    ep.reset()
    ep.step(call("pwd"))
    assert ep.step(call("pwd")).done and ep.ended_by == EPISODE_LIMIT
    ep = Episode(task)
    ep.reset()
    ep.step(call("pwd"))
    ep.truncate()
    assert ep.done and ep.ended_by == TRUNCATED and ep.turn_records()[0].ended_by == TRUNCATED
    assert len(ep.checker_input()) == len(task.turns)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        ep.step("more")


def test_same_task_twice_sees_identical_initial_state():
    for task_id in ["multi_turn_base_3", "multi_turn_long_context_5", "multi_turn_miss_param_150"]:
        task = TASKS[task_id]
        first, _ = replay(task, ground_truth_turns(task))
        second = Episode(task)
        second.reset()
        third = Episode(task)
        third.reset()
        assert state_of(second.instances) == state_of(third.instances)
        assert first.instances is not second.instances


def test_verifier_rewards_ground_truth_and_rejects_wrong_state():
    task = TASKS["multi_turn_base_1"]
    episode, reward = replay(task, ground_truth_turns(task))
    assert reward == 1.0
    wrong = ground_truth_turns(task)
    wrong[1] = [("cd", {"folder": "workspace"})]  # skips the mv of turn 1
    episode, reward = replay(task, wrong)
    verdict = check(task, episode.checker_input())
    assert reward == 0.0 and verdict.failed_turn == 1 and verdict.error_type


# --- hostile and broken model output -------------------------------------------------------------

NESTED = '{"name": "cd", "arguments": {"folder": ' + "[" * 5000 + "]" * 5000 + "}}"
HOSTILE = [
    ("python expression", "<tool_call>__import__('os').system('touch PWNED')</tool_call>"),
    ("import as a name", call("__import__", name="os")),
    ("eval as a name", call("eval", source="__import__('os').system('touch PWNED')")),
    ("exec as a name", call("exec", source="print(1)")),
    ("private method", call("_load_scenario", scenario={})),
    ("dunder init", call("__init__")),
    ("dunder class", call("__class__")),
    ("dunder dict", call("__dict__")),
    ("attribute path", call("GorillaFileSystem.cd", folder="document")),
    ("globals path", call("cd.__globals__")),
    ("os attribute", call("os.system", command="touch PWNED")),
    ("tool of another back end", call("book_flight", access_token="x")),
    ("call syntax in name", call("cd()")),
    ("zero-width name", call("cd\u200b", folder="document")),
    ("not json", "<tool_call>cd(folder='document')</tool_call>"),
    ("truncated json", '<tool_call>{"name": "cd", "arguments": {"folder": "doc</tool_call>'),
    ("unclosed tag", '<tool_call>{"name": "cd", "arguments": {"folder": "document"}}'),
    ("empty block", "<tool_call>  </tool_call>"),
    ("deeply nested json", f"<tool_call>{NESTED}</tool_call>"),
    ("huge call", call("cd", folder="a" * (MAX_CALL_CHARS + 10))),
    ("huge string argument", call("echo", content="a" * 15_000, file_name="x.txt")),
    ("huge integer", call("tail", file_name="final_report.pdf", lines=10**40)),
    ("wrong type", call("cd", folder=123)),
    ("wrong type list", call("cd", folder=["a", "b"])),
    ("missing required", call("mv", source="final_report.pdf")),
    ("unknown argument", call("cd", folder="document", path="/etc")),
    ("duplicate keys", '<tool_call>{"name": "cd", "name": "rm", "arguments": {"file_name": "x"}}</tool_call>'),
    ("NaN", '<tool_call>{"name": "cd", "arguments": {"folder": NaN}}</tool_call>'),
    ("Infinity", '<tool_call>{"name": "tail", "arguments": {"file_name": "a", "lines": Infinity}}</tool_call>'),
    ("arguments is a list", '<tool_call>{"name": "cd", "arguments": ["document"]}</tool_call>'),
    ("arguments not json", '<tool_call>{"name": "cd", "arguments": "folder=document"}</tool_call>'),
    ("name is a number", '<tool_call>{"name": 5, "arguments": {}}</tool_call>'),
    ("extra keys", '<tool_call>{"name": "pwd", "arguments": {}, "__class__": "x"}</tool_call>'),
    ("top-level array", '<tool_call>[{"name": "pwd", "arguments": {}}]</tool_call>'),
    ("nested tags", "<tool_call><tool_call>" + '{"name": "pwd", "arguments": {}}' + "</tool_call></tool_call>"),
    ("too many calls", "".join(call("pwd") for _ in range(100))),
    ("path traversal value", call("cd", folder="../../../../../etc")),
    ("non-utf8 bytes", b'<tool_call>{"name": "cd", "arguments": {"folder": "\xff\xfe"}}</tool_call>'),
    ("quote injection value", call("echo", content="'); __import__('os').system('touch PWNED'); ('", file_name="x")),
    # against BFCL's executor, which eval()s "name(key=repr(value),...)" strings built from the JSON:
    ("code in an argument key", call("cd", **{"folder=__import__('os').system('touch PWNED'), x": 1})),
    ("code in a key that breaks the call", call("cd", **{"x) or __import__('os').system('touch PWNED') or (y": 1})),
    ("code as the name", call("__import__('os').system", command="touch PWNED")),
    (
        "executor's own eval as a tool",
        call("execute_multi_turn_func_call", func_call_list=["exit()"], initial_config={}),
    ),
    (
        "instance global name",
        call(f"{INSTANCE_PREFIX}_multi_turn_base_0_GorillaFileSystem_instance._load_scenario", scenario={}),
    ),
    ("attribute of a tool", call("cd.__self__._load_scenario", scenario={})),
    ("builtin that writes a file", call("open", file="PWNED", mode="w")),
    ("name BFCL blocks", call("exit", code=1)),
    ("method name inside a string", call("echo", content="ls() then rm(file_name='x')", file_name="x")),
]


@pytest.fixture
def no_escape(monkeypatch, tmp_path):
    """Fail the test if anything tries to spawn a process; run in an empty folder to spot new files."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"process spawn attempted: {args}")

    monkeypatch.setattr(os, "system", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("label, text", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_call_is_contained(label, text, no_escape):
    assert len(HOSTILE) >= 40
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    offered = set(ep.offered)
    executed = []
    for instance in ep.scope.values():  # record every back-end method that runs
        for name in list(ep.methods):
            if hasattr(instance, name):
                method = getattr(instance, name)
                setattr(instance, name, lambda *a, _n=name, _m=method, **k: (executed.append(_n), _m(*a, **k))[1])
    before = state_of(ep.instances)

    r = ep.step(text)

    assert set(executed) <= offered  # only offered public tool methods ever run
    assert r.observation, "every input gets an observation (a result, or the next user turn)"
    for event in r.events:
        if event.call is None:  # a block BFCL's decoder could not read: nothing ran
            assert event.error_kind == "parse" and event.error
        else:  # decoded: it has BFCL's execution result, and a refused call reaches the checker as a stand-in
            assert event.output is not None
            assert event.call == REFUSED_CALL or event.name in offered or event.error_kind is not None
    if not executed:
        assert state_of(ep.instances) == before
    # whatever was recorded goes through the official checker (which eval()s the strings) safely
    check(task, ep.checker_input())


def test_calls_that_could_hang_the_process_are_refused(no_escape):
    task = next(t for t in TASKS.values() if "MathAPI" in t.involved_classes)
    ep = Episode(task)
    ep.reset()
    r = ep.step(
        "\n".join(
            [
                call("power", base=10, exponent=10**15),  # a quadrillion-digit integer
                call("logarithm", value=10, base=2, precision=10**9),
                call("logarithm", value=10, base=2, precision=40_000.0),  # mpmath takes a float precision
                call("logarithm", value=10, base=2, precision="40000"),  # ... and a digit string
                call("logarithm", value="1e" + "9" * 3000, base=3, precision=15),  # an exponent of 3000 digits
                call("power", base=2, exponent=10),  # small ones run as usual
            ]
        )
    )
    assert [e.call for e in r.events][:5] == [REFUSED_CALL] * 5
    assert json.loads(r.observation[5]["content"]) == {"result": 1024}


def mkdir_cd(levels: int) -> str:
    return "\n".join(call("mkdir", dir_name="a") + "\n" + call("cd", folder="a") for _ in range(levels))


def shared_directories(rounds: int) -> str:
    """BFCL's mv moves a contents dict and cp copies one level down, so each round's six calls leave one
    directory object under two names: the tree == and repr walk doubles every round."""
    calls = [call("mkdir", dir_name="t")]
    for _ in range(rounds):
        calls += [call("mkdir", dir_name="n"), call("mv", source="t", destination="n"), call("cd", folder="n")]
        calls += [
            call("cp", source="t", destination="u"),
            call("cd", folder=".."),
            call("mv", source="n", destination="t"),
        ]
    return "\n".join(calls)


@pytest.mark.parametrize("message", [mkdir_cd(200), shared_directories(40)], ids=["200_deep", "shared_2_to_40"])
def test_a_tree_the_models_calls_nest_deep_or_share_is_scored_and_diagnosed(message):
    """About 200 nested directories were deeper than a state snapshot could copy (the step raised, and so did
    the rollout's truncation after it); a directory shared down 40 levels unfolds to 2**40 objects, which the
    checker's report and the diagnoser's comparisons walked. Both now end in a failed verdict and labels."""
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    ep.step(message)
    while not ep.done:
        ep.step("Done.")
    verdict = check_episode(ep)
    assert verdict.reward == 0.0 and len(diagnose(ep, verdict)) == len(task.turns)
    cut = Episode(task)
    cut.reset()
    cut.step(message)
    cut.truncate()  # what the rollout does when a step raises: it must not raise in turn
    assert cut.done and cut.ended_by == TRUNCATED


def test_missing_tags_is_a_plain_answer_ending_the_turn():
    ep = Episode(TASKS["multi_turn_base_0"])
    ep.reset()
    r = ep.step('{"name": "cd", "arguments": {"folder": "document"}}')
    assert r.turn_done and r.events == [] and ep.checker_input()[0] == []


def test_quote_injection_round_trips_as_a_literal(no_escape):
    value = "'); __import__('os').system('touch PWNED'); ('"
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    r = ep.step(call("touch", file_name="notes.txt") + call("echo", content=value, file_name="notes.txt"))
    r = ep.step(call("cat", file_name="notes.txt"))
    assert json.loads(r.observation[0]["content"]) == {"file_content": value}
    check(task, ep.checker_input())


def test_back_ends_get_copies_of_the_arguments():
    task = TASKS["multi_turn_base_0"]
    ep = Episode(task)
    ep.reset()
    password = task.initial_config["TwitterAPI"]["password"]
    ep.step(call("authenticate_twitter", username="analyst_pro", password=password))
    r = ep.step(call("post_tweet", content="hello", tags=["#a"], mentions=["@b"]))
    assert json.loads(r.observation[0]["content"])["id"] == 3
    ep.step(call("mention", tweet_id=3, mentioned_usernames=["@c"]))  # the back end extends the tweet's list
    assert r.events[0].arguments == {"content": "hello", "tags": ["#a"], "mentions": ["@b"]}


# --- a verdict is a function of the episode alone ------------------------------------------------------

PLAY = """
import json, sys
from seal_mini.core.diagnose import diagnose
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import play
from seal_mini.envs.verifier import check_episode

def run(task_id, turns):
    episode = Episode(tasks_by_id()[task_id])
    play(episode, [[tuple(c) for c in calls] for calls in turns])
    verdict = check_episode(episode)
    return [verdict.reward, verdict.error_type, diagnose(episode, verdict)]

print(json.dumps([run(task_id, turns) for task_id, turns in json.loads(sys.argv[1])]))
"""


def fresh_process(*episodes) -> list:
    """[reward, error type, labels] of each (task id, calls per turn), played in order in a new process."""
    out = subprocess.run([sys.executable, "-c", PLAY, json.dumps(episodes)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def flipping_episode() -> list:
    """multi_turn_base_150's ground truth with a travel date that mentions a method: BFCL's executor writes
    the instance's global name into the string, and get_flight_cost prices by the digits of the date."""
    turns = ground_truth_turns(TASKS["multi_turn_base_150"])
    name, args = turns[0][0]
    assert name == "get_flight_cost"
    turns[0][0] = (name, {**args, "travel_date": args["travel_date"] + " see get_flight_cost(x)"})
    return turns


def test_one_episode_checked_many_times_in_one_process_and_in_two_gets_one_verdict():
    task = TASKS["multi_turn_base_150"]
    episode, _ = replay(task, flipping_episode())
    verdicts = {(v.reward, v.error_type) for v in (check_episode(episode) for _ in range(50))}
    assert len(verdicts) == 1, verdicts  # under a random model name 12 checks gave 7 False, 5 True
    ((reward, error_type),) = verdicts
    for _ in range(2):
        assert fresh_process(("multi_turn_base_150", flipping_episode()))[0][:2] == [reward, error_type]


def test_an_episode_its_check_and_its_diagnosis_do_not_depend_on_the_episodes_before_it():
    # TwitterAPI.post_tweet(tags=[], mentions=[]): a tweet posted without mentions keeps the default list,
    # and mention() extends it, so in a process that shares it every later tweet without mentions has them
    task = TASKS["multi_turn_base_5"]
    password = task.initial_config["TwitterAPI"]["password"]
    username = task.initial_config["TwitterAPI"]["username"]
    sequence = [
        [
            ("authenticate_twitter", {"username": username, "password": password}),
            ("post_tweet", {"content": "no mentions"}),
            ("mention", {"tweet_id": 0, "mentioned_usernames": ["@someone"]}),
        ]
    ] + [[] for _ in task.turns[1:]]
    turns = ground_truth_turns(task)
    for k, calls in enumerate(turns):
        turns[k] = [(n, {**a, "mentions": []}) if n == "post_tweet" else (n, a) for n, a in calls]
    alone = fresh_process(("multi_turn_base_5", turns))[0]
    assert alone[0] == 1.0
    after = fresh_process(("multi_turn_base_5", sequence), ("multi_turn_base_5", turns), ("multi_turn_base_5", turns))
    assert after[1] == after[2] == alone  # played, checked and diagnosed after the sequence: the same


def test_what_bfcls_own_code_did_to_defaults_and_module_data_before_the_kit_looked_reaches_no_episode():
    """BFCL's own TwitterAPI and TravelAPI, run in this process before the kit first looks (the differential's
    reference does), grow post_tweet's default list and drain long_context.py's cards; an episode starts
    from the values the source writes all the same."""
    import importlib

    from seal_mini.envs import harness

    twitter, travel = harness.bfcl_class("TwitterAPI"), harness.bfcl_class("TravelAPI")
    module = importlib.import_module(travel.__module__)
    card = module.CREDIT_CARD_EXTENSION["1234567812345678"]
    defaults, balance = copy.deepcopy(twitter.post_tweet.__defaults__), card["balance"]
    try:
        twitter.post_tweet.__defaults__[1].append("@grown")
        card["balance"] = 0.0
        harness.first_defaults.cache_clear()
        harness._fresh_plan.cache_clear()
        api = harness.fresh_class("TwitterAPI")()
        api._load_scenario({"username": "a", "password": "b", "authenticated": True})
        assert api.post_tweet(content="x")["mentions"] == []
        booking = harness.fresh_class("TravelAPI")()
        booking._load_scenario({}, long_context=True)
        assert booking.credit_card_list["1234567812345678"]["balance"] == 5000.0
        assert booking.credit_card_list["1234567812345678"] is not card  # a copy, not long_context.py's dict
    finally:
        twitter.post_tweet.__defaults__ = defaults
        card["balance"] = balance
        harness.first_defaults.cache_clear()
        harness._fresh_plan.cache_clear()


WORLD = """
CATALOG = {"bread": {"stock": 3}}
CATALOG["milk"] = {"stock": 5}  # built on at the top level: taken as first seen, not from the source
COUNTS = {"sold": 0}


def _stock(item):
    return _entry(item)["stock"]


def _entry(item):  # reached through _stock: reads the data
    return CATALOG[item]


class Shop:
    def sell(self, item):
        CATALOG[item]["stock"] -= 1
        return _stock(item)

    @staticmethod
    def price(item):
        return 2 * _stock(item)

    @classmethod
    def count(cls):
        COUNTS["sold"] += 1
        return COUNTS["sold"]
"""


def test_a_fresh_subclass_copies_module_data_for_plain_static_and_class_methods_and_their_helpers(tmp_path):
    import importlib.util

    from seal_mini.envs.harness import fresh_subclass

    (tmp_path / "shop_world.py").write_text(WORLD)
    spec = importlib.util.spec_from_file_location("shop_world", tmp_path / "shop_world.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["shop_world"] = module
    try:
        spec.loader.exec_module(module)
        a, b = fresh_subclass(module.Shop), fresh_subclass(module.Shop)
        assert a().sell("bread") == 2 and a().sell("bread") == 1 and a.price("bread") == 2  # one copy per class
        assert b().sell("bread") == 2 and b.price("milk") == 10  # another copy; milk as the module built it
        assert a.count() == 1 and a.count() == 2 and b.count() == 1  # a class method's data is copied too
        assert module.CATALOG["bread"]["stock"] == 3 and module.COUNTS["sold"] == 0  # the module untouched
        shop = a()
        assert type(copy.deepcopy(shop)) is a and type(pickle.loads(pickle.dumps(shop))) is a
    finally:
        del sys.modules["shop_world"]
