"""Your own tool world: back-end classes you write and tasks in a JSON Lines file (data.source: tasks).

A recipe names the world (docs/your_tools.md has the whole story):

    data:
      source: tasks
      tasks_file: examples/kitchen/tasks.jsonl
      tool_classes: [kitchen:Oven, kitchen:Pantry]

Tool classes are back ends in BFCL's shape: every public method is a tool, its schema built from its typed signature
and Google-style docstring, or read from the file of BFCL tool docs the class names in `_tool_docs`; a task's
initial_config reaches a fresh instance through `_load_scenario` (BFCL's protocol) or as public attributes. Tasks
use BFCL's field names (TASK_FIELDS). When the world loads, every line is checked and every task's ground truth is
played through the kit's own episode and scored by BFCL's checker; a problem stops the load with one line naming
the file, the line and the problem.

A class is registered under its name in BFCL's own table of back ends (CLASS_FILE_PATH_MAPPING), which BFCL's
executor and the kit's harness (bfcl_class) both read, and its docs in bfcl.WORLD_DOCS, which tool_docs reads; a
class named like one of BFCL's is refused. From then on the episode, the harness's guards (only public methods
with literal arguments run, nothing the model wrote is eval()ed), the verifier, the diagnoser and the interface
treat it as they treat BFCL's classes. Loading a world makes its ids known to seal_mini.envs.splits (TASKS):
every program that looks a task up by id loads its run's split first.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from seal_mini.config import CATEGORIES, Config, ConfigError
from seal_mini.envs.bfcl import WORLD_DOCS, Task, tool_docs
from seal_mini.envs.harness import BLOCKED_NAMES, bfcl_class, public_method_names
from seal_mini.envs.scripted import ground_truth_turns, replay
from seal_mini.envs.verifier import check_episode
from seal_mini.runio import read_text

TASK_FIELDS = {
    "id": "a string of letters, digits, _ . - (not multi_turn_... or practice_..., which name BFCL's and practice tasks)",
    "split": "train or heldin: the side of the run's split the task is on",
    "category": f"one of {list(CATEGORIES)} (default base); long_context passes long_context=True to _load_scenario",
    "question": 'the user turns: a list of turns, each a list of messages {"role": "user", "content": "..."}',
    "initial_config": "{Class: state} for the classes the task involves (default {})",
    "involved_classes": "the classes the task uses, a list of class names (default: all of data.tool_classes)",
    "ground_truth": "per turn, a list of calls such as \"bake(dish='bread', minutes=30)\" (literal arguments)",
    "missed_function": '{"turn": [tool names]}: tools withheld until that turn, as BFCL\'s miss_func (default {})',
}
"""The fields of a task line and what each holds (id, split, question and ground_truth are required)."""
REQUIRED = ("id", "split", "question", "ground_truth")
SIDES = {"train": "train", "heldin": "eval"}
"""A task's split side -> the key of the run's split it goes to."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_JSON_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean", dict: "dict", list: "array"}
_JSON_TYPES |= {tuple: "tuple", typing.Any: "any"}
_SECTION = re.compile(r"\s*(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*")

TASKS: dict[str, Task] = {}
"""Every task of the worlds this process has loaded, by id (seal_mini.envs.splits looks ids up here)."""


# --- tool classes -> registered back ends with tool docs --------------------------------------------


def _schema(hint) -> dict:
    """A parameter's type annotation as a BFCL doc type (str, int, float, bool, list[...], dict, tuple, Any,
    Literal[...] for allowed values, X | None read as X)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in (str, int, float, bool):
            raise ValueError(f"{hint}: the values of a Literal must be all strings, all integers, ...")
        return {"type": _JSON_TYPES[type(args[0])], "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise ValueError(f"{hint} is a union of types; give one type (X | None is fine)")
        return _schema(rest[0])
    if origin in (list, dict, tuple):
        out = {"type": _JSON_TYPES[origin]}
        if origin is list and args:
            out["items"] = _schema(args[0])
        return out
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise ValueError(f"{hint} has no JSON type (use str, int, float, bool, list, dict, tuple, Literal[...] or Any)")


def _docstring(method) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring: the text before the first
    section is the description; in "Args:", a line `name (type): text` starts a parameter's entry."""
    params = set(inspect.signature(method).parameters)
    description, args, section, current = [], {}, "", None
    for line in inspect.cleandoc(method.__doc__ or "").splitlines():
        if m := _SECTION.fullmatch(line):
            section, current = m.group(1), None
        elif not section:
            description.append(line.strip())
        elif section in ("Args", "Arguments", "Parameters"):
            entry = re.fullmatch(r"\s*(\w+)\s*(?:\(.*?\))?\s*:\s*(.*)", line)
            if entry and entry.group(1) in params:
                current = entry.group(1)
                args[current] = entry.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return " ".join(w for w in description if w), args


