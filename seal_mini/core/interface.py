"""The training-time interface Omega: a wrapper around an Episode that evaluation simply leaves out.

Omega_t changes only what the model is shown, never what happens: the same tools execute the same
calls, the episode records the same events, the verifier scores the same checker input (the one
exception is parse_retry, below: the retried message is recorded as a parse error and never runs). Three
components, each switchable in the recipe (interface.*):
- phi_schema: schema facts that are already public (required / type / allowed values on every
  parameter description) and a system note with the exact call format and "do not invent tools".
- phi_err: an error observation gets a feedback line naming the error class and the violated
  constraint. It is built from the call event and the public schema only: never a correct value,
  never the next call. It also says so when a <tool_call> block could not be read (BFCL drops it
  without a word), and with parse_retry a message whose calls cannot be read at all gets an error
  and another try within the turn, where BFCL (and so the bare environment) ends the turn.
- phi_cap: capability-level guidelines picked from the round's failure profile, one system message.
`evolve(state, profile, cfg)` is Omega_{t+1} = Evolve(Omega_t, C_t); the loop saves each round's
`InterfaceState.to_dict()`.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import asdict, dataclass, field, fields, replace

from seal_mini.config import ConfigError, InterfaceConfig
from seal_mini.engine.render import KEEP_DEFAULT_SYSTEM
from seal_mini.envs.bfcl import to_chat_tool
from seal_mini.envs.episode import CallEvent, Episode, StepResult
from seal_mini.envs.harness import QWEN_FC, Protocol, unread_blocks
from seal_mini.labels import REGISTRY, require_labels

# --- LEARNER EDIT POINT: the cue texts ------------------------------------------------------------
# Everything the interface can ever add to what the model sees is in this block, except the guideline
# texts, which are declared with their labels (seal_mini/labels.py). A cue may use public schema facts
# ({tool}, {required}, {params}) and nothing from the task instance.

SCHEMA_NOTE = (
    "How to call a tool: write <tool_call> on a line of its own, then one JSON object "
    '{"name": "<tool name>", "arguments": {"<parameter>": <value>, ...}} on the next line, then '
    "</tool_call> on a line of its own; one block per call, and one message may hold several blocks. "
    "Call only the tools listed; never invent a tool or a parameter. Parameters marked [required] must "
    "always be given, with values of the type shown."
)
PYTHON_CALLS = (
    "How to call a tool: answer with one Python list of calls, [tool_name(parameter=value, ...), ...], every "
    "argument given by its parameter name and written as a Python literal; nothing else in the message. "
    "Call only the tools listed; never invent a tool or a parameter. Parameters marked [required] must "
    "always be given, with values of the type shown.",
    "a message that calls tools must be one Python list of calls, [tool_name(parameter=value, ...)], "
    "arguments by name, values as Python literals, with nothing else in the message",
)
"""The schema note and the unreadable-call constraint for models that answer as BFCL's LlamaHandler reads
(ToolACE-2: model.tool_format bfcl_llama); SCHEMA_NOTE and ERROR_CLASSES["parse"] are the <tool_call> ones."""
PARAM_MARK = "[{presence}; {type}]"
ENUM_MARK = "[{presence}; {type}; one of: {values}]"

GUIDELINES_HEADER = "Guidelines:"
GUIDELINES: dict[str, tuple[str, str]] = REGISTRY.guidelines
"""Guideline id -> (the label whose failures select it, the text), in guideline order: the order used
when the loop is open (interface.closed_loop = false), where the first top_k are shown."""

# error class -> (its name, the constraint it violates). Classes come from CallEvent.error_kind /
# violation, or, for errors the back end reports, from the error text (EXECUTION_CLASSES).
ERROR_CLASSES = {
    "parse": (
        "unreadable call",
        'each call must be one valid JSON object {"name": ..., "arguments": {...}} between a line '
        "<tool_call> and a line </tool_call>, with nothing else in the block",
    ),
    "unknown_tool": ("unknown tool", "only the listed tools exist; a name not on the list cannot be called"),
    "missing_required": (
        "missing required argument",
        "{tool} must be given all of its required parameters: {required}",
    ),
    "unknown_argument": ("unknown argument", "{tool} accepts only its declared parameters: {params}"),
    "too_large": ("value too large", "an argument value is over the size limit"),
    "wrong_type": ("wrong argument type", "every argument of {tool} must have the type its schema declares"),
    "not_in_enum": ("value not allowed", "an argument of {tool} must be one of the values its schema allows"),
    "not_offered": ("tool not available yet", "only the tools offered so far can be called"),
    "precondition": ("unmet precondition", "the tool needs a condition that the current state does not meet yet"),
    "path_rule": ("path rule", "the tool takes a plain name in the current directory, one folder level at a time"),
    "wrong_kind": ("wrong kind of target", "the target is not the kind of item this tool works on (file vs directory)"),
    "not_found": ("target not found", "what the call refers to does not exist in the current state"),
    "already_exists": ("target already exists", "what the call would create or change already exists or is done"),
    "invalid_value": ("invalid value", "an argument breaks a rule the tool states in its error message"),
    "execution": ("execution error", "the tool ran and reported a problem with this call"),
}
# Back-end error text -> class, first match wins (case-insensitive).
EXECUTION_CLASSES = [
    ("precondition", r"not authenticated|log ?in|logged in|token|start the engine|brake|market is closed"),
    ("path_rule", r"path not allowed|unsupported path|one folder level"),
    ("wrong_kind", r"is a directory|not a directory|not a file"),
    ("not_found", r"no such|not found|not present|does not exist"),
    ("already_exists", r"already|file exists|must be unique"),
    ("invalid_value", r"invalid|must be|not supported|too long|too large|exceeds|cannot be"),
]
FEEDBACK = (
    "Feedback: {name}. Constraint: {constraint}. Fix the call and retry before you answer; do not repeat it unchanged."
)

SCHEMA_TRIGGERS = ("argument_mismatch", "invalid_tool_call")
"""Labels that switch phi_schema on."""
ERROR_TRIGGERS = ("recovery_failure", "invalid_tool_call")
"""Labels that switch phi_err on."""
# --- end of the edit point ------------------------------------------------------------------------

_SOFT_VIOLATIONS = ("wrong_type", "not_in_enum", "not_offered")
KEPT_ON = " (kept on)"
require_labels(SCHEMA_TRIGGERS, "interface.SCHEMA_TRIGGERS")
require_labels(ERROR_TRIGGERS, "interface.ERROR_TRIGGERS")


COMPONENTS = ("schema_cues", "error_feedback", "parse_retry")
"""InterfaceState's switches, in order; the guidelines are a list beside them."""


