"""Model text is untrusted input: random and adversarial messages through everything that reads them.

Each message goes through `Episode.step` (bare, or seen through the training-time interface with every
cue on), the kit's own parser and schema check (`parse_tool_calls`, `validate_call`: the tau2 path), and
each finished episode through the official checker and the diagnoser, on tasks of every category (BFCL
V3's four and the practice sets'). The properties: nothing raises; every step stays within a time and a
memory bound; nothing but a public method of the task's back ends runs (an audit hook sees no file,
process, network or eval() event during a step); the checker and the diagnoser give a verdict and one
label per turn. The generator is seeded (`random.Random`): a failure names the seed and the message.

The known cases come first (a value nested 900 deep, arguments as a string nested 5,000 deep, 8,000 unclosed
`<tool_call>` tags, a thousand signs before a number in an argument key); then random messages. SEAL_MINI_FUZZ_MESSAGES=N runs N random ones
(default 200, about a minute here), SEAL_MINI_FUZZ_SEED=S another seed.
"""

import json
import os
import random
import sys
import time
import tracemalloc

import pytest

from seal_mini.config import CATEGORIES, LABELS
from seal_mini.core.diagnose import DIAGNOSIS_RAISED, diagnose_turns
from seal_mini.core.interface import GUIDELINES, Interface, InterfaceState
from seal_mini.envs import practice
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import (
    CHECKER_MODEL,
    INSTANCE_PREFIX,
    QWEN_FC,
    TOOLACE,
    checker_input_for,
    instance_name,
)
from seal_mini.envs.scripted import POLICIES, play
from seal_mini.envs.toolcalls import CallError, parse_tool_calls, validate_call
from seal_mini.envs.verifier import CHECKER_RAISED, check_episode

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

