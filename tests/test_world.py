"""A tool world of your own (seal_mini/envs/world.py, data.source: tasks): the example kitchen plays its ground
truth to reward 1 and nothing to 0, every malformed task or tool file is refused in one line naming the file
and the problem, and the whole pipeline (warm start, training, held-in evaluation, report) runs on it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.envs import world
from seal_mini.envs.bfcl import to_chat_tool, tool_docs
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import POLICIES, replay
from seal_mini.envs.splits import load_split, pick, tasks_for
from seal_mini.runio import read_json

ROOT = Path(__file__).resolve().parents[1]
KITCHEN = ROOT / "examples" / "kitchen"
RECIPE = str(KITCHEN / "recipe.yaml")


def kitchen_cfg(*extra):
    return load_config(RECIPE, [f"data.tasks_file={KITCHEN / 'tasks.jsonl'}", *extra])


@pytest.mark.unit
def test_the_kitchen_plays_its_ground_truth_to_1_and_nothing_to_0():
    split = load_split(kitchen_cfg())
    assert (len(split["train"]), len(split["eval"])) == (80, 40)
    tasks = pick(split["train"] + split["eval"], 0)
    assert {t.category for t in tasks} == {"base", "miss_func", "miss_param", "long_context"}
    for task in tasks:
        assert replay(task, POLICIES["ground_truth"](task))[1] == 1.0, task.id
        assert replay(task, POLICIES["empty"](task))[1] == 0.0, task.id
    # a miss_func task holds its tool back and the episode reveals it at the named turn, as in BFCL
    task = next(t for t in tasks if t.held_out)
    (turn, docs), offered = next(iter(task.held_out.items())), {d["name"] for d in task.tools}
    assert docs[0]["name"] not in offered and task.turns[turn] == []
    env = Episode(task)
    env.reset()
    assert docs[0]["name"] not in env.offered


@pytest.mark.unit
def test_the_shipped_tasks_file_is_what_its_script_writes(tmp_path):
    out = tmp_path / "tasks.jsonl"
    subprocess.run([sys.executable, str(KITCHEN / "make_tasks.py"), "--out", str(out)], check=True, capture_output=True)
    assert out.read_text() == (KITCHEN / "tasks.jsonl").read_text()


@pytest.mark.unit
def test_tools_are_the_public_methods_with_schemas_from_signatures_and_docstrings():
    kitchen_cfg()  # loading the world registers its classes
    oven = {d["name"]: to_chat_tool(d)["function"] for d in tool_docs("Oven")}
    assert set(oven) == {
        "switch_on",
        "switch_off",
        "set_mode",
        "set_temperature",
        "bake",
        "status",
    }  # no _load_scenario
    mode = oven["set_mode"]["parameters"]["properties"]["mode"]
    assert mode["enum"] == ["bake", "grill", "fan"] and '[Enum]: ["bake", "grill", "fan"]' in mode["description"]
    bake = oven["bake"]["parameters"]
    assert bake["required"] == ["dish", "minutes"] and bake["properties"]["minutes"]["type"] == "integer"
    assert bake["properties"]["dish"]["description"] == "What to bake."
    # a private method is no tool: the harness refuses it like any name the task does not offer
    task = tasks_for(["kitchen_base_2"], "test")[0]
    env = Episode(task)
    env.reset()
    result = env.step('<tool_call>\n{"name": "_load_scenario", "arguments": {"scenario": {}}}\n</tool_call>')
    assert result.events[0].error_kind == "unknown_tool"
    assert world.TASKS["kitchen_base_2"] is task


# --- malformed worlds ------------------------------------------------------------------------------------

TOOLS = '''
from typing import Literal


class Lamp:
    """A lamp with _load_scenario."""

    def __init__(self):
        self.on = False
        self.color = "white"

    def _load_scenario(self, scenario, long_context=False):
        self.on = scenario.get("on", False)

    def switch(self, on: bool) -> dict:
        """Switch the lamp on or off.

        Args:
            on (bool): True for on.
        """
        self.on = on
        return {"on": on}

    def paint(self, color: Literal["red", "blue"]) -> dict:
        """Paint the lamp; it must be off.

        Args:
            color (str): The new color.
        """
        if self.on:
            raise ValueError("switch the lamp off first")
        self.color = color
        return {"color": color}


class Counter:
    """A counter without _load_scenario: its state's keys are its public attributes."""

    def __init__(self):
        self.count = 0

    def add(self, n: int) -> int:
        """Add to the count.

        Args:
            n (int): How much.
        """
        self.count += n
        return self.count