@dataclass
class InterfaceState:
    """Omega_t: which components are on. Saved per round as JSON."""

    schema_cues: bool = False
    error_feedback: bool = False
    parse_retry: bool = False
    """Part of phi_err: a message whose calls cannot be read gets an error and another try in the turn."""
    guidelines: list[str] = field(default_factory=list)
    """Active guideline ids (keys of GUIDELINES), in the order they are shown."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each component or guideline is on (the profile numbers that triggered it); for the logs."""

    @property
    def active(self) -> bool:
        return self.schema_cues or self.error_feedback or self.parse_retry or bool(self.guidelines)

    def to_dict(self) -> dict:
        return asdict(self)  # copies of the list and the dict

    @classmethod
    def from_dict(cls, data: dict) -> InterfaceState:
        """Rebuild a saved state (an absent key takes its default); unknown keys or guideline ids are errors."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"interface state: unknown keys {unknown}")
        bad = [g for g in data.get("guidelines", []) if g not in GUIDELINES]
        if bad:
            raise ConfigError(f"interface state: unknown guideline ids {bad}; known: {list(GUIDELINES)}")
        state = cls(**copy.deepcopy(data))
        for name in COMPONENTS:
            setattr(state, name, bool(getattr(state, name)))
        return state


# --- Evolve: Omega_{t+1} from Omega_t and the failure profile C_t ----------------------------------


def _entry(profile: dict, label: str) -> dict | None:
    entry = profile.get(label)
    if entry is None:
        return None
    missing = [k for k in ("count", "prevalence", "success_rate") if k not in entry]
    if missing:
        raise ValueError(f"failure profile entry {label!r} lacks {missing}")
    return entry


def _describe(label: str, entry: dict) -> str:
    return f"{label}: count {entry['count']}, prevalence {entry['prevalence']:.3f}, success {entry['success_rate']:.3f}"


def _trigger(profile: dict, labels: tuple[str, ...], cfg: InterfaceConfig) -> str:
    """Why a component should switch on (empty: it should not): a trigger label present enough."""
    hits = []
    for label in labels:
        entry = _entry(profile, label)
        if entry and entry["count"] >= cfg.trigger_min_count and entry["prevalence"] >= cfg.trigger_min_prevalence:
            hits.append(_describe(label, entry))
    return "; ".join(hits)


def select_guidelines(profile: dict, cfg: InterfaceConfig) -> tuple[list[str], dict[str, str]]:
    """phi_cap: gated by count, prevalence and success rate; top_k by prevalence * (1 - success)."""
    scored = []
    for order, (gid, (label, _)) in enumerate(GUIDELINES.items()):
        entry = _entry(profile, label)
        if (
            entry
            and entry["count"] > 0
            and entry["count"] >= cfg.min_count
            and entry["prevalence"] >= cfg.min_prevalence
            and entry["success_rate"] < cfg.max_success
        ):
            # ties keep the table order, so the choice is deterministic
            scored.append((-entry["prevalence"] * (1.0 - entry["success_rate"]), order, gid, _describe(label, entry)))
    chosen = sorted(scored)[: cfg.top_k]
    return [gid for _, _, gid, _ in chosen], {gid: why for _, _, gid, why in chosen}


def initial_state(cfg: InterfaceConfig) -> InterfaceState:
    """Omega_0: nothing on in a closed loop (nothing diagnosed yet); everything enabled on otherwise."""
    return evolve(InterfaceState(), {}, cfg)


def evolve(state: InterfaceState, profile: dict, cfg: InterfaceConfig) -> InterfaceState:
    """Omega_{t+1} = Evolve(Omega_t, C_t). Components disabled in cfg never switch on.

    Closed loop: phi_schema / phi_err switch on when one of their trigger labels reaches
    trigger_min_count turns and trigger_min_prevalence in C_t, and (sticky_cues) stay on after;
    guidelines are chosen afresh from every profile. Open loop (closed_loop false): every enabled
    component is on from the start, with the first top_k guidelines in GUIDELINES order."""
    if not cfg.enabled:
        return InterfaceState()
    if not cfg.closed_loop:
        fixed = list(GUIDELINES)[: cfg.top_k] if cfg.guidelines else []
        components = {"schema_cues": cfg.schema_cues, "error_feedback": cfg.error_feedback}
        reasons = {name: "open loop" for name in [*components, *fixed] if components.get(name, True)}
        return InterfaceState(
            cfg.schema_cues, cfg.error_feedback, cfg.error_feedback and cfg.parse_retry, fixed, reasons
        )

    reasons: dict[str, str] = {}
    on = {}
    for name, enabled, labels, was_on in (
        ("schema_cues", cfg.schema_cues, SCHEMA_TRIGGERS, state.schema_cues),
        ("error_feedback", cfg.error_feedback, ERROR_TRIGGERS, state.error_feedback),
    ):
        why = _trigger(profile, labels, cfg)
        if enabled and not why and was_on and cfg.sticky_cues:
            why = state.reasons.get(name, "").removesuffix(KEPT_ON) + KEPT_ON
        on[name] = enabled and bool(why)
        if on[name]:
            reasons[name] = why
    guidelines, why_guidelines = select_guidelines(profile, cfg) if cfg.guidelines else ([], {})
    reasons.update(why_guidelines)
    retry = on["error_feedback"] and cfg.parse_retry
    return InterfaceState(on["schema_cues"], on["error_feedback"], retry, guidelines, reasons)


# --- the cues themselves ----------------------------------------------------------------------------


def _type_name(spec: dict) -> str:
    kind = spec.get("type", "any")
    kind = "/".join(kind) if isinstance(kind, list) else kind
    items = spec.get("items")
    if kind == "array" and isinstance(items, dict) and "type" in items:
        return f"array of {items['type']}"
    return str(kind)


def annotate_tool(tool: dict) -> dict:
    """phi_schema on one tool (a BFCL doc or a chat tool): a copy whose parameter descriptions end in
    [required; type], the types named as JSON schema names them."""
    tool = copy.deepcopy(tool)
    chat = tool if "function" in tool else to_chat_tool(tool)
    params = tool["function"]["parameters"] if "function" in tool else tool.get("parameters", {})
    schema = chat["function"]["parameters"]
    required = set(params.get("required", []))
    for name, spec in params.get("properties", {}).items():
        presence = "required" if name in required else "optional"
        json_spec = schema["properties"][name]
        if "enum" in spec:
            values = ", ".join(json.dumps(v) for v in spec["enum"])
            mark = ENUM_MARK.format(presence=presence, type=_type_name(json_spec), values=values)
        else:
            mark = PARAM_MARK.format(presence=presence, type=_type_name(json_spec))
        spec["description"] = f"{spec.get('description', '').rstrip()} {mark}".lstrip()
    return tool


def system_text(state: InterfaceState, protocol: Protocol = QWEN_FC) -> str:
    """The system note of an interface state (empty when neither schema cues nor guidelines are on), for a
    model that writes calls as `protocol`'s handler reads them."""
    parts = [SCHEMA_NOTE if protocol == QWEN_FC else PYTHON_CALLS[0]] if state.schema_cues else []
    if state.guidelines:
        parts.append("\n".join([GUIDELINES_HEADER] + [f"- {GUIDELINES[g][1]}" for g in state.guidelines]))
    return "\n\n".join(parts)


