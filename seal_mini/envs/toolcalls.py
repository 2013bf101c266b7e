"""The kit's own parser and schema check for tool calls in a model message. Model text is untrusted input.

BFCL episodes decode messages with BFCL's own handler (seal_mini.envs.harness); this module serves where
the kit defines the protocol itself (tau2), and names the schema problems of BFCL calls for the diagnoser
and the training interface (`validate_call`). The format is the Qwen/Hermes one: each call is a JSON object
{"name": ..., "arguments": {...}} inside <tool_call></tool_call>, several per message allowed. Nothing here
evaluates text: JSON is parsed with the json module under size and depth limits, names are checked against
the offered tools, arguments against their JSON schema. A call that passes becomes a `ToolCall`; one that
does not becomes a `CallError` whose message names the problem (it goes back to the model as an observation).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALL_CHARS = 20_000
"""A single call's JSON may not exceed this; BFCL's longest reference call is far below it."""
MAX_DEPTH = 8
"""Nesting depth allowed in a call's JSON (BFCL arguments nest at most 3 deep)."""
MAX_STRING_CHARS = 10_000
"""Longest string argument accepted."""
MAX_INT = 2**53
"""Largest integer magnitude the kit's own protocol (tau2) accepts; BFCL episodes run any integer."""
MAX_CALLS_PER_MESSAGE = 64
"""Calls one message may make (BFCL's longest reference turn has 34)."""

_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass
class ToolCall:
    """A parsed call that fits the offered tools well enough to run. Some of BFCL's reference calls break the
    published schema (a string id where the doc says integer; a held-out tool used before its reveal), so
    soft problems do not block a call; they are recorded in `violation`."""

    name: str
    arguments: dict
    violation: str = ""
    """Empty, or wrong_type | not_in_enum | not_offered."""
    message: str = ""


@dataclass
class CallError:
    """A call that could not be parsed or does not fit the offered tools."""

    kind: str
    """parse | unknown_tool | arguments."""
    message: str
    name: str | None = None
    violation: str = ""
    """For arguments: missing_required | unknown_argument | wrong_type | not_in_enum | too_large."""


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(f"duplicate key {k!r}")
        seen[k] = v
    return seen


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _depth(text: str) -> int:
    """Bracket depth outside strings, checked before json.loads so deep nesting never recurses."""
    depth = worst = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            worst = max(worst, depth)
        elif ch in "]}":
            depth -= 1
    return worst


