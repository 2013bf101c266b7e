"""Practice tasks: real BFCL back ends, the official checker, BFCL's phenomena, seeded and separate sets."""

import json

import pytest

from seal_mini.checks.oracle import practice_tasks, run_oracle
from seal_mini.config import CATEGORIES, ConfigError, load_config
from seal_mini.core.diagnose import diagnose
from seal_mini.core.faults import plan
from seal_mini.core.interface import Interface, InterfaceState
from seal_mini.envs import practice
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import POLICIES, ground_truth_turns, play, replay
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.verifier import check_episode

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`


@pytest.fixture(scope="module")
def tasks():
    return practice_tasks(seed=0)


def test_oracle_on_the_practice_sets(tasks):
    """Ground truth passes every task, the empty and drop-last-call policies none (official checker)."""
    assert len(tasks) == 600  # 400 training + 200 held-in at the default sizes
    result = run_oracle(tasks=tasks)
    for category in CATEGORIES:
        assert result["ground_truth"][category] == {"passed": 150, "total": 150}
        assert result["empty"][category]["passed"] == 0
        assert result["drop_last_call"][category]["passed"] == 0


def test_ground_truth_calls_never_fail_and_diagnose_as_pass(tasks):
    for task in tasks:
        episode, reward = replay(task, ground_truth_turns(task))
        assert reward == 1.0
        errors = [e for turn in episode.turns for e in turn.events if e.error_kind]
        assert not errors, (task.id, errors[:1])
        expected = ["pass" if calls else "correct_abstention" for calls in task.ground_truth]
        assert diagnose(episode) == expected, task.id


def test_the_interface_changes_nothing_the_checker_sees(tasks):
    """Every cue on: the ground truth still passes and the empty policy still fails."""
    state = InterfaceState(schema_cues=True, error_feedback=True, guidelines=["cautious_call", "state_aware"])
    for task in tasks[::7]:
        for policy, want in (("ground_truth", 1.0), ("empty", 0.0)):
            env = Interface(Episode(task), state)
            play(env, POLICIES[policy](task))
            assert check_episode(env).reward == want, (task.id, policy)


def test_the_phenomena_of_each_category(tasks):
    for task in tasks:
        assert 2 <= len(task.turns) <= 4, task.id
        assert 1 <= len(task.tools) <= 5, task.id  # the tools its requests use (and one more if only one)
        empty_turns = [k for k, calls in enumerate(task.ground_truth) if not calls]
        if task.category == "miss_param":  # one turn leaves a value out: no call; the next gives it
            assert len(empty_turns) == 1 and task.ground_truth[empty_turns[0] + 1], task.id
            assert not task.held_out
        elif task.category == "miss_func":  # no call; the next turn reveals the tool (no user text) and uses it
            (k,) = empty_turns
            (revealed,) = task.held_out[k + 1]
            assert task.turns[k + 1] == []
            assert any(c.startswith(revealed["name"] + "(") for c in task.ground_truth[k + 1])
            assert revealed["name"] not in {d["name"] for d in task.tools}
            assert not any(c.startswith(revealed["name"] + "(") for calls in task.ground_truth[: k + 1] for c in calls)
            # the withheld tool changes the state: BFCL never checks a turn that needs no call, so a read-only one
            # called before its reveal always passes, a success the diagnoser names spurious_tool_call
            assert plan(task)[k + 1][-1].changes_state, task.id
        else:
            assert not empty_turns and not task.held_out, task.id


def test_long_context_is_a_larger_state_without_bfcl_filler(tasks):
    """The checker switches BFCL's long filler on from the id; practice ids never ask for it, and the
    episode's back ends agree (task.long_context is off)."""

    def state_size(task):
        return len(json.dumps(task.initial_config))

    for task in tasks:
        assert "long_context" not in task.id.rsplit("_", 1)[0]
        assert task.long_context is False
    large = [state_size(t) for t in tasks if t.category == "long_context"]
    base = [state_size(t) for t in tasks if t.category == "base" and t.involved_classes != ["MathAPI"]]
    assert sum(large) / len(large) > 1.5 * sum(base) / len(base)  # larger, yet short enough for a small model


def test_tasks_use_several_back_ends_and_compact_docs(tasks):
    classes = {c for t in tasks for c in t.involved_classes}
    assert classes == {"GorillaFileSystem", "MathAPI", "MessageAPI", "TicketAPI", "TradingBot", "VehicleControlAPI"}
    for task in tasks[:50]:
        for doc in task.tools:
            assert "Tool description" not in doc["description"] and len(doc["description"]) < 120


def test_a_task_is_a_function_of_its_id():
    a = practice.task("practice_0_heldin_miss_func_3")
    practice.task.cache_clear()
    b = practice.task("practice_0_heldin_miss_func_3")
    assert a is not b and a == b
    assert practice.task("practice_1_heldin_miss_func_3") != a  # another seed, another task
    with pytest.raises(ConfigError, match="not a practice task id"):
        practice.task("practice_0_test_base_1")


def test_split_is_seeded_separate_and_leak_free():
    cfg = load_config(None, ["data.source=practice", "data.heldin_per_category=40"])
    split = load_split(cfg)
    assert len(split["train"]) == 400 and len(split["eval"]) == 160
    assert not set(split["train"]) & set(split["eval"])
    train_signatures = {practice.signature(t) for t in pick(split["train"], 0)}
    assert not any(practice.signature(t) in train_signatures for t in pick(split["eval"], 0))
    assert load_split(cfg) == split
    other = load_split(load_config(None, ["data.source=practice", "data.split_seed=1"]))
    assert not set(other["train"]) & set(split["train"])
    limited = pick(split["eval"], 8)  # the cap spreads over the categories
    assert [t.category for t in limited] == list(CATEGORIES) * 2


def test_practice_source_rejects_a_split_file(tmp_path):
    cfg = load_config(None, ["data.source=practice", f"data.split_file={tmp_path / 'x.json'}"])
    with pytest.raises(ConfigError, match="split_file applies to data.source=bfcl"):
        load_split(cfg)
    with pytest.raises(ConfigError, match="data.source: must be bfcl, practice or tasks"):
        load_config(None, ["data.source=toy"])


def test_a_narrower_world_picks_tasks_without_changing_them(tmp_path):
    """data.practice_backends keeps the tasks of a stream that use only the named back ends, under their ids."""
    from seal_mini.envs.splits import load_split

    every = load_config(None, ["data.source=practice", f"out_dir={tmp_path}"])
    cfg = load_config(None, ["data.source=practice", "data.practice_backends=[MathAPI, TradingBot]"])
    split, full = load_split(cfg), load_split(every)
    assert len(split["train"]) == 400 and len(split["eval"]) == 200
    for i in split["train"] + split["eval"]:
        assert set(practice.task(i).involved_classes) <= {"MathAPI", "TradingBot"}
    # the ids the unfiltered stream gives, in its order, that use only those back ends: picked, never regenerated
    unfiltered = practice.first(practice.stream(0, "train", "base"), 1000)
    wanted = [i for i in unfiltered if set(practice.task(i).involved_classes) <= {"MathAPI", "TradingBot"}]
    assert [i for i in split["train"] if "_base_" in i] == wanted[:100]
    assert set(full["train"]) != set(split["train"])
    seen = {practice.signature(practice.task(i)) for i in split["train"]}
    assert not seen & {practice.signature(practice.task(i)) for i in split["eval"]}

    with pytest.raises(ConfigError, match="unknown back end 'Math'.*MathAPI"):
        load_split(load_config(None, ["data.source=practice", "data.practice_backends=[Math]"]))
    with pytest.raises(ConfigError, match="long_context tasks need one of"):
        load_split(load_config(None, ["data.source=practice", "data.practice_backends=[MathAPI]"]))
    only_base = ["data.source=practice", "data.practice_backends=[MathAPI]", "data.categories=[base]"]
    assert all(
        practice.task(i).involved_classes == ["MathAPI"] for i in load_split(load_config(None, only_base))["train"]
    )


def test_making_practice_tasks_leaves_bfcls_tool_docs_as_they_are():
    """The practice docs write enums out as JSON schema; BFCL's own docs (shared in one process with the BFCL
    tasks and their prompts) must not change when practice tasks are made."""
    import copy

    from seal_mini.envs.bfcl import tool_docs
    from seal_mini.envs.practice import DOMAINS

    before = {d.cls: copy.deepcopy(tool_docs(d.cls)) for d in DOMAINS}
    for category in ("base", "long_context"):
        for n in range(60):
            practice.task(practice.task_id(0, "train", category, n))
    assert {d.cls: tool_docs(d.cls) for d in DOMAINS} == before
    assert not any('"enum"' in json.dumps(docs) for docs in before.values())
