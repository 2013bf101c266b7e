"""BFCL's multi-turn harness as seal_mini plays it: decode a model message, run the decoded calls.

The held-in score must be what BFCL's own inference loop and scorer (bfcl-eval 2026.3.23) give for the same
model output, so both halves follow BFCL step for step. Two BFCL handlers are played (`Protocol`, PROTOCOLS):
the Qwen FC handler's `<tool_call>` format, described below, and the LlamaHandler BFCL's registry runs
ToolACE-2-8B with (`decode_python`, `llama_prompt`: a Python list of calls, BFCL's own system prompt,
compiled from its source with eval() refused). Running the calls is the same for both.

Decoding is BFCL's Qwen handler itself (model_handler/local_inference/qwen_fc.py), and so is the prompt
of `model.tool_format: bfcl` (`bfcl_prompt`, its _format_prompt):
  - `_parse_query_response_prompting` drops everything up to the last </think>;
  - `_extract_tool_calls` finds `<tool_call>\\n...\\n</tool_call>` (the tags on lines of their own)
    and keeps each body that is valid JSON, silently dropping the others (it is given the text up to
    the last closing line: the same blocks, found in linear time);
  - `decode_execute` fails the whole message if one of those is not a JSON object or lacks "name" or
    "arguments", and otherwise writes each call as `name(key=repr(value),...)` (`convert_to_function_call`).
  A message that fails to decode or decodes to no call ends the user turn; the call strings are what
  BFCL's executor runs and its checker scores. Importing those functions' modules would pull in BFCL's
  whole inference stack (tree-sitter parsers, API clients), which the kit does not install, so they are
  compiled from the installed package's source files on their own (`bfcl_function`). decode_execute
  holds an eval() for string items; `decode` refuses any non-object item first (as decode_execute itself
  does before that line), so model text never reaches it.

Running is BFCL's executor (eval_checker/multi_turn_eval/multi_turn_utils.execute_multi_turn_func_call)
without its eval(). Like the executor, `run_call` prefixes every method name in the string with the
global name of the instance that owns it (BFCL's own `_process_method_calls`), refuses the names the
executor refuses, and records either the formatted return value or "Error during execution: <error>".
Instead of eval() it compiles the string (which evaluates nothing and raises exactly what eval would
raise for a syntax error) and reads the syntax tree (`plan_call`). It runs a string only in one of two
shapes whose effect eval would have too:
  - `<instance>.<public method>(key=<literal>, ...)`: the bound method gets those values;
  - a call whose name is defined nowhere (a tool of another back end, an invented one): eval stops
    with a NameError before anything runs, and so does this (same message).
Everything else (a Python builtin, a module's attribute, an instance's name or an attribute chain, an
expression in an argument, positional arguments: code in a name or an argument key) is refused: nothing
runs and the output says so. The checker is given only what cannot reach anything but a tool
(`for_checker`): a call that ran, or `REFUSED_CALL`, which fails the same harmless way; the verifier puts
every input through the same function again under the checker's own instance names. A number is a number,
however large (JSON gives Python ints of up to 4,300 digits, and BFCL runs them); only calls that would
keep the process busy for hours are refused (`GUARDS`). README lists what these refusals change.

Instance names. BFCL writes an instance's global name, which holds the model's name, into any string
argument that mentions a method followed by "(", and a back end may read that string (get_flight_cost
prices by the digits of its date). So the kit runs every episode and every check under the names BFCL
gives the episode's model (its `Protocol`): a verdict is a function of the episode alone.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import inspect
import itertools
import json
import math
import pickle
import re
import types
import typing
import warnings
import weakref
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from seal_mini.envs.bfcl import bfcl_root
from seal_mini.envs.toolcalls import format_call

BFCL_MODEL = "Qwen/Qwen2.5-7B-Instruct"
"""The model whose names BFCL's instances carry in the kit, as BFCL's Qwen FC handler runs it."""
QWEN_HANDLER = "model_handler/local_inference/qwen_fc.py"
LLAMA_HANDLER = "model_handler/local_inference/llama.py"
HANDLER_UTILS = "model_handler/utils.py"
BLOCKED_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
"""Names BFCL's executor refuses before eval (the list in execute_multi_turn_func_call)."""
REFUSED_CALL = "seal_mini_refused_call()"
"""What the checker gets in place of a refused call: a name defined nowhere, so BFCL's eval stops with
a NameError, as for any unknown tool; no state changes and its output matches no reference output."""


