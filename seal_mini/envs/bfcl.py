"""BFCL V3 multi-turn tasks, read from the pinned bfcl-eval package (data, ground truth, tool docs).

The package is installed with --no-deps (requirements-nodeps.txt): only its data files, tool back ends
and checker are used. Its model-call executor (eval on strings) is never given model text.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from seal_mini.config import CATEGORIES, ConfigError
from seal_mini.runio import read_text

# bfcl-eval writes lock files under BFCL_PROJECT_ROOT (next to site-packages by default); point it at
# a scratch folder before the package is first imported.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "seal_mini_bfcl"))

TASKS_PER_CATEGORY = 200
NEW_TOOLS_USER_TEXT = "I have updated some more functions you can choose from. What about now?"
"""What BFCL says at a miss_func reveal turn (its DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)."""
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
"""What BFCL's loader appends to the description of every tool a Python task offers from its start."""

_BFCL_TO_JSON_TYPE = {"dict": "object", "float": "number", "tuple": "array", "any": None}
"""BFCL's type names that JSON schema spells otherwise (None: no type); the rest are JSON's own."""


@dataclass
class Task:
    """One BFCL V3 multi-turn task: user turns, initial back-end state, ground truth, tool docs."""

    id: str
    category: str
    index: int
    turns: list[list[dict]]
    """User messages per turn. A BFCL miss_func reveal turn holds the message BFCL's inference loop sends
    there; a task of the kit's own may leave it empty (the env then writes its own)."""
    initial_config: dict
    involved_classes: list[str]
    ground_truth: list[list[str]]
    """Per turn, the reference calls as BFCL strings (some use positional arguments)."""
    tools: list[dict]
    """BFCL tool docs offered from the first turn (a BFCL task's as its entry gives them to the model)."""
    held_out: dict[int, list[dict]] = field(default_factory=dict)
    """miss_func: turn index -> tool docs revealed at that turn."""

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"


def bfcl_root() -> Path:
    """The installed bfcl_eval package folder, or a clear error saying how to install it."""
    try:
        import bfcl_eval
    except ImportError:
        raise ConfigError(
            "bfcl-eval is not installed: pip install --no-deps -r requirements-nodeps.txt (bash run.sh sets this up)"
        ) from None
    return Path(bfcl_eval.__file__).parent


def read_jsonl(path: Path) -> list[dict]:
    """The rows of one of BFCL's data files (JSON Lines, despite the .json names)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


WORLD_DOCS: dict[str, tuple[dict, ...]] = {}
"""Tool docs of a recipe's own back-end classes (data.source: tasks), by class name; seal_mini.envs.world
registers them with their classes."""


@cache
def tool_docs(class_name: str) -> tuple[dict, ...]:
    """The tool docs of one back-end class in BFCL's schema dialect: BFCL's as published, or a recipe's own."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    if class_name in WORLD_DOCS:
        return WORLD_DOCS[class_name]
    path = bfcl_root() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(read_jsonl(path))


V3_CLASSES = tuple(
    "GorillaFileSystem MathAPI MessageAPI TwitterAPI TicketAPI TradingBot TravelAPI VehicleControlAPI".split()
)
"""The back-end classes of BFCL V3 multi-turn."""


def foreign_tool_names(task: Task) -> list[str]:
    """The tools of every back end the task does not involve, sorted: real BFCL tools it never offers."""
    return sorted(d["name"] for cls in V3_CLASSES if cls not in task.involved_classes for d in tool_docs(cls))


@cache
def _load_category(category: str) -> tuple[Task, ...]:
    """A category's tasks with what BFCL's loader and inference loop show the model: the offered docs with
    its Python hint (the held-out ones without, as its loader leaves them), and at each reveal turn the
    message its prompting loop sends (DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING: the held-out
    docs as Python writes a list, then its sentence). The system prompt's tool list never changes."""
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

    data_dir = bfcl_root() / "data"
    rows = read_jsonl(data_dir / f"BFCL_v4_multi_turn_{category}.json")
    answer_rows = read_jsonl(data_dir / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in answer_rows}
    tasks = []
    for row in rows:
        docs = [dict(d) for cls in row["involved_classes"] for d in tool_docs(cls)]
        held_out: dict[int, list[dict]] = {}
        turns = [list(messages) for messages in row["question"]]
        for turn, names in row.get("missed_function", {}).items():
            held_out[int(turn)] = [next(d for d in docs if d["name"] == name) for name in names]  # BFCL's order
            docs = [d for d in docs if d["name"] not in names]
            reveal = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out[int(turn)])
            turns[int(turn)] = [{"role": "user", "content": reveal}]
        for doc in docs:
            doc["description"] += PYTHON_HINT
        tasks.append(
            Task(
                id=row["id"],
                category=category,
                index=int(row["id"].rsplit("_", 1)[1]),
                turns=turns,
                initial_config=row["initial_config"],
                involved_classes=list(row["involved_classes"]),
                ground_truth=answers[row["id"]],
                tools=docs,
                held_out=held_out,
            )
        )
    return tuple(tasks)