MESSAGES = int(os.environ.get("SEAL_MINI_FUZZ_MESSAGES", "200"))
SEED = int(os.environ.get("SEAL_MINI_FUZZ_SEED", "0"))
STEP_SECONDS = 20.0
"""A step (or a check with its diagnosis) may take this long: a hundred times what the slowest legal one
takes on a busy two-core machine, far below what quadratic decoding took (40 s for 96 KB)."""
STEP_MB = 200
"""Memory a step may allocate beyond what it started with (tracemalloc's peak)."""
MESSAGES_PER_EPISODE = 12
FORBIDDEN = ("open", "exec", "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "builtins.input", "urllib.")
"""Audit events that mean something ran outside the back ends (a file, a process, the network, eval)."""
CHECK_FORBIDDEN = tuple(e for e in FORBIDDEN if e != "exec")
"""The checker itself evals the call strings the kit vetted (seal_mini.envs.verifier); nothing else."""


def fuzz_tasks():
    """Two tasks per BFCL V3 category and one per practice category, each on other back ends."""
    by_id = tasks_by_id()
    bfcl = [by_id[f"multi_turn_{c}_{i}"] for c in CATEGORIES for i in (7, 131)]
    return bfcl + [practice.task(practice.task_id(0, "train", c, i)) for i, c in enumerate(CATEGORIES)]


# --- the generator -----------------------------------------------------------------------------------

BUILTINS = ["print", "open", "eval", "exec", "__import__", "getattr", "globals", "exit", "kill", "help", "dict"]
ODD_NAMES = [
    "__class__", "_load_scenario", "__init__", "os.system", "GorillaFileSystem.ls", "a.b.c", "ls(); import os",
    "print() or ls", "execute_multi_turn_func_call", "seal_mini_refused_call", "", " ", "ls ", "LS", "x" * 5000,
    "名前", "\u202e", "\ud800",
]  # fmt: skip
CHAINS = [
    "", ".__dict__.clear", ".__dict__.update", ".__init__.__builtins__.update", "._load_scenario",
    "._load_scenario.__globals__.update", ".__class__", ".__setattr__", ".__init__", ".__dict__",
]  # fmt: skip
"""Attribute chains after an instance's global name: each writes or reads what no tool call may reach."""
ODD_KEYS = ["a=1, b", "'workspace')#", "**kw", "", "__class__", "self", "x" * 300, "b=print()", "ключ", "\x00"]


def scalar(rng: random.Random):
    """One value: ordinary most of the time, an edge some of the time."""
    return rng.choice(
        [
            lambda: rng.randint(-5, 100),
            lambda: rng.choice([0, -1, 2**31, 2**53, 2**53 + 1, -(2**63), 10**30, 10**400]),
            lambda: rng.choice([0.5, -0.0, 1e308, 1e-320, 3.141592653589793]),
            lambda: rng.choice([True, False, None]),
            lambda: rng.choice(["", "a", "notes.txt", "../../etc/passwd", "/etc/passwd", "~", ".", "..", "*"]),
            lambda: rng.choice(["__import__('os').system('true')", "ls(a=1)", "cd(folder='x')", "${HOME}", "%s%n"]),
            lambda: "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 40))),
            lambda: "x" * rng.choice([100, 10_001, 20_000]),
        ]
    )()


def value(rng: random.Random, depth: int = 0):
    if depth < 3 and rng.random() < 0.25:
        if rng.random() < 0.5:
            return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
        return {str(scalar(rng))[:20]: value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return scalar(rng)


def nested(depth: int):
    return json.loads("[" * depth + "]" * depth)


def typed_value(rng: random.Random, spec: dict):
    """A value of the type a parameter's schema declares, often right, sometimes not."""
    if rng.random() < 0.2:
        return value(rng)
    if "enum" in spec and spec["enum"]:
        return rng.choice(spec["enum"])
    kind = spec.get("type")
    return {
        "string": lambda: rng.choice(["notes.txt", "document", "final_report.pdf", "alice", "Hello", "1"]),
        "integer": lambda: rng.randint(-3, 50),
        "number": lambda: rng.choice([0, 1.5, 100, -2.25]),
        "boolean": lambda: rng.random() < 0.5,
        "array": lambda: [rng.choice(["a", "b", 1, 2.5]) for _ in range(rng.randint(0, 4))],
        "dict": lambda: {"key": "value"},
    }.get(kind, lambda: value(rng))()


def arguments(rng: random.Random, tool: dict | None) -> dict:
    props = (tool or {}).get("function", {}).get("parameters", {}).get("properties", {})
    args = {name: typed_value(rng, spec) for name, spec in props.items() if rng.random() < 0.8}
    if rng.random() < 0.15:
        args[rng.choice(ODD_KEYS)] = value(rng)
    if rng.random() < 0.05:
        args["a=" + "-" * rng.choice([100, 990, 3000]) + "1, b"] = 1
    if rng.random() < 0.05:
        args[rng.choice(list(props) or ["x"])] = nested(rng.choice([9, 50, 190, 250, 900]))
    return args


def instance_names(task) -> list[str]:
    """The global names of every instance the episode and the checker create for a task (the checker's
    model-side and ground-truth ones), under which BFCL's executor would find them."""
    prefixes = (INSTANCE_PREFIX, f"{CHECKER_MODEL}_eval", f"{CHECKER_MODEL}_ground_truth_eval")
    return [instance_name(p, task.id, c) for p in prefixes for c in task.involved_classes]


def call_object(rng: random.Random, tools: dict, other_names: list[str], instances: list[str]) -> dict:
    roll = rng.random()
    if roll < 0.65 and tools:
        name = rng.choice(sorted(tools))
    elif roll < 0.8:
        name = rng.choice(other_names or ["ls"])
    elif roll < 0.9:
        name = rng.choice(instances) + rng.choice(CHAINS + [f".{t}" for t in sorted(tools)[:3]])
    else:
        name = rng.choice(BUILTINS + ODD_NAMES)
    obj = {"name": name, "arguments": arguments(rng, tools.get(name))}
    if "." in name and rng.random() < 0.5:
        obj["arguments"] = {"seal_mini_fuzz": 1}  # what update() would write
    odd = rng.random()
    if odd < 0.05:
        obj["arguments"] = json.dumps(obj["arguments"])  # a JSON string: BFCL accepts it
    elif odd < 0.08:
        obj["arguments"] = rng.choice([[], "not json", None, 5])
    elif odd < 0.11:
        del obj[rng.choice(["name", "arguments"])]
    elif odd < 0.13:
        obj["name"] = rng.choice([5, None, [], {"a": 1}])
    return obj


def block(rng: random.Random, obj) -> str:
    body = json.dumps(obj, ensure_ascii=rng.random() < 0.5)
    shape = rng.random()
    if shape < 0.8:
        return f"<tool_call>\n{body}\n</tool_call>"
    return rng.choice(
        [
            f"<tool_call>{body}</tool_call>",  # one line: BFCL does not read it
            f"<tool_call>\n```json\n{body}\n```\n</tool_call>",
            f"<tool_call>\n{body}{body}\n</tool_call>",
            f"<tool_call>\n[{body}]\n</tool_call>",
            f"<tool_call>\n{body[: rng.randint(0, len(body))]}\n</tool_call>",  # broken JSON
            f"<tool_call>\r\n{body}\r\n</tool_call>",
            f"<tool_call>\n{body}",  # never closed
        ]
    )


PYTHON_ODD = [
    "[__import__('os').system('true')]", "[ls(a=__import__('os').getcwd())]", "[ls(a=1 + 2)]", "[ls(a=2 ** 2 ** 99)]",
    "[ls(a=lambda: __import__('os'))]", "[cd(folder=open('x'))]", "[print(x=1)]", "[ls(a=[x for x in range(9)])]",
    "[ls(a={1, 2})]", "[ls(a=b[0])]", "[ls(*args)]", "[ls(**kw)]", "[os.system(command='true')]", "[ls(", "]", "[]",
    "[ls(a='x)]", "[ls(a=-(-1))]", "[ls(a=+'x')]", "[ls(a=not True)]", "ls(a=1); import os", "[" * 5000,
]  # fmt: skip
"""Python call lists BFCL's LlamaHandler decoder would eval, choke on, or read its own way."""


def python_calls(rng: random.Random, tools: dict, other_names: list[str], instances: list[str]) -> str:
    """A message of Python calls: the offered tools (keyword arguments written by repr), or an odd one."""
    if rng.random() < 0.3:
        return rng.choice(PYTHON_ODD)
    calls = [call_object(rng, tools, other_names, instances) for _ in range(rng.choice([1, 1, 2, 3, 30]))]
    written = []
    for obj in calls:
        name, args = obj.get("name"), obj.get("arguments")
        args = args if isinstance(args, dict) else {}
        written.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    text = f"[{', '.join(written)}]"
    return rng.choice([text, text[1:-1], f"```python\n{text}\n```", f"Sure. {text}", text[: rng.randint(0, len(text))]])


def message(
    rng: random.Random, tools: dict, other_names: list[str], instances: list[str], python: bool = False
) -> str | bytes:
    """One assistant message: calls of the offered tools in many shapes (Python call lists where the episode
    follows BFCL's LlamaHandler), calls that name an instance, prose, noise, or format abuse."""
    kind = rng.random()
    if python and kind < 0.55:
        text = python_calls(rng, tools, other_names, instances)
    elif kind < 0.55:
        count = rng.choice([1, 1, 1, 2, 3, 40])
        blocks = [block(rng, call_object(rng, tools, other_names, instances)) for _ in range(count)]
        text = "\n".join(blocks)
    elif kind < 0.65:
        text = rng.choice(["Done.", "I cannot do that.", "", " ", "\n", "Which file do you mean?"])
    elif kind < 0.75:
        text = "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 2000)))  # lone surrogates too
    elif kind < 0.8:
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 3000)))
    else:
        n = rng.choice([2, 100, 3000, 8000])
        text = rng.choice(
            [
                "<tool_call>\n" * n,
                "</tool_call>\n" * n,
                "<tool_call>\n{}</tool_call>" * (n // 4),
                "<think>" + "<tool_call>\n" * n + "</think>",
                "<tool_call>\n" + "[" * n + "\n</tool_call>",
                "<tool_call>\n" + '{"name": "ls", "arguments": {"a": ' * (n // 10) + "\n</tool_call>",
            ]
        )
    if rng.random() < 0.15:
        text = rng.choice(["<think>plan</think>\n", "Sure.\n", "</think>", "<think>"]) + text
    if rng.random() < 0.1:
        text = text[: rng.randint(0, len(text))]  # cut, as at rollout.max_new_tokens
    return text


def known_cases() -> list[str]:
    """The cases that broke a run before: each must be answered, quickly."""
    deep = "<tool_call>\n" + json.dumps({"name": "ls", "arguments": {"a": nested(900)}}) + "\n</tool_call>"
    deep_500 = "<tool_call>\n" + json.dumps({"name": "cd", "arguments": {"folder": nested(500)}}) + "\n</tool_call>"
    signs = "<tool_call>\n" + json.dumps({"name": "ls", "arguments": {"a=" + "-" * 990 + "1, b": 1}}) + "\n</tool_call>"
    deep_string = "<tool_call>\n" + json.dumps({"name": "ls", "arguments": "[" * 5000 + "]" * 5000}) + "\n</tool_call>"
    return [deep, deep_500, signs, deep_string, "<tool_call>\n" * 8000, "<tool_call>\n{}</tool_call>" * 2000]


def instance_cases(task) -> list[str]:
    """One message per instance of the task: every chain after its name (the calls that reached the checker
    before: a forged verdict, a builtin written, a crash)."""
    return [
        "\n".join(block_of(name + chain, {"seal_mini_fuzz": 1} if "update" in chain else {}) for chain in CHAINS)
        for name in instance_names(task)
    ]


def block_of(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


# --- the properties ------------------------------------------------------------------------------------


class Watch:
    """Audit events and the slowest / largest step, with the message that caused them."""

    def __init__(self):
        self.forbidden: tuple = ()
        self.events: list[str] = []
        sys.addaudithook(self.hook)  # hooks cannot be removed; this one is idle outside `watch`

    def hook(self, event: str, args) -> None:
        if event == "open" and args[0] == "<string>":
            # CPython's compiler reads the line of some syntax errors (a keyword repeated) from the file its
            # code names; eval's code is "<string>" in BFCL too, and the error message carries that name
            return
        if self.forbidden and event.startswith(self.forbidden):
            self.events.append(f"{event} {str(args)[:120]}")

    def run(self, forbidden: tuple, fn, *args):
        """fn(*args) with the audit on; returns (result, seconds, bytes allocated beyond the start)."""
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        self.forbidden, started = forbidden, time.perf_counter()
        try:
            return fn(*args), time.perf_counter() - started, tracemalloc.get_traced_memory()[1] - before
        finally:
            self.forbidden = ()


@pytest.fixture(scope="module")
def watch():
    tasks = fuzz_tasks()
    time.strptime("2024", "%Y")  # back ends parse dates: its module is imported lazily, once
    TOOLACE.decode("[ls()]")  # BFCL's LlamaHandler decoder is compiled from its source on first use
    for task in tasks:  # every lazy import, compiled BFCL function and cached reference before the audit starts
        episode = Episode(task)
        play(episode, POLICIES["ground_truth"](task))
        diagnose_turns(episode, check_episode(episode))
    tracemalloc.start()
    yield Watch(), tasks
    tracemalloc.stop()


def wrapped(task, rng: random.Random):
    """The bare episode, or the episode seen through the interface with every cue on (parse_retry too); under
    BFCL's Qwen FC handler, or a third of the time its LlamaHandler (ToolACE-2: Python call lists)."""
    protocol = TOOLACE if rng.random() < 0.3 else QWEN_FC
    episode = Episode(task, max_calls_per_turn=rng.choice([4, 20]), protocol=protocol)
    if rng.random() < 0.5:
        return episode
    return Interface(episode, InterfaceState(True, True, True, list(GUIDELINES)[:3]))


def score(env):
    """The checker's verdict on a finished episode and the diagnoser's labels, as training computes them."""
    verdict = check_episode(env)
    return verdict, diagnose_turns(env, verdict)


def globals_seen(tasks) -> dict[str, dict]:
    """Builtins and every back-end module's globals, by identity: what a call that reached them could write."""
    import builtins
    import importlib

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    classes = {c for task in tasks for c in task.involved_classes}
    modules = {"builtins": builtins} | {c: importlib.import_module(CLASS_FILE_PATH_MAPPING[c]) for c in classes}
    return {name: {k: id(v) for k, v in vars(m).items()} for name, m in modules.items()}


def test_no_message_breaks_a_step_the_checker_or_the_diagnoser(watch):
    audit, tasks = watch
    audit.run(FORBIDDEN, open, os.devnull)[0].close()
    assert audit.events and audit.events.pop().startswith("open"), "the audit hook sees nothing"
    audit.events.clear()
    rng = random.Random(SEED)
    # first every instance of every task addressed by name (an episode each), then the known and random cases
    plan = [(task, instance_cases(task)) for task in tasks] + [(None, known_cases() + [None] * MESSAGES)]
    stats = {"messages": 0, "episodes": 0, "exceptions": [], "slowest": (0.0, ""), "largest": (0, "")}
    problems = []
    seen = globals_seen(tasks)

    def note(what: str, text, seconds: float, grown: int) -> None:
        shown = repr(text[:120]) + (f"... ({len(text)} chars)" if len(text) > 120 else "")
        stats["slowest"] = max(stats["slowest"], (seconds, f"{what} {shown}"))
        stats["largest"] = max(stats["largest"], (grown, f"{what} {shown}"))
        if seconds > STEP_SECONDS or grown > STEP_MB * 2**20:
            problems.append(f"{what}: {seconds:.1f} s, {grown / 2**20:.0f} MB on {shown}")
        if audit.events:
            problems.append(f"{what}: {audit.events[:3]} on {shown}")
            audit.events.clear()
        if globals_seen(tasks) != seen:
            problems.append(f"{what}: a builtin or a back-end module's global changed, on {shown}")

    for fixed, todo in plan:
        while todo:
            task = fixed or tasks[stats["episodes"] % len(tasks)]
            env = Episode(task) if fixed else wrapped(task, rng)
            env.reset()
            stats["episodes"] += 1
            last, broke = "", False
            for _ in range(MESSAGES_PER_EPISODE):
                if not todo or env.done:
                    break
                text = todo.pop(0)
                if text is None:
                    names = [m for m in env.methods if m not in env.offered]  # tools of the task not offered
                    text = message(rng, env.offered, names, instance_names(task), env.protocol is TOOLACE)
                stats["messages"] += 1
                last = text
                what = f"step ({task.id}, seed {SEED}, message {stats['messages']})"
                try:
                    result, seconds, grown = audit.run(FORBIDDEN, env.step, text)
                    parsed, _, _ = audit.run(FORBIDDEN, parse_tool_calls, text)
                    for item in parsed:
                        if not isinstance(item, CallError):
                            validate_call(item, env.offered, env.later)
                except Exception as e:  # noqa: BLE001 - counted and reported below
                    stats["exceptions"].append(f"{what}: {type(e).__name__}: {str(e)[:100]}")
                    broke = True
                    break
                note(what, text if isinstance(text, str) else text.decode("utf-8", "replace"), seconds, grown)
                ran = [e for e in result.events if e.call is not None and e.error_kind is None]
                outside = [e.name for e in ran if e.name not in env.methods]
                assert not outside, f"{what}: ran {outside}, which is no public method of the task's back ends"
            if broke:
                continue
            if not env.done:
                env.truncate()
            what = f"check and diagnosis ({task.id}, seed {SEED}, after message {stats['messages']})"
            # what the episode recorded for the checker is what the checker's own vetting lets through: the
            # refusal is one refusal in the episode, the checker and the diagnoser's replay
            _, replaced = checker_input_for(task, env.checker_input(), CHECKER_MODEL)
            if replaced:
                problems.append(f"{what}: {replaced} recorded calls are not in the checker's form")
            try:
                (verdict, labels), seconds, grown = audit.run(CHECK_FORBIDDEN, score, env)
            except Exception as e:  # noqa: BLE001
                stats["exceptions"].append(f"{what}: {type(e).__name__}: {str(e)[:100]}")
                continue
            note(what, last if isinstance(last, str) else "(bytes)", seconds, grown)
            assert verdict.reward in (0.0, 1.0) and len(labels) == len(task.turns), what
            assert all(d.label in LABELS for d in labels), what
            assert verdict.error_type != CHECKER_RAISED and not any(
                d.reason.startswith(DIAGNOSIS_RAISED) for d in labels
            )

    print(
        f"\n[fuzz] seed {SEED}: {stats['messages']} messages over {stats['episodes']} episodes of {len(tasks)} tasks; "
        f"exceptions {len(stats['exceptions'])}; slowest {stats['slowest'][0]:.2f} s ({stats['slowest'][1][:90]}); "
        f"largest memory growth {stats['largest'][0] / 2**20:.1f} MB ({stats['largest'][1][:90]})"
    )
    assert not stats["exceptions"], stats["exceptions"][:5]
    assert not problems, problems[:5]
