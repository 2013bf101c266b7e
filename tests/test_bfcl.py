import json

import pytest

from seal_mini.config import CATEGORIES, ConfigError
from seal_mini.envs.bfcl import (
    NEW_TOOLS_USER_TEXT,
    PYTHON_HINT,
    load_tasks,
    make_split,
    read_split_file,
    tasks_by_id,
    to_chat_tool,
)

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`


def test_800_tasks_with_ground_truth_and_tools():
    tasks = load_tasks()
    assert len(tasks) == 800
    for category in CATEGORIES:
        assert sum(t.category == category for t in tasks) == 200
    for t in tasks:
        assert len(t.ground_truth) == len(t.turns) and t.tools
    miss_func = [t for t in tasks if t.category == "miss_func"]
    assert all(t.held_out for t in miss_func)
    for t in miss_func:  # a held-out tool is not offered from the start; its reveal turn holds BFCL's message
        offered = {d["name"] for d in t.tools}
        for turn, docs in t.held_out.items():
            assert t.turns[turn] == [{"role": "user", "content": f"{docs}\n{NEW_TOOLS_USER_TEXT}"}]
            assert not offered & {d["name"] for d in docs}
    # BFCL's loader appends its Python hint to the docs offered from the start, not to the held-out ones
    assert all(d["description"].endswith(PYTHON_HINT) for t in tasks for d in t.tools)
    assert not any(d["description"].endswith(PYTHON_HINT) for t in miss_func for ds in t.held_out.values() for d in ds)


def test_tool_docs_become_json_schema():
    tool = to_chat_tool(
        {
            "name": "f",
            "description": "d",
            "parameters": {
                "type": "dict",
                "properties": {"a": {"type": "float"}, "b": {"type": "array", "items": {"type": "dict"}}},
                "required": ["a"],
            },
        }
    )
    params = tool["function"]["parameters"]
    assert tool["type"] == "function" and tool["function"]["name"] == "f"
    assert params["type"] == "object" and params["required"] == ["a"]
    assert params["properties"]["a"]["type"] == "number" and params["properties"]["b"]["items"]["type"] == "object"
    bfcl_types = {"dict", "float", "tuple", "any"}
    for t in load_tasks(["base"])[:20]:
        text = json.dumps([to_chat_tool(d) for d in t.tools])
        assert not any(f'"type": "{bt}"' in text for bt in bfcl_types)


def test_split_is_by_index_deterministic_and_400_400():
    split = make_split(100, seed=0)
    assert len(split["train"]) == 400 and len(split["eval"]) == 400
    assert make_split(100, seed=0) == split and make_split(100, seed=1) != split
    index = lambda i: int(i.rsplit("_", 1)[1])  # noqa: E731
    train_idx, eval_idx = {index(i) for i in split["train"]}, {index(i) for i in split["eval"]}
    assert len(train_idx) == 100 and not train_idx & eval_idx  # no variant of a base task on both sides
    for c in CATEGORIES:
        assert sum(i.startswith(f"multi_turn_{c}_") for i in split["train"]) == 100


def test_split_file_checked(tmp_path):
    good = tmp_path / "split.json"
    good.write_text(json.dumps({"train": ["multi_turn_base_0"], "eval": ["multi_turn_base_1"]}))
    assert read_split_file(good)["train"] == ["multi_turn_base_0"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train": ["multi_turn_base_999"], "eval": []}))
    with pytest.raises(ConfigError, match="unknown task ids"):
        read_split_file(bad)
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"train": ["multi_turn_base_0"], "eval": ["multi_turn_base_0"]}))
    with pytest.raises(ConfigError, match="both sides"):
        read_split_file(both)


def test_tasks_by_id():
    assert tasks_by_id(["base"])["multi_turn_base_7"].index == 7