'''

GOOD = {
    "id": "t1",
    "split": "train",
    "question": [[{"role": "user", "content": "Lamp on, add 2."}]],
    "initial_config": {"Lamp": {"on": False}, "Counter": {"count": 1}},
    "ground_truth": [["switch(on=True)", "add(n=2)"]],
}
HELDIN = {**GOOD, "id": "h1", "split": "heldin"}


@pytest.fixture(scope="module")
def tools_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools")
    (folder / "seal_test_world_tools.py").write_text(TOOLS)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def world_of(tmp_path, lines, classes=("seal_test_world_tools:Lamp", "seal_test_world_tools:Counter")):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return world.load(str(path), list(classes))


@pytest.mark.unit
def test_a_good_world_loads_with_both_ways_of_reading_a_state(tools_module, tmp_path):
    loaded = world_of(tmp_path, [GOOD, HELDIN])
    assert loaded.sides == {"t1": "train", "h1": "heldin"}
    task = loaded.tasks["t1"]
    assert task.involved_classes == ["Lamp", "Counter"] and task.category == "base"
    episode, reward = replay(task, POLICIES["ground_truth"](task))
    assert reward == 1.0 and episode.turn_states[0]["Counter"]["count"] == 3  # 1 from initial_config, then 2


def truth(*calls):
    return {**GOOD, "ground_truth": [list(calls)]}


MALFORMED = [
    ([GOOD, "{not json", HELDIN], ":2: not JSON"),
    ([{k: v for k, v in GOOD.items() if k != "ground_truth"}, HELDIN], ":1: no 'ground_truth'"),
    ([{**GOOD, "question": "Lamp on"}, HELDIN], ":1: question:"),
    ([{**GOOD, "grund_truth": []}, HELDIN], ":1: unknown field 'grund_truth'"),
    ([{**GOOD, "category": "hard"}, HELDIN], ":1: category 'hard'"),
    ([{**GOOD, "split": "test"}, HELDIN], ":1: split 'test'"),
    ([{**GOOD, "id": "multi_turn_base_1"}, HELDIN], ":1: id 'multi_turn_base_1'"),
    ([{**GOOD, "involved_classes": ["Fridge"]}, HELDIN], ":1: involved_classes: 'Fridge' is not in data.tool_classes"),
    ([{**GOOD, "involved_classes": ["Lamp"]}, HELDIN], ":1: initial_config: 'Counter' is not one of"),
    ([{**GOOD, "initial_config": {"Counter": {"total": 4}}}, HELDIN], "Counter has no _load_scenario"),
    ([truth("switch(on=True)", "fly()"), HELDIN], ":1: ground_truth turn 0: 'fly()': fly is no public method"),
    ([truth("_load_scenario(scenario={})"), HELDIN], "_load_scenario is no public method"),
    ([truth("add(n=len('ab'))"), HELDIN], ":1: ground_truth turn 0: \"add(n=len('ab'))\": the argument len('ab')"),
    ([truth("add(n=2"), HELDIN], "'add(n=2': not a call"),
    ([truth("switch(on=True)", "paint(color='red')"), HELDIN], ":1: ground_truth turn 0: \"paint(color='red')\" fails"),
    ([truth(), HELDIN], ":1: ground_truth makes no call at all"),
    ([{**GOOD, "ground_truth": [[], []]}, HELDIN], ":1: ground_truth:"),
    ([{**GOOD, "missed_function": {"0": ["add"]}}, HELDIN], ":1: missed_function: turn 0"),
    ([GOOD, {**HELDIN, "id": "t1"}], ":2: id 't1' is also the id of line 1"),
    ([GOOD, {**GOOD, "id": "t2"}], ": no task has split 'heldin'"),
]


@pytest.mark.unit
@pytest.mark.parametrize("lines, problem", MALFORMED, ids=[p for _, p in MALFORMED])
def test_a_malformed_tasks_file_is_refused_in_one_line_naming_the_file_and_the_problem(
    tools_module, tmp_path, lines, problem
):
    with pytest.raises(ConfigError) as e:
        world_of(tmp_path, lines)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "tasks.jsonl")), message
    assert problem in message, message


BAD_CLASSES = {
    "seal_test_world_no_module:Lamp": "module seal_test_world_no_module does not import",
    "seal_test_world_tools:Stove": "seal_test_world_tools has no class Stove",
    "seal_test_world_tools:Literal": "has a name, but not a class, Literal",
    "seal_test_world_bad:GorillaFileSystem": "GorillaFileSystem is the name of one of BFCL's back ends",
    "seal_test_world_bad:Untyped": "Untyped.go: parameter speed has no type annotation",
    "seal_test_world_bad:Runner": "BFCL's executor refuses calls named ['run']",
    "seal_test_world_bad:NeedsArgs": "cannot be built with no arguments",
    "seal_test_world_bad:Undocumented": "Undocumented.go: no docstring",
    "seal_test_world_bad:BadDocs": "bad_docs.json:1: 'fly' is no public method of BadDocs",
}
BAD_TOOLS = '''
class GorillaFileSystem:
    def ls(self) -> str:
        """List."""
        return ""