def _enum_in_description(spec: dict) -> dict:
    """A parameter whose description lists BFCL's `[Enum]: [...]` also gets those values as a JSON-schema
    enum, so a value outside them is a schema problem the diagnoser names (as the practice docs do)."""
    m = re.search(r"\[Enum\]: (\[.*?\])", spec.get("description", ""))
    if m and "enum" not in spec and spec.get("type") != "array":
        try:
            return {**spec, "enum": json.loads(m.group(1))}
        except ValueError:
            pass
    return spec


def _method_doc(method, where: str) -> dict:
    """One public method as a BFCL tool doc, from its signature and docstring."""
    description, arg_text = _docstring(method)
    if not description:
        raise ConfigError(f"{where}: no docstring; its first lines are the tool's description for the model")
    try:
        hints = typing.get_type_hints(method)
    except Exception as e:  # noqa: BLE001 - whatever an unresolvable annotation raises
        raise ConfigError(f"{where}: its type annotations do not resolve ({type(e).__name__}: {e})") from None
    properties, required = {}, []
    for p in inspect.signature(method).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"{where}: *{p.name}: a tool takes named parameters only")
        if p.name not in hints:
            raise ConfigError(f"{where}: parameter {p.name} has no type annotation (the schema is built from it)")
        try:
            spec = _schema(hints[p.name])
        except ValueError as e:
            raise ConfigError(f"{where}: parameter {p.name}: {e}") from None
        text = arg_text.get(p.name, "")
        if "enum" in spec:  # BFCL's docs write allowed values into the description, where a model reads them
            text = f"{text} [Enum]: {json.dumps(spec['enum'])}".strip()
        if text:
            spec["description"] = text
        if p.default is p.empty:
            required.append(p.name)
        elif isinstance(p.default, (str, int, float, bool)):
            spec["default"] = p.default
        properties[p.name] = spec
    parameters = {"type": "dict", "properties": properties, "required": required}
    return {"name": method.__name__, "description": description, "parameters": parameters}