@dataclass(frozen=True)
class Protocol:
    """How BFCL plays one model: the handler whose prompt and decoder an episode follows, and the names its
    executor and scorer give the back-end instances (BFCL writes them into strings that mention a method)."""

    name: str
    model: str
    """The model BFCL runs with this handler (its handler's model_name)."""
    registry: str
    """Its name in BFCL's registry, which the scorer runs under."""

    @property
    def instance_prefix(self) -> str:
        """The inference loop's name for the model (model_name_underline_replaced): the episode's instances."""
        return self.model.replace("/", "_").replace("-", "_").replace(".", "_")

    @property
    def checker_model(self) -> str:
        """The scorer's name for the model (eval_runner's: "/" written "_"): the checker's instances."""
        return self.registry.replace("/", "_")

    def decode(self, text: str | bytes) -> Decoded:
        """A model message as this handler's decoder reads it."""
        return decode(text) if self.name == "qwen_fc" else decode_python(text)

    def write(self, calls: list[tuple[str, dict]]) -> str:
        """Calls as a model following this handler writes them (scripted policies)."""
        if self.name == "qwen_fc":
            return "\n".join(format_call(name, arguments) for name, arguments in calls)
        written = (f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})" for name, arguments in calls)
        return f"[{', '.join(written)}]"


QWEN_FC = Protocol("qwen_fc", BFCL_MODEL, f"{BFCL_MODEL}-FC")
"""BFCL's Qwen FC handler: JSON calls in <tool_call> blocks (every recipe but ToolACE-2's)."""
TOOLACE = Protocol("llama_prompt", "Team-ACE/ToolACE-2-8B", "Team-ACE/ToolACE-2-8B")
"""BFCL's LlamaHandler, which its registry runs ToolACE-2-8B with: a Python list of calls, BFCL's own system
prompt, tool results as ipython messages."""
PROTOCOLS = {p.name: p for p in (QWEN_FC, TOOLACE)}
INSTANCE_PREFIX, CHECKER_MODEL = QWEN_FC.instance_prefix, QWEN_FC.checker_model
"""The names of BFCL_MODEL's instances in an episode and in the checker."""


# --- decoding: BFCL's Qwen handler ------------------------------------------------------------------


def bfcl_function(path: str, name: str, owner: str, namespace: dict):
    """One function of the installed bfcl-eval, compiled from its source file alone into `namespace`: a
    method of class `owner` ("" for a module-level one), its decorators left off (the caller binds it)."""
    file = bfcl_root() / path
    tree = ast.parse(file.read_text(), filename=str(file))
    scope = tree.body
    if owner:
        scope = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), [])
    node = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise ImportError(
            f"bfcl-eval's {path} has no {owner + '.' if owner else ''}{name}: is bfcl-eval 2026.3.23 installed?"
        )
    node.decorator_list = []
    code = compile(ast.Module(body=[node], type_ignores=[]), str(file), "exec")
    exec(code, namespace)  # noqa: S102 - bfcl-eval's own source code, never model text
    return namespace[name]


@cache
def _qwen():
    """An object with the QwenFCHandler methods decoding and prompting use (they read nothing else of self)."""
    namespace = {"json": json, "re": re, "Any": Any}
    bfcl_function(HANDLER_UTILS, "convert_to_function_call", "", namespace)
    methods = {
        name: bfcl_function(QWEN_HANDLER, name, "QwenFCHandler", namespace)
        for name in ("_parse_query_response_prompting", "decode_execute", "_format_prompt")
    }
    extract = bfcl_function(QWEN_HANDLER, "_extract_tool_calls", "QwenFCHandler", namespace)
    methods["_extract_tool_calls"] = staticmethod(lambda text: extract(_through_last_close(text)))
    return type("QwenDecoding", (), methods)()


CLOSE_LINE = "\n</tool_call>"


def _through_last_close(text: str) -> str:
    """The text up to its last closing line. BFCL's pattern (`<tool_call>\\n(.*?)\\n</tool_call>`) finds the
    same blocks in it (an opening tag with no closing line after it never matches), reading it once instead
    of scanning to the end from each unclosed tag (quadratic: 96 KB of unclosed tags took 40 s)."""
    end = text.rfind(CLOSE_LINE)
    return text[: end + len(CLOSE_LINE)] if end >= 0 else ""