def _parse_block(body: str) -> dict | CallError:
    text = body.strip()
    if not text:
        return CallError("parse", "empty <tool_call> block: put one JSON object with name and arguments inside")
    if len(text) > MAX_CALL_CHARS:
        return CallError("parse", f"tool call is {len(text)} characters; the limit is {MAX_CALL_CHARS}")
    if _depth(text) > MAX_DEPTH:
        return CallError("parse", f"tool call JSON nests deeper than {MAX_DEPTH} levels")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKey as e:
        return CallError("parse", f"tool call JSON has a {e}")
    except (json.JSONDecodeError, ValueError) as e:
        return CallError("parse", f"tool call is not valid JSON ({e})")
    if not isinstance(obj, dict):
        return CallError("parse", 'tool call must be a JSON object {"name": ..., "arguments": {...}}')
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return CallError("parse", f'tool call has unexpected keys {extra}; only "name" and "arguments"')
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError("parse", 'tool call needs a string "name"')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments object as a JSON string
        if _depth(arguments) > MAX_DEPTH:
            return CallError(
                "parse", f'"arguments" is a string whose JSON nests deeper than {MAX_DEPTH} levels', name=name
            )
        try:
            arguments = json.loads(arguments, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except (json.JSONDecodeError, ValueError) as e:
            return CallError("parse", f'"arguments" is a string that is not a JSON object ({e})', name=name)
    if not isinstance(arguments, dict):
        return CallError("parse", '"arguments" must be a JSON object', name=name)
    return {"name": name, "arguments": arguments}


def parse_tool_calls(text: str | bytes) -> list[dict | CallError]:
    """Every <tool_call> block of a message, in order: {"name", "arguments"} or a CallError; an empty list
    means the message makes no call (it ends the user turn)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return [CallError("parse", f"message is not valid UTF-8 ({e.reason} at byte {e.start})")]
    closed = text.rfind(CLOSE) + len(CLOSE) if CLOSE in text else 0
    # only the text up to the last closing tag: the same blocks, but the regex no longer rescans the rest of
    # the message from every unclosed tag (quadratic time)
    out: list[dict | CallError] = [_parse_block(m.group(1)) for m in _BLOCK.finditer(text, 0, closed)]
    tail = text[closed:]
    if OPEN in tail:  # an opened block that never closes (e.g. generation stopped mid-call)
        out.append(CallError("parse", f"{OPEN} is never closed with {CLOSE}"))
    if len(out) > MAX_CALLS_PER_MESSAGE:
        out = out[:MAX_CALLS_PER_MESSAGE] + [
            CallError("parse", f"more than {MAX_CALLS_PER_MESSAGE} calls in one message; the rest were ignored")
        ]
    return out


def _type_ok(value, schema_type) -> bool:
    if schema_type is None:
        return True
    types = schema_type if isinstance(schema_type, list) else [schema_type]
    for t in types:
        allowed = _JSON_TYPES.get(t)
        if allowed is None:
            return True  # a type we do not model: do not reject
        if isinstance(value, bool) and t in ("integer", "number"):
            continue  # JSON true is not a number
        if isinstance(value, allowed):
            return True
    return False


def _size_problem(value, depth: int = 0) -> str | None:
    if depth > MAX_DEPTH:  # checked before descending: a value nested a thousand deep never recurses
        return f"values nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        return f"a string of {len(value)} characters (limit {MAX_STRING_CHARS})"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"an integer beyond +-2**53 ({str(value)[:20]}...)"
    if isinstance(value, float) and value != value:  # NaN cannot come from strict JSON, but be safe
        return "NaN"
    if isinstance(value, list):
        return next((p for v in value if (p := _size_problem(v, depth + 1))), None)
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _size_problem(v, depth + 1))), None)
    return None


def validate_call(
    parsed: dict, tools: dict[str, dict], later_tools: dict[str, dict] | None = None, limits: bool = True
) -> ToolCall | CallError:
    """Check a parsed call against the offered tools ({name: chat-tool dict}, JSON-schema form).

    Hard errors: a name no tool has, missing required or unknown arguments (the call would only raise a
    TypeError), values over the size limits (unless `limits` is off). Soft problems: wrong JSON types,
    values outside an enum, a tool of the task that is not offered yet. The BFCL environment runs every
    decoded call regardless, as BFCL does (any value size included), and uses this only to flag schema
    problems for the diagnoser; tau2 refuses hard errors before they reach its tools."""
    name, arguments = parsed["name"], parsed["arguments"]
    later_tools = later_tools or {}
    if name not in tools and name not in later_tools:
        shown = name if len(name) <= 60 else name[:60] + "..."
        return CallError("unknown_tool", f"no tool named {shown!r} is offered; call only the listed tools")
    schema = (tools.get(name) or later_tools[name])["function"]["parameters"]
    props = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        return CallError("arguments", f"{name}: missing required argument(s) {missing}", name, "missing_required")
    unknown = [a for a in arguments if a not in props]
    if unknown:
        return CallError(
            "arguments", f"{name}: unknown argument(s) {unknown}; it takes {sorted(props)}", name, "unknown_argument"
        )
    for arg, value in arguments.items():
        problem = _size_problem(value) if limits else None
        if problem:
            return CallError("arguments", f"{name}: argument {arg!r} holds {problem}", name, "too_large")
    if name not in tools:
        return ToolCall(name, dict(arguments), "not_offered", f"{name} is not among the tools offered so far")
    for arg, value in arguments.items():
        spec = props[arg]
        item_type = spec.get("items", {}).get("type") if isinstance(spec.get("items"), dict) else None
        if not _type_ok(value, spec.get("type")) or (
            isinstance(value, list) and item_type and not all(_type_ok(v, item_type) for v in value)
        ):
            message = f"{name}: argument {arg!r} should be of type {spec.get('type')}, got {type(value).__name__}"
            return ToolCall(name, dict(arguments), "wrong_type", message)
        if "enum" in spec and value not in spec["enum"]:
            message = f"{name}: argument {arg!r} should be one of the allowed values"
            return ToolCall(name, dict(arguments), "not_in_enum", message)
    return ToolCall(name, dict(arguments))


def format_call(name: str, arguments: dict) -> str:
    """A call in the format the model is asked to produce (used by scripted policies and docs)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"