def _shown(path) -> Path:
    """A path as an error message shows it: relative to the current folder where it lies inside it."""
    path = Path(path)
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _json_lines(path: Path):
    """(line number, parsed value) for each non-blank line of a JSON Lines file; a bad line is one error."""
    for n, line in enumerate(read_text(path, "save it as UTF-8 JSON Lines").splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{path}:{n}: not JSON ({e})") from None


def _file_docs(cls: type, instance, where: str) -> list[dict]:
    """The BFCL tool docs of the JSON Lines file the class names in `_tool_docs` (beside its module)."""
    path = _shown(Path(inspect.getfile(cls)).parent / cls._tool_docs)
    if not path.is_file():
        raise ConfigError(f"{where}: _tool_docs names {path}, which does not exist")
    methods = set(public_method_names(instance))
    docs = []
    for n, doc in _json_lines(path):
        line = f"{path}:{n}"
        params = doc.get("parameters") if isinstance(doc, dict) else None
        if not isinstance(params, dict) or not isinstance(doc.get("description"), str):
            raise ConfigError(f'{line}: a tool doc is {{"name", "description", "parameters": {{"type": "dict", ...}}}}')
        if not isinstance(doc.get("name"), str) or doc["name"] not in methods:
            raise ConfigError(f"{line}: {doc.get('name')!r} is no public method of {cls.__name__}")
        properties, required = params.get("properties", {}), params.get("required", [])
        if not (isinstance(properties, dict) and _is_list([*properties.values()], dict) and _is_list(required, str)):
            raise ConfigError(f"{line}: parameters.properties maps names to schemas, parameters.required lists names")
        signature = inspect.signature(getattr(instance, doc["name"])).parameters
        unknown = [p for p in [*properties, *required] if p not in signature]
        if unknown:
            raise ConfigError(f"{line}: {doc['name']} has no parameter {unknown[0]!r}")
        params["properties"] = {k: _enum_in_description(v) for k, v in properties.items()}
        docs.append(doc)
    missing = sorted(methods - {d["name"] for d in docs})
    if missing:
        raise ConfigError(f"{path}: no doc for the public methods {missing} of {cls.__name__} (each is a tool)")
    return docs


def register(spec: str, key: str) -> str:
    """Import one data.tool_classes entry (module:Class), check it, and register it as a back end the kit
    and BFCL's executor find by name (the module docstring); returns the class name."""
    from bfcl_eval.constants.executable_backend_config import BACKEND_PATH_PREFIX, CLASS_FILE_PATH_MAPPING

    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import
        raise ConfigError(
            f"{key} {spec!r}: module {module_name} does not import ({type(e).__name__}: {e}); it must be importable "
            "from the current folder, PYTHONPATH or the tasks file's folder"
        ) from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        what = "has no class" if cls is None else "has a name, but not a class,"
        raise ConfigError(f"{key} {spec!r}: {module_name} {what} {name}")
    where = f"{_shown(inspect.getfile(cls))}: {name}"
    if cls.__name__ != name or getattr(sys.modules.get(cls.__module__), name, None) is not cls:
        raise ConfigError(f"{key} {spec!r}: define the class at the top level of a module, under its own name")
    if CLASS_FILE_PATH_MAPPING.get(name, "").startswith(BACKEND_PATH_PREFIX):
        raise ConfigError(f"{key} {spec!r}: {name} is the name of one of BFCL's back ends; rename your class")
    if name in CLASS_FILE_PATH_MAPPING and bfcl_class(name) is not cls:
        raise ConfigError(f"{key} {spec!r}: another class named {name} is registered ({bfcl_class(name).__module__})")
    try:
        instance = cls()
    except Exception as e:  # noqa: BLE001 - the user's constructor
        raise ConfigError(f"{where}: cannot be built with no arguments ({type(e).__name__}: {e})") from None
    methods = public_method_names(instance)
    if not methods:
        raise ConfigError(f"{where}: has no public method (its public methods are the tools)")
    blocked = sorted(set(methods) & set(BLOCKED_NAMES))
    if blocked:
        raise ConfigError(f"{where}: BFCL's executor refuses calls named {blocked}; rename those methods")
    if getattr(cls, "_tool_docs", None):
        docs = _file_docs(cls, instance, where)
    else:
        docs = [_method_doc(getattr(instance, m), f"{where}.{m}") for m in methods]
    CLASS_FILE_PATH_MAPPING[name] = cls.__module__
    WORLD_DOCS[name] = tuple(docs)
    return name


# --- task lines -> Tasks ------------------------------------------------------------------------------


def _call_name(text: str) -> str:
    """The tool a ground-truth call string names, if it is one call with literal arguments (else ValueError)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError("not a call (write name(key=value, ...))") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("not a call of a tool by its name (write name(key=value, ...))")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError("*args or **kwargs; give each argument")
    for value in [*node.args, *(k.value for k in node.keywords)]:
        try:
            ast.literal_eval(value)
        except ValueError:
            raise ValueError(f"the argument {ast.unparse(value)} is not a literal value") from None
    return node.func.id


def _is_list(value, item_type) -> bool:
    return isinstance(value, list) and all(isinstance(v, item_type) for v in value)


def _is_turn(messages) -> bool:
    """A question turn: a list of {"role": "user", "content": text} messages."""
    return _is_list(messages, dict) and all(
        set(m) == {"role", "content"} and m["role"] == "user" and isinstance(m["content"], str) for m in messages
    )


def _task(row, classes: list[str], index: dict[str, int], where: str) -> tuple[Task, str]:
    """One task line, checked field by field -> (Task, split side)."""

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{where}: {problem}")

    if not isinstance(row, dict):
        raise bad("a line holds one JSON object, a task")
    unknown = sorted(set(row) - set(TASK_FIELDS))
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}; the fields are {list(TASK_FIELDS)}")
    for name in REQUIRED:
        if name not in row:
            raise bad(f"no {name!r}: {TASK_FIELDS[name]}")
    id_, side, category = row["id"], row["split"], row.get("category", "base")
    if not isinstance(id_, str) or not _ID.fullmatch(id_) or id_.startswith(("multi_turn_", "practice_")):
        raise bad(f"id {id_!r}: {TASK_FIELDS['id']}")
    if side not in SIDES:
        raise bad(f"split {side!r}: {TASK_FIELDS['split']}")
    if category not in CATEGORIES:
        raise bad(f"category {category!r}: {TASK_FIELDS['category']}")
    question, truth = row["question"], row["ground_truth"]
    if not _is_list(question, list) or not question or not all(map(_is_turn, question)):
        raise bad(f"question: {TASK_FIELDS['question']}")
    if not _is_list(truth, list) or not all(_is_list(t, str) for t in truth) or len(truth) != len(question):
        raise bad(f"ground_truth: {TASK_FIELDS['ground_truth']}, one list per question turn ({len(question)})")
    involved = row.get("involved_classes", classes)
    if not _is_list(involved, str) or not involved or len(set(involved)) != len(involved):
        raise bad(f"involved_classes: {TASK_FIELDS['involved_classes']}")
    if any(c not in classes for c in involved):
        raise bad(f"involved_classes: {next(c for c in involved if c not in classes)!r} is not in data.tool_classes")
    config = row.get("initial_config", {})
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise bad(f"initial_config: {TASK_FIELDS['initial_config']}")
    for name, state in config.items():
        if name not in involved:
            raise bad(f"initial_config: {name!r} is not one of the task's involved_classes {involved}")
        cls = bfcl_class(name)
        attributes = {k for k in vars(cls()) if not k.startswith("_")}
        for key in state:
            if not hasattr(cls, "_load_scenario") and key not in attributes:
                raise bad(
                    f"initial_config.{name}.{key}: {name} has no _load_scenario, and its constructor sets no public "
                    f"attribute {key} (it sets {sorted(attributes)})"
                )

    docs = {d["name"]: d for c in involved for d in tool_docs(c)}
    missed = row.get("missed_function", {})
    if not isinstance(missed, dict) or not all(k.isdigit() and _is_list(v, str) for k, v in missed.items()):
        raise bad(f"missed_function: {TASK_FIELDS['missed_function']}")
    withheld: dict[str, int] = {}
    for turn, names in missed.items():
        if not 0 < int(turn) < len(question):
            raise bad(
                f"missed_function: turn {turn}: a tool can be withheld until a later turn (1 to {len(question) - 1})"
            )
        for name in names:
            if name not in docs or name in withheld:
                raise bad(f"missed_function: {name!r} is no tool of {involved}, or is withheld twice")
            withheld[name] = int(turn)
    for t, messages in enumerate(question):
        if not messages and t not in withheld.values():
            raise bad(f"question turn {t} is empty (only a missed_function turn may be: the kit shows the new tools)")
    for t, calls in enumerate(truth):
        for text in calls:
            call = f"ground_truth turn {t}: {text!r}"
            try:
                name = _call_name(text)
            except ValueError as e:
                raise bad(f"{call}: {e}") from None
            if name not in docs:
                raise bad(f"{call}: {name} is no public method of {involved}")
            if withheld.get(name, 0) > t:
                raise bad(f"{call}: missed_function withholds {name} until turn {withheld[name]}")
    if not any(truth):
        raise bad("ground_truth makes no call at all, so a model that does nothing would pass")

    index[category] = index.get(category, -1) + 1
    task = Task(
        id=id_,
        category=category,
        index=index[category],
        turns=[list(messages) for messages in question],
        initial_config=config,
        involved_classes=list(involved),
        ground_truth=truth,
        tools=[dict(d) for d in docs.values() if d["name"] not in withheld],
        held_out={int(turn): [docs[n] for n in names] for turn, names in missed.items()},
    )
    return task, side


def _check_ground_truth(task: Task, where: str) -> None:
    """Play the ground truth on fresh instances through the episode: every call runs cleanly and BFCL's
    checker passes the episode (a back end whose outputs vary between runs would fail it)."""
    try:
        episode, reward = replay(task, ground_truth_turns(task))
    except Exception as e:  # noqa: BLE001 - the user's _load_scenario or a value JSON cannot carry
        raise ConfigError(
            f"{where}: the ground truth does not run on fresh instances ({type(e).__name__}: {e})"
        ) from None
    for turn in episode.turn_records():
        for text, event in zip(task.ground_truth[turn.index], turn.events, strict=False):  # one message, in order
            if event.error_kind:
                raise ConfigError(f"{where}: ground_truth turn {turn.index}: {text!r} fails: {event.error}")
    if reward != 1:
        verdict = check_episode(episode)
        raise ConfigError(
            f"{where}: BFCL's checker fails the ground truth against itself ({verdict.error_type} at turn "
            f"{verdict.failed_turn}): the same calls must give the same state and outputs (no clock, no unseeded random)"
        )


@dataclass
class World:
    """A loaded tasks world: its tasks by id, in file order, and each one's split side."""

    tasks: dict[str, Task]
    sides: dict[str, str]


@cache
def _load(path: Path, tool_classes: tuple[str, ...], stamp: tuple) -> World:
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # after the current folder and PYTHONPATH, so it never shadows a module
        sys.path.append(folder)
    classes = [register(spec, f"data.tool_classes[{i}]") for i, spec in enumerate(tool_classes)]
    owners: dict[str, str] = {}
    for name in classes:
        for doc in tool_docs(name):
            if owners.setdefault(doc["name"], name) != name:
                raise ConfigError(f"data.tool_classes: {owners[doc['name']]} and {name} both have a tool {doc['name']}")
    world, lines, index = World({}, {}), {}, {}
    for n, row in _json_lines(path):
        task, side = _task(row, classes, index, f"{path}:{n}")
        if task.id in lines:
            raise ConfigError(f"{path}:{n}: id {task.id!r} is also the id of line {lines[task.id]}")
        _check_ground_truth(task, f"{path}:{n}")
        lines[task.id] = n
        world.tasks[task.id], world.sides[task.id] = task, side
    for side in SIDES:
        if side not in world.sides.values():
            raise ConfigError(
                f"{path}: no task has split {side!r}; a run trains on train tasks and evaluates heldin ones"
            )
    return world


def load(tasks_file: str, tool_classes: list[str]) -> World:
    """The world of a tasks file and its tool classes, checked (once per process while the file is unchanged);
    its tasks become known by id (TASKS)."""
    path = Path(tasks_file)
    if not path.is_file():
        raise ConfigError(f"data.tasks_file: {path} does not exist (a JSON Lines file of tasks: docs/your_tools.md)")
    stat = path.stat()
    world = _load(path, tuple(tool_classes), (stat.st_mtime_ns, stat.st_size))
    TASKS.update(world.tasks)
    return world


def world_split(cfg: Config) -> dict[str, list[str]]:
    """The run's train / held-in ids (data.source: tasks): the tasks of data.categories on each side, in file order."""
    world = load(cfg.data.tasks_file, cfg.data.tool_classes)
    split = {key: [] for key in SIDES.values()}
    for id_, task in world.tasks.items():
        if task.category in cfg.data.categories:
            split[SIDES[world.sides[id_]]].append(id_)
    for side, key in SIDES.items():
        if not split[key]:
            raise ConfigError(f"data.categories: no {side} task of {cfg.data.tasks_file} is in {cfg.data.categories}")
    return split


def fingerprint(cfg: Config) -> str:
    """A digest of what a tasks world is made of (the tasks file, the tool classes' source and doc files), so
    that a warm start built on another version of it is not reused."""
    load(cfg.data.tasks_file, cfg.data.tool_classes)
    digest = hashlib.sha256(Path(cfg.data.tasks_file).read_bytes())
    for spec in cfg.data.tool_classes:
        cls = bfcl_class(spec.partition(":")[2])
        files = [Path(inspect.getfile(cls))]
        files += [files[0].parent / cls._tool_docs] if getattr(cls, "_tool_docs", None) else []
        for file in files:
            digest.update(file.read_bytes())
    return digest.hexdigest()