@dataclass
class Decoded:
    """One assistant message as BFCL's harness reads it."""

    text: str
    """The message as BFCL keeps it (after a <think> block, if any): the answer BFCL V4 scores."""
    calls: list[str]
    """BFCL's call strings, in order: what its executor runs and its checker scores."""
    items: list[dict]
    """The JSON object behind each call string."""
    error: str = ""
    """Why the message did not decode ("" if it did)."""

    @property
    def ends_turn(self) -> bool:
        """BFCL's inference loop ends the user turn on a message that fails to decode or decodes to no call."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

        return bool(self.error) or is_empty_execute_response(self.calls)


def _parsed(text: str) -> dict:
    """BFCL's Qwen handler's reading of a completion (_parse_query_response_prompting)."""
    response = SimpleNamespace(
        choices=[SimpleNamespace(text=text)], usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0)
    )
    return _qwen()._parse_query_response_prompting(response)


def decode(text: str | bytes) -> Decoded:
    """Decode a model message with BFCL's Qwen handler (see the module docstring)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    qwen = _qwen()
    cleaned = _parsed(text)["model_responses"]
    items = qwen._extract_tool_calls(cleaned)
    if any(type(item) is not dict for item in items):  # decode_execute raises here too, before its eval()
        return Decoded(cleaned, [], [], "a <tool_call> block holds JSON that is not an object")
    try:
        calls = qwen.decode_execute(cleaned, has_tool_call_tag=False)
    except Exception as e:  # BFCL ends the turn on any decoding error
        return Decoded(cleaned, [], [], f"the calls could not be decoded ({type(e).__name__}: {e})")
    return Decoded(cleaned, calls, items)


def bfcl_prompt(messages: list[dict], tools: list[dict]) -> str:
    """The prompt BFCL's Qwen FC handler writes for a conversation (its own _format_prompt), ending with the
    start of the next assistant message. Each assistant message is given as BFCL's chat history keeps it:
    the calls it extracted, or else the text after any </think>; tools as given (a BFCL task's docs)."""
    history = []
    for m in messages:
        if m["role"] == "assistant":
            history.append(_parsed(m["content"])["model_responses_message_for_chat_history"])
        else:
            history.append({"role": m["role"], "content": m["content"]})
    return _qwen()._format_prompt(history, tools)