class Untyped:
    def go(self, speed) -> None:
        """Go.

        Args:
            speed: How fast.
        """


class Runner:
    def run(self) -> None:
        """Run."""


class NeedsArgs:
    def __init__(self, size):
        self.size = size

    def grow(self) -> None:
        """Grow."""


class Undocumented:
    def go(self, speed: int) -> None:
        pass


class BadDocs:
    _tool_docs = "bad_docs.json"

    def go(self, speed: int) -> None:
        pass
'''


@pytest.mark.unit
@pytest.mark.parametrize("spec, problem", BAD_CLASSES.items(), ids=list(BAD_CLASSES))
def test_a_bad_tool_class_is_refused_in_one_line_naming_it(tools_module, tmp_path, spec, problem):
    (tools_module / "seal_test_world_bad.py").write_text(BAD_TOOLS)
    docs = {"name": "fly", "description": "Fly.", "parameters": {"type": "dict", "properties": {}}}
    (tools_module / "bad_docs.json").write_text(json.dumps(docs) + "\n")
    with pytest.raises(ConfigError) as e:
        world_of(tmp_path, [GOOD, HELDIN], [spec])
    assert "\n" not in str(e.value) and problem in str(e.value), str(e.value)


@pytest.mark.unit
def test_a_class_may_bring_its_docs_as_a_bfcl_doc_file(tools_module, tmp_path):
    (tools_module / "seal_test_world_docs.py").write_text(
        "class Dial:\n    _tool_docs = 'dial.json'\n\n    def __init__(self):\n        self.level = 0\n\n"
        "    def turn(self, level: int, unit: str = 'step') -> int:\n        self.level = level\n        return level\n"
    )
    doc = {"name": "turn", "description": "Turn the dial.", "parameters": {"type": "dict", "properties": {
        "level": {"type": "integer", "description": "The level."},
        "unit": {"type": "string", "description": 'The unit. [Enum]: ["step", "notch"]', "default": "step"}},
        "required": ["level"]}}  # fmt: skip
    (tools_module / "dial.json").write_text(json.dumps(doc) + "\n")
    lines = [{**GOOD, "initial_config": {}, "ground_truth": [["turn(level=3)"]]}]
    loaded = world_of(tmp_path, [*lines, {**lines[0], "id": "h1", "split": "heldin"}], ["seal_test_world_docs:Dial"])
    (schema,) = tool_docs("Dial")
    assert schema["parameters"]["properties"]["unit"]["enum"] == ["step", "notch"]  # [Enum] read as allowed values
    assert loaded.tasks["t1"].tools == [schema]


def test_the_command_line_prints_a_bad_world_in_one_line(tools_module, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**HELDIN, "ground_truth": [["fly()"]]}) + "\n")
    overrides = [
        f"data.tasks_file={path}",
        "data.tool_classes=[seal_test_world_tools:Lamp,seal_test_world_tools:Counter]",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "seal_mini", "oracle", "--recipe", RECIPE, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tools_module)},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {path}:2: ground_truth turn 0: 'fly()': fly is no public method")


@pytest.mark.unit
def test_config_names_a_wrong_tasks_setting():
    with pytest.raises(ConfigError, match="data.tool_classes: names the tool classes"):
        load_config(None, ["data.source=tasks", "data.tasks_file=x.jsonl"])
    with pytest.raises(ConfigError, match=r"data.tool_classes\[0\]: must be module:Class"):
        load_config(None, ["data.source=tasks", "data.tasks_file=x.jsonl", "data.tool_classes=[kitchen.Oven]"])
    with pytest.raises(ConfigError, match="data.tasks_file: applies to data.source=tasks only"):
        load_config(None, ["data.tasks_file=x.jsonl"])
    with pytest.raises(ConfigError, match="data.tasks_file: nowhere.jsonl does not exist"):
        load_split(load_config(RECIPE, ["data.tasks_file=nowhere.jsonl"]))
    with pytest.raises(ConfigError, match="data.split_file applies to data.source=bfcl"):
        load_split(kitchen_cfg("data.split_file=split.json"))


# --- the whole path ------------------------------------------------------------------------------------------


def test_the_pipeline_runs_on_the_kitchen(tmp_path):
    """Warm start (a scratch model whose tokenizer learns the kitchen's training tasks), one training step,
    held-in evaluation and the report, at the smallest scale, as `bash run.sh` would run the recipe."""
    small = ["model.scratch.vocab=600", "model.scratch.hidden=32", "model.scratch.layers=1", "model.scratch.heads=2"]
    small += ["model.scratch.kv_heads=1", "sft.epochs=1", "sft.batch=8", "sft.demos_per_task=1"]
    small += ["data.max_train_tasks=8", "data.max_eval_tasks=4", "rollout.group_size=2", "rollout.max_new_tokens=8"]
    small += ["train.steps=1", "train.tasks_per_step=2", "train.mini_batch_tasks=1", "train.eval_every=0"]
    small += ["eval.limits=rollout"]
    proc = subprocess.run(
        [sys.executable, "-m", "seal_mini", "pipeline", RECIPE, f"out_dir={tmp_path}", *small],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    run_dir = Path(summary["run_dir"])
    assert Path(summary["report"]).is_file()
    assert all(i.startswith("kitchen_") for ids in read_json(run_dir / "split.json").values() for i in ids)
    for tag in ("base", "adapter"):
        result = read_json(run_dir / "eval" / f"{tag}.json")
        assert result["n_tasks"] == 4 and set(result["success"]) >= {"base", "miss_func", "mean"}
    identity = read_json(run_dir / "warm_start" / "identity.json")
    assert len(identity["world"]) == 64  # the world's files are part of what the warm start depends on
    assert read_json(run_dir / "warm_start" / "sft.json")["stats"]["demonstrations"] == 8  # the training split's
    chat = subprocess.run(  # chat finds the run's own tasks by its config, in a fresh process
        [sys.executable, "-m", "seal_mini", "chat", str(run_dir), "--replay", "--scripted", "ground_truth"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0, chat.stderr[-3000:]
    assert "[task] kitchen_" in chat.stdout and "[verdict] reward 1" in chat.stdout, chat.stdout[-2000:]