def load_tasks(categories: tuple[str, ...] | list[str] = CATEGORIES) -> list[Task]:
    """All tasks of the given categories, in category then index order."""
    out = []
    for category in categories:
        if category not in CATEGORIES:
            raise ConfigError(f"unknown BFCL category {category!r}; choose from {CATEGORIES}")
        out.extend(_load_category(category))
    return out


def tasks_by_id(categories: tuple[str, ...] | list[str] = CATEGORIES) -> dict[str, Task]:
    """The tasks of the given categories by id."""
    return {t.id: t for t in load_tasks(categories)}


# --- tool docs as JSON schema (the form `apply_chat_template(tools=...)` expects) -------------------


def _to_json_schema(node: dict) -> dict:
    out = {}
    for key, value in node.items():
        if key == "type":
            json_type = _BFCL_TO_JSON_TYPE.get(value, value)
            if json_type is not None:
                out["type"] = json_type
        elif key == "properties":
            out["properties"] = {name: _to_json_schema(p) for name, p in value.items()}
        elif key == "items" and isinstance(value, dict):
            out["items"] = _to_json_schema(value)
        else:
            out[key] = value
    return out


def to_chat_tool(doc: dict) -> dict:
    """One BFCL tool doc -> {"type": "function", "function": {name, description, parameters}}."""
    params = _to_json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {"name": doc["name"], "description": doc.get("description", ""), "parameters": params},
    }


# --- the train / eval split -------------------------------------------------------------------------


def make_split(train_per_category: int = 100, seed: int = 0, categories=CATEGORIES) -> dict[str, list[str]]:
    """Split by base-task index: task i of every category is a variant of base task i, so all four
    variants of an index go to the same side, or evaluation would see its training tasks' twins."""
    indices = list(range(TASKS_PER_CATEGORY))
    random.Random(seed).shuffle(indices)
    train_idx = sorted(indices[:train_per_category])
    eval_idx = sorted(indices[train_per_category:])
    return {
        "train": [f"multi_turn_{c}_{i}" for c in categories for i in train_idx],
        "eval": [f"multi_turn_{c}_{i}" for c in categories for i in eval_idx],
    }


def read_split_file(path: str | Path) -> dict[str, list[str]]:
    """An explicit {"train": [...], "eval": [...]} id file (or the SEAL release's layout, "test" for "eval");
    every id must exist. Other keys (source, licence, seed) are notes."""
    path = Path(path)
    checkout = Path(__file__).resolve().parents[2] / path  # a shipped split (recipes/splits/) from anywhere
    if not path.is_file() and not path.is_absolute() and checkout.is_file():
        path = checkout
    if not path.is_file():
        raise ConfigError(f"data.split_file: {path} does not exist")
    try:
        split = json.loads(read_text(path, "save it as UTF-8 JSON text"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"data.split_file: {path} is not JSON ({e})") from None
    if isinstance(split, dict) and "eval" not in split and "test" in split:
        split = {**split, "eval": split["test"]}
    if not isinstance(split, dict) or not {"train", "eval"} <= set(split):
        raise ConfigError(f'data.split_file: {path} must hold {{"train": [ids], "eval": [ids]}} (or "test": [ids])')
    known = tasks_by_id()
    for side in ("train", "eval"):
        unknown = [i for i in split[side] if i not in known]
        if unknown:
            raise ConfigError(f"data.split_file: unknown task ids in {side}: {unknown[:5]}")
    overlap = set(split["train"]) & set(split["eval"])
    if overlap:
        raise ConfigError(f"data.split_file: ids on both sides: {sorted(overlap)[:5]}")
    return {"train": list(split["train"]), "eval": list(split["eval"])}