def unwritable(text: str | bytes) -> str:
    """Why BFCL's Qwen handler cannot write this message back into a prompt ("" if it can): its chat history
    keeps every <tool_call> block that is valid JSON, and _format_prompt fails on one that is not an object
    with a string "name" and an "arguments" key. BFCL's inference of the entry then stops with that error."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        _qwen()._format_prompt([_parsed(text)["model_responses_message_for_chat_history"]], [])
    except Exception as e:  # noqa: BLE001 - whatever BFCL's own code raises there
        return f"{type(e).__name__}: {e}"
    return ""


# --- decoding and prompting: BFCL's Llama handler (ToolACE-2) --------------------------------------


def _no_eval(source: str, *args, **kwargs):
    """Stands in for eval() in BFCL's Python-call decoder, which evals an argument written as an operation
    or a lambda (`1 + 2`, `lambda: ...`): the kit evaluates no model text, so the message fails to decode."""
    raise ValueError(f"an argument is an expression, not a literal value ({str(source)[:60]})")


@cache
def _llama():
    """BFCL's prompt-mode system prompt, Python-call decoder and LlamaHandler._format_prompt, compiled from
    its source files (the modules import BFCL's inference stack), with eval() refused."""
    from bfcl_eval.constants import default_prompts
    from bfcl_eval.constants.enums import ReturnFormat

    prompts = {k: v for k, v in vars(default_prompts).items() if not k.startswith("_")}
    namespace = {**prompts, "ast": ast, "json": json, "re": re, "ReturnFormat": ReturnFormat, "eval": _no_eval}
    namespace |= {"Optional": typing.Optional, "List": list, "Union": typing.Union}
    for name in (
        "resolve_ast_by_type",
        "resolve_ast_call",
        "ast_parse",
        "default_decode_ast_prompting",
        "parse_nested_value",
        "decoded_output_to_execution_list",
        "parse_prompt_variation_params",
        "_generate_function_doc_python",
        "_generate_function_doc_xml",
        "format_function_doc",
        "formulate_system_prompt",
        "system_prompt_pre_processing_chat_model",
    ):
        bfcl_function(HANDLER_UTILS, name, "", namespace)
    bfcl_function("utils.py", "extract_prompt_format_from_id", "", namespace)
    format_prompt = bfcl_function(LLAMA_HANDLER, "_format_prompt", "LlamaHandler", namespace)
    handler = SimpleNamespace(model_name=TOOLACE.model)
    namespace["format_prompt"] = lambda messages: format_prompt(handler, messages, [])
    return SimpleNamespace(**namespace)


def decode_python(text: str | bytes) -> Decoded:
    """Decode a message as BFCL's LlamaHandler does (default_decode_execute_prompting: the text, stripped of
    backticks, newlines and spaces and put in brackets, parsed as a Python list of calls; keyword arguments
    only), with its own code, except that an argument it would eval() fails the message instead."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    llama = _llama()
    try:
        parsed = llama.default_decode_ast_prompting(text)  # decode_execute's own first step
        calls = llama.decoded_output_to_execution_list(parsed)
    except Exception as e:  # noqa: BLE001 - BFCL ends the turn on any decoding error
        return Decoded(text, [], [], f"the calls could not be decoded ({type(e).__name__}: {str(e)[:200]})")
    items = [{"name": name, "arguments": arguments} for call in parsed for name, arguments in call.items()]
    return Decoded(text, calls, items)


def llama_prompt(messages: list[dict], tools: list[dict]) -> str:
    """The prompt BFCL's LlamaHandler writes for a conversation, ending with the start of the next assistant
    message: its system prompt (the tools as BFCL's docs, in JSON) before the first message, a task's own
    system message after it, assistant messages as written, tool results as ipython messages."""
    llama = _llama()
    history = [{"role": "ipython" if m["role"] == "tool" else m["role"], "content": m["content"]} for m in messages]
    # BFCL prepends its system prompt to the first turn's messages only
    first = next((k for k, m in enumerate(history) if m["role"] not in ("system", "user")), len(history))
    history = llama.system_prompt_pre_processing_chat_model(history[:first], tools, "") + history[first:]
    return llama.format_prompt(history)


# --- why a <tool_call> block was not read (for the diagnoser and the training interface) ---------

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]{1,80})"')


def _block_problem(body: str, closed: bool) -> str:
    if not closed:
        return "<tool_call> is never closed with </tool_call>"
    if not (body.startswith("\n") and body.endswith("\n")):
        return "the tags are not on lines of their own: write <tool_call>, a newline, the JSON, a newline, </tool_call>"
    inner = body[1:-1]
    if inner.lstrip().startswith("```"):
        return "a code fence inside the block: put only the JSON object between the tags"
    try:
        obj = json.loads(inner)
    except (ValueError, RecursionError) as e:
        extra = " (one JSON object per block; use one block per call)" if "Extra data" in str(e) else ""
        return f"the block is not valid JSON: {str(e)[:80]}{extra}"
    if not isinstance(obj, dict):
        return "the block must hold one JSON object"
    missing = [k for k in ("name", "arguments") if k not in obj]
    if missing:
        return f"the call has no {' or '.join(repr(k) for k in missing)}"
    return ""


def unread_blocks(decoded: Decoded) -> list[tuple[str | None, str]]:
    """(tool name if readable, problem) for each <tool_call> block of a message BFCL's decoder did not
    turn into a call. BFCL drops such blocks without a word; the kit records them as evidence."""
    out = []
    for m in _BLOCK.finditer(decoded.text):
        body, closed = m.group(1), m.group(0).endswith("</tool_call>")
        problem = _block_problem(body, closed)
        if problem or decoded.error:
            name = _NAME.search(body)
            out.append((name.group(1) if name else None, problem or decoded.error))
    if decoded.error and not out:
        out.append((None, decoded.error))
    return out


# --- running: BFCL's executor without eval ----------------------------------------------------------


def instance_name(prefix: str, task_id: str, class_name: str) -> str:
    """The global name BFCL's executor gives a back-end instance (prefix = the model name)."""
    return re.sub(r"[-./:]", "_", f"{prefix}_{task_id}_{class_name}_instance")


@cache
def bfcl_class(class_name: str) -> type:
    """The back-end class of that name: BFCL's (TwitterAPI, GorillaFileSystem, ...), or a recipe's own, which
    seal_mini.envs.world registers in the same table of BFCL's (the one its executor reads too)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


MUTABLE = (list, dict, set)


def _code_names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the code nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@cache
def _module_tree(module_name: str) -> ast.Module | None:
    path = getattr(importlib.import_module(module_name), "__file__", None) or ""
    return ast.parse(Path(path).read_text(encoding="utf-8")) if path.endswith(".py") else None


@cache
def source_literals(module_name: str) -> dict[str, object]:
    """The names a module's source binds to literal values at its top level, and those it imports by name
    from a module of its own package (read the same way): the values a fresh process starts with, however
    this process has changed them since."""
    tree = _module_tree(module_name)
    values: dict[str, object] = {}
    touched: set[str] = set()  # names a later top-level statement uses (CATALOG["x"] = 3, X.update(...))
    for node in tree.body if tree else []:
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else node
            touched |= {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} if value is not None else set()
            if isinstance(node, ast.Assign):  # a target other than a plain name: X["k"] = ..., X.a = ...
                targets = [t for t in node.targets if not isinstance(t, ast.Name)]
                touched |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == module_name.split(".")[0]:
                source = source_literals(node.module)
                values.update({a.asname or a.name: source[a.name] for a in node.names if a.name in source})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                try:
                    values[targets[0].id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    values.pop(targets[0].id, None)
    # what the top level builds on or changes is taken as first seen here, not from the source
    return {name: value for name, value in values.items() if name not in touched}


def _source_defaults(fn: types.FunctionType) -> tuple:
    """A function's default arguments as its source writes them (literals), else as first seen here."""
    node = _module_tree(fn.__module__)
    for part in fn.__qualname__.split("."):
        body = node.body if node else []
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
    written = node.args.defaults if isinstance(node, ast.FunctionDef) else []
    out = []
    for value, source in zip(fn.__defaults__, [None] * (len(fn.__defaults__) - len(written)) + written, strict=True):
        try:
            out.append(ast.literal_eval(source) if source is not None else copy.deepcopy(value))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            out.append(copy.deepcopy(value))
    return tuple(out)


@cache
def first_defaults(cls: type) -> dict[str, tuple]:
    """Method name -> its default arguments, for each method of a back-end class with a mutable default
    (TwitterAPI.post_tweet(tags=[], mentions=[])): as its source writes them, so they are what a fresh
    process starts with, whatever ran in this one (BFCL's own TwitterAPI may have grown them)."""
    return {name: _source_defaults(fn) for name, (_, fn) in _methods(cls).items() if _mutable_default(fn)}


@dataclass
class _FreshPlan:
    """What a back-end class needs to start as in a fresh process (see fresh_class)."""

    methods: dict[str, tuple[type, types.FunctionType]]
    """Methods (own or inherited; plain, static or class methods, with their wrapper type) that read a
    mutable module global, or call a module function that does, or have a mutable default."""
    helpers: dict[str, dict[str, types.FunctionType]]
    """Per module: its top-level functions those methods reach (rebuilt beside the fresh data)."""
    data: dict[str, bytes]
    """Per module: its mutable globals those functions read, as a fresh process has them (pickled)."""


def _mutable_default(fn: types.FunctionType) -> bool:
    return any(isinstance(d, MUTABLE) for d in fn.__defaults__ or ())


def _reads_data(fn: types.FunctionType) -> set[str]:
    return {n for n in _code_names(fn.__code__) if isinstance(fn.__globals__.get(n), MUTABLE)}


@cache
def _reached(fn: types.FunctionType) -> tuple[types.FunctionType, ...]:
    """fn and the functions of its own module it calls, and those they call, ..."""
    out, todo = [fn], [fn]
    while todo:
        for name in _code_names(todo.pop().__code__):
            f = fn.__globals__.get(name)
            if isinstance(f, types.FunctionType) and f.__module__ == fn.__module__ and f not in out:
                out.append(f)
                todo.append(f)
    return tuple(out)


@cache
def _touches_data(fn: types.FunctionType) -> bool:
    """fn, or a function of its module it reaches, reads a mutable module global."""
    return any(_reads_data(f) for f in _reached(fn))


def _methods(cls: type) -> dict[str, tuple[type, types.FunctionType]]:
    """name -> (wrapper: staticmethod, classmethod or FunctionType, function) of every method the class has,
    the nearest definition in its MRO."""
    out = {}
    for klass in reversed(cls.__mro__[:-1]):  # object's own are not back-end code
        for name, raw in vars(klass).items():
            if isinstance(raw, (staticmethod, classmethod)) and isinstance(raw.__func__, types.FunctionType):
                out[name] = (type(raw), raw.__func__)
            elif isinstance(raw, types.FunctionType):
                out[name] = (types.FunctionType, raw)
    return out


@cache
def _fresh_plan(cls: type) -> _FreshPlan:
    methods, helpers, names = {}, {}, {}
    for name, (kind, fn) in _methods(cls).items():
        reached = _reached(fn)
        reads = set().union(*(_reads_data(f) for f in reached))
        if reads or _mutable_default(fn):
            methods[name] = (kind, fn)
            names.setdefault(fn.__module__, set()).update(reads)
            # the helpers on a path to the data, rebuilt beside it; the others may stay as they are
            helpers.setdefault(fn.__module__, {}).update({f.__name__: f for f in reached[1:] if _touches_data(f)})
    data = {}
    for module, wanted in names.items():
        if wanted:
            g, literal = vars(importlib.import_module(module)), source_literals(module)
            data[module] = pickle.dumps({n: literal.get(n, g[n]) for n in wanted}, protocol=pickle.HIGHEST_PROTOCOL)
    return _FreshPlan(methods, helpers, data)


def _rebuilt(fn: types.FunctionType, namespace: dict, defaults: tuple | None) -> types.FunctionType:
    """fn over another global namespace, with fresh copies of `defaults`."""
    out = types.FunctionType(fn.__code__, namespace, fn.__name__, copy.deepcopy(defaults), fn.__closure__)
    out.__qualname__, out.__doc__, out.__kwdefaults__ = fn.__qualname__, fn.__doc__, copy.deepcopy(fn.__kwdefaults__)
    out.__module__ = fn.__module__
    return out


def fresh_class(class_name: str) -> type:
    """A back-end class as a fresh process has it, for one episode or one check.

    Two things are one object for a whole process. A default argument: post_tweet stores its `mentions`
    default in the tweet, and mention() later extends it, so one episode's mentions would show up in every
    later tweet posted without any. Module data: TravelAPI puts long_context.py's credit cards into each
    instance as they are, so one episode's booking would drain the balance every later episode sees. A
    class whose methods read either gets a subclass of its own whose methods start from fresh copies (its
    defaults as the source writes them, its module data as the source writes it), shared by everything of
    the one episode or check, as in one fresh process (BFCL's checker gives the model's and the ground
    truth's instances the same module data); any other class is the class itself."""
    return fresh_subclass(bfcl_class(class_name))


def fresh_subclass(cls: type) -> type:
    """fresh_class of a class at hand."""
    plan = _fresh_plan(cls)
    if not plan.methods:
        return cls
    namespaces = {}
    for module, blob in plan.data.items():  # one fresh namespace per module, its helpers rebuilt in it
        namespace = dict(vars(importlib.import_module(module)))
        namespace.update(pickle.loads(blob))
        for name, fn in plan.helpers.get(module, {}).items():
            namespace[name] = _rebuilt(fn, namespace, fn.__defaults__)
        namespaces[module] = namespace
    defaults = first_defaults(cls)
    methods = {}
    for name, (kind, fn) in plan.methods.items():
        namespace = namespaces.get(fn.__module__, fn.__globals__)
        rebuilt = _rebuilt(fn, namespace, defaults.get(name, fn.__defaults__))
        methods[name] = rebuilt if kind is types.FunctionType else kind(rebuilt)
    # the same module and name as the class: it reads as that class everywhere (and shares its method list);
    # pickled (the diagnoser copies back ends so), an instance comes back as one of this very class
    key = f"{cls.__name__}:{next(_FRESH_COUNT)}"
    fresh = type(
        cls.__name__,
        (cls,),
        {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__reduce_ex__": _reduce_fresh, **methods},
    )
    fresh._fresh_key = key
    _FRESH_CLASSES[key] = fresh
    return fresh


_FRESH_CLASSES: weakref.WeakValueDictionary[str, type] = weakref.WeakValueDictionary()
"""The fresh classes alive in this process, by key: how a pickled instance of one finds its class again."""
_FRESH_COUNT = itertools.count()


def _fresh_instance(key: str):
    cls = _FRESH_CLASSES[key]
    return cls.__new__(cls)


def _reduce_fresh(self, protocol: int):
    state = self.__getstate__() if hasattr(self, "__getstate__") else dict(vars(self))  # 3.11+ / 3.10
    return _fresh_instance, (type(self)._fresh_key,), state


_METHOD_NAMES: dict[tuple[str, str], tuple[str, ...]] = {}


def public_method_names(instance: object) -> tuple[str, ...]:
    """The public method names BFCL's executor maps for an instance (listed once per class: a fresh
    class shares its BFCL class's entry)."""
    cls = type(instance)
    key = (cls.__module__, cls.__qualname__)
    if key not in _METHOD_NAMES:
        members = inspect.getmembers(instance, predicate=inspect.ismethod)
        _METHOD_NAMES[key] = tuple(name for name, _ in members if not name.startswith("_"))
    return _METHOD_NAMES[key]


def method_owners(scope: dict[str, object]) -> dict[str, str]:
    """Public method name -> the instance name that owns it, as BFCL's executor maps them (a later
    class wins a shared name). `scope` is {instance name: instance}."""
    owners = {}
    for name, instance in scope.items():
        owners.update(dict.fromkeys(public_method_names(instance), name))
    return owners


def _guard_power(a: dict) -> str:
    base, exponent = a.get("base"), a.get("exponent")
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log2(abs(base)) > 2**20:
            return "power: an integer result of more than a million bits"
    return ""


def _guard_precision(a: dict) -> str:
    """mpmath and decimal take a precision as an int, a float or a digit string, and a number as a string of
    any length (`"1e" + "9" * 3000` takes seconds a call)."""
    precision = a.get("precision")
    if isinstance(precision, (int, float, str)) and not isinstance(precision, bool):
        try:
            if float(precision) > 10_000:
                return "precision above 10000 digits"
        except ValueError:  # not a number: the back end answers with its own error
            pass
    if any(isinstance(a.get(key), str) and len(a[key]) > 100 for key in ("value", "base", "number")):
        return "a number written in more than 100 characters"
    return ""


def _guard_round(a: dict) -> str:
    places, number = a.get("decimal_places"), a.get("number")
    if isinstance(number, int) and isinstance(places, int) and places < -10_000:
        return "rounding an integer to more than 10000 places"
    return ""


GUARDS = {
    "power": _guard_power,
    "logarithm": _guard_precision,
    "square_root": _guard_precision,
    "round_number": _guard_round,
}
"""Back-end methods that a legal call can keep busy for hours (big-integer powers, precision settings):
such calls are refused. BFCL would run them; where they finish, their result is an error or a number no
reference output has, so the verdict is the same."""


class _Refuse(Exception):
    """The call is not one the kit runs (see plan_call)."""


class _Raise(Exception):
    """Evaluating the call would raise this error before anything runs."""


@dataclass
class Plan:
    """What eval() of one call string would do, read off its syntax tree."""

    kind: str
    """call (run a public method) | error (eval raises before anything runs) | refused (not run)."""
    name: str = ""
    """The called name (the method name for kind call)."""
    owner: str = ""
    """kind call: the instance name that owns the method."""
    arguments: dict = field(default_factory=dict)
    """kind call: the keyword values."""
    error: str = ""
    """kind error: the message eval's exception carries; kind refused: why it is not run."""


def _defined(name: str, owners: dict[str, str]) -> bool:
    """Whether a bare name means something where BFCL's executor evals: its module, builtins, the
    instances of `owners`. Other instances come and go in that module while checks run (the checker's
    are placed there for the length of one check), so no name ending in `_instance` counts unless it is
    one of `owners`': what a name means never depends on what else the process ran."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    if name in owners.values():
        return True
    return hasattr(builtins, name) or (name in vars(multi_turn_utils) and not name.endswith("_instance"))


def _literal(node: ast.AST, owners: dict[str, str]):
    """The value of an argument eval would compute, built without eval. Only what JSON repr() gives:
    constants, lists, tuples, sets, dicts, a sign on a number, and the names inf / nan that repr writes
    for non-finite floats (evaluating those raises a NameError, as there)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if _defined(node.id, owners):
            raise _Refuse(f"the argument {node.id!r} is not a literal value")
        raise _Raise(f"name '{node.id}' is not defined")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = [_literal(e, owners) for e in node.elts]
        try:
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](values)
        except TypeError as e:  # an unhashable set member: eval raises the same
            raise _Raise(str(e)) from None
    if isinstance(node, ast.Dict) and None not in node.keys:
        out = {}
        for k, v in zip(node.keys, node.values, strict=True):  # eval order: each key, then its value
            key, value = _literal(k, owners), _literal(v, owners)
            try:
                out[key] = value
            except TypeError as e:
                raise _Raise(str(e)) from None
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, owners)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else +value
    raise _Refuse("an argument is an expression, not a literal value")


def plan_call(processed: str, owners: dict[str, str]) -> Plan:
    """What eval() of a call string (already through BFCL's _process_method_calls) would do, where `owners`
    is the executor's method -> instance name map."""
    head = processed.split("(")[0] if "(" in processed else processed
    if "." in head:
        head = head.split(".")[1]
    if head in BLOCKED_NAMES:
        return Plan("error", head, error=f"Function call {head} is not allowed.")
    source = processed.lstrip(" \t")  # eval() strips leading spaces and tabs of a string
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning: 'int' object is not callable
            compile(source, "<string>", "eval", dont_inherit=True)  # eval's own first step; runs nothing
    except Exception as e:  # noqa: BLE001 - eval raises exactly this
        return Plan("error", head, error=str(e))
    body = ast.parse(source, mode="eval").body
    if not isinstance(body, ast.Call):
        return Plan("refused", head, error="the call is an expression, not a tool call")
    root = body.func
    while isinstance(root, ast.Attribute):
        root = root.value
    func = body.func
    is_method = (
        isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and owners.get(func.attr) == func.value.id
    )
    if not is_method:
        if isinstance(root, ast.Name) and not _defined(root.id, owners):
            return Plan("error", root.id, error=f"name '{root.id}' is not defined")  # before any argument
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", head)
        return Plan("refused", called, error=f"{called!r} is not a tool of this task, so the call was not run")
    name = func.attr
    if body.args or any(k.arg is None for k in body.keywords):
        return Plan("refused", name, error=f"{name}: only keyword arguments are run")
    try:
        arguments = {k.arg: _literal(k.value, owners) for k in body.keywords}
    except _Raise as e:
        return Plan("error", name, error=str(e))
    except _Refuse as e:
        return Plan("refused", name, error=f"{name}: {e}, so the call was not run")
    except RecursionError:  # e.g. a thousand signs before a number, which compile() still accepts
        return Plan("refused", name, error=f"{name}: an argument nests too deep, so the call was not run")
    costly = GUARDS.get(name, lambda a: "")(arguments)
    if costly:
        return Plan("refused", name, error=f"{costly}, so the call was not run")
    return Plan("call", name, func.value.id, arguments)


def format_output(result) -> str:
    """A back end's return value as BFCL's executor records it: strings as is, dicts as JSON, the rest str()."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except Exception:  # noqa: BLE001 - BFCL falls back to str() on any failure
            return str(result)
    return str(result)


def for_checker(call: str, plan: Plan) -> str:
    """The string the checker is given for a decoded call with this plan: the call itself when it runs a
    public method of the task's back ends with literal values (its name is then a bare tool name), the
    name alone when BFCL's executor refuses that name before eval (`kill()`: the same refusal there), and
    REFUSED_CALL for everything else. So no model text but a tool call with literal values ever reaches
    the checker's eval: not an instance name, an attribute chain, a builtin, nor an unknown name (which
    the checker could find defined, since its own instances sit in the module it evals in). A verdict
    cannot change by it: the checker compares the ground truth's outputs and state, and no ground-truth
    call ends in a NameError, a syntax error or a refusal."""
    if plan.kind == "call":
        return call
    if plan.kind == "error" and plan.name in BLOCKED_NAMES:
        return f"{plan.name}()"
    return REFUSED_CALL


@dataclass
class Outcome:
    """What running one decoded call did."""

    plan: Plan
    output: str
    """The execution result BFCL records (and shows the model)."""
    checker_call: str
    """The string the checker gets for this call (`for_checker`): the decoded call, or a stand-in."""
    result: Any = None
    """The back end's return value (kind call, if it returned)."""
    raised: Exception | None = None
    """The exception the back end raised (kind call), if any."""