def error_class(event: CallEvent) -> str:
    """The class of a failed call: from the event's kind and violation, else from the error text."""
    assert event.error_kind is not None, "error_class of a call that did not fail"
    if event.error_kind == "arguments":
        return event.violation if event.violation in ERROR_CLASSES else "execution"
    if event.error_kind in ("parse", "unknown_tool"):
        return event.error_kind
    if event.violation in _SOFT_VIOLATIONS:  # it executed with a schema violation and then failed
        return event.violation
    text = event.error.lower()
    return next((cls for cls, pattern in EXECUTION_CLASSES if re.search(pattern, text)), "execution")


def feedback(event: CallEvent, schema: dict | None, protocol: Protocol = QWEN_FC) -> str:
    """phi_err: one line naming the error class and the violated constraint (schema facts only)."""
    cls = error_class(event)
    name, constraint = ERROR_CLASSES[cls]
    if cls == "parse" and protocol != QWEN_FC:
        constraint = PYTHON_CALLS[1]
    params = schema.get("properties", {}) if schema else {}
    required = [p for p in (schema or {}).get("required", []) if p not in (event.arguments or {})]
    fields = {
        "{tool}": event.name or "the tool",
        "{required}": ", ".join(required) or "see the schema",
        "{params}": ", ".join(params) or "none",
    }
    for placeholder, value in fields.items():  # not str.format: the texts hold JSON braces
        constraint = constraint.replace(placeholder, value)
    return FEEDBACK.replace("{name}", name).replace("{constraint}", constraint)