def run_call(call: str, scope: dict[str, object], owners: dict[str, str]) -> Outcome:
    """Run one decoded call string on the instances in `scope` ({instance name: instance}) as BFCL's
    executor would, without eval (see the module docstring)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import _process_method_calls

    plan = plan_call(_process_method_calls(call, owners), owners)
    if plan.kind != "call":
        return Outcome(plan, f"Error during execution: {plan.error}", for_checker(call, plan))
    method = getattr(scope[plan.owner], plan.name)
    try:
        # fresh values: a back end keeps (and may later grow) the lists it is given
        result = method(**copy.deepcopy(plan.arguments))
        return Outcome(plan, format_output(result), call, result=result)
    except Exception as e:  # noqa: BLE001 - the back end's own errors are results, as in BFCL
        return Outcome(plan, f"Error during execution: {e}", call, raised=e)


@cache
def _class_methods(class_name: str) -> tuple[str, ...]:
    """Public method names of a back-end class, from a bare instance of it."""
    return public_method_names(bfcl_class(class_name)())


def checker_input_for(task, checker_input: list[list[list[str]]], model_name: str) -> tuple[list, int]:
    """(the checker input with every call put through `for_checker` under `model_name`'s instance names,
    how many calls that changed). The episode records calls in that form already, so the count is 0
    unless an input came from elsewhere; either way the checker evals nothing else."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import _process_method_calls

    owners = {}
    for class_name in task.involved_classes:
        owner = instance_name(f"{model_name}_eval", task.id, class_name)
        owners.update(dict.fromkeys(_class_methods(class_name), owner))
    changed = 0
    out = []
    for turn in checker_input:
        out.append([])
        for step in turn:
            vetted = [for_checker(call, plan_call(_process_method_calls(call, owners), owners)) for call in step]
            changed += sum(a != b for a, b in zip(step, vetted, strict=True))
            out[-1].append(vetted)
    return out, changed