def _with_system(messages: list[dict], text: str) -> list[dict]:
    """Add the note to the system text: merged into the task's own system message if it has one, else a
    system message that keeps the template's default system text before it."""
    messages = [dict(m) for m in messages]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{text}"
        return messages
    return [{"role": "system", "content": text, KEEP_DEFAULT_SYSTEM: True}] + messages


# --- the wrapper ------------------------------------------------------------------------------------


def _unreadable(text: str | bytes, protocol: Protocol) -> list[tuple[str | None, str]]:
    """(name, problem) of each call BFCL's handler cannot read, when the message has no call it can read
    (BFCL ends the turn on it); [] otherwise."""
    decoded = protocol.decode(text)
    return unread_blocks(decoded) if decoded.ends_turn else []


class Interface:
    """An Episode seen through Omega_t. Same API as Episode; overrides only reset and step."""

    def __init__(self, episode: Episode, state: InterfaceState):
        self.env = episode
        self.state = state
        self.protocol = getattr(episode, "protocol", QWEN_FC)
        self.errors_rewritten = 0
        """Error observations phi_err rewrote in this episode (for the round's metrics)."""

    def reset(self) -> tuple[list[dict], list[dict]]:
        """The bare reset, plus the schema marks on the tools and the system note."""
        messages, tools = self.env.reset()
        self.errors_rewritten = 0
        if self.state.schema_cues:
            tools = [annotate_tool(t) for t in tools]
        text = system_text(self.state, self.protocol)
        if text:
            messages = _with_system(messages, text)
        return messages, tools

    def step(self, text: str | bytes) -> StepResult:
        """The bare step, except that with parse_retry a message whose calls cannot be read at all goes back
        to the model with the error instead of ending the turn (BFCL ends it); errors get feedback, tools
        revealed later get the schema marks."""
        if self.state.parse_retry and not self.env.done and (unread := _unreadable(text, self.protocol)):
            result = self.env.send_back(unread, "Error: " + "; ".join(problem for _, problem in unread))
        else:
            result = self.env.step(text)
        if not (self.state.error_feedback or self.state.schema_cues):
            return result
        observation = [dict(m) for m in result.observation]
        if self.state.error_feedback:
            self._add_feedback(result, observation)
        if self.state.schema_cues and result.turn_done and not result.done:
            self._annotate_reveal(observation)
        return replace(result, observation=observation)

    def __getattr__(self, name: str):
        # Everything else (done, task, truncate, turn_records, checker_input, ...) is the episode's own, read
        # through as a Gymnasium wrapper does: the interface overrides only reset and step.
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    # -- internals ---------------------------------------------------------------------------------

    def _schema(self, name: str | None) -> dict | None:
        """The JSON-schema parameters of a tool of this task (offered now or revealed later)."""
        if name in self.env.offered:
            return self.env.offered[name]["function"]["parameters"]
        for docs in self.env.task.held_out.values():
            for doc in docs:
                if doc["name"] == name:
                    return to_chat_tool(doc)["function"]["parameters"]
        return None

    def _add_feedback(self, result: StepResult, observation: list[dict]) -> None:
        """phi_err on one step's observation. The episode shows one tool message per decoded call, in
        the order of their events; a block BFCL could not read gets no message, so it gets one here
        while the turn goes on (a retried message's own error message takes its feedback instead)."""
        called = [e for e in result.events if e.call is not None]
        unread = [e for e in result.events if e.call is None]
        for i, event in enumerate(called):
            if event.error_kind is not None:
                assert observation[i]["role"] == "tool", "observation does not line up with the call events"
                observation[i]["content"] += f"\n{feedback(event, self._schema(event.name), self.protocol)}"
                self.errors_rewritten += 1
        if not unread or result.turn_done:
            return
        if not called:  # the episode let the model retry: one error message for the whole message
            observation[0]["content"] += f"\n{feedback(unread[0], None, self.protocol)}"
        else:
            extra = [
                {
                    "role": "tool",
                    "name": e.name or "",
                    "content": f"Error: {e.error}\n{feedback(e, None, self.protocol)}",
                }
                for e in unread
            ]
            observation[len(called) : len(called)] = extra
        self.errors_rewritten += len(unread)

    def _annotate_reveal(self, observation: list[dict]) -> None:
        """miss_func: the user message that reveals tools shows their schemas (BFCL's as Python writes
        them, or the kit's as JSON); mark those too."""
        index = len(self.env.turns) - 1
        docs = self.env.task.held_out.get(index)
        if not docs:
            return
        bare = self.env.turns[index].user_text
        for message in observation:
            if message.get("role") == "user" and message.get("content") == bare:
                content = bare
                for doc in docs:
                    tool = to_chat_tool(doc)
                    content = content.replace(repr(doc), repr(annotate_tool(doc)))
                    content = content.replace(json.dumps(tool), json.dumps(annotate_tool(tool)))
                message["content"] = content


def active_cues(interface: dict | None) -> list[str]:
    """Names of the cues an interface state turns on: its true flags and its guideline ids."""
    if not interface:
        return []
    names = [k for k, v in interface.items() if v is True]
    for k, v in interface.items():
        if isinstance(v, list):
            names += [f"{k}:{item}" for item in v]
    return sorted(names)


def shown_texts() -> list[str]:
    """Every text the interface can add to what the model sees (notes, guidelines, feedback): a tokenizer
    built from scratch learns them with the tasks, so switching a cue on never shows it unknown pieces."""
    texts = [SCHEMA_NOTE, GUIDELINES_HEADER, FEEDBACK]
    texts += [text for _, text in GUIDELINES.values()]
    texts += [f"{name}. {constraint}" for name, constraint in ERROR_CLASSES.values()]
    return texts
