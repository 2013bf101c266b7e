"""BFCL V3 multi-turn as an in-process executable environment (reset / step).

One `Episode` per rollout. `reset` builds fresh back-end instances from a deep copy of the task's
initial state; `step` takes the model's assistant text, parses and validates every call in it and
dispatches the valid ones to the back-end methods directly. Errors of any kind come back as
observations. A message without a call ends the user turn and the next user turn follows.

The episode records, per user turn, the calls it executed in the checker's canonical form, so the
reward (seal_mini.verifier) is the official BFCL checker's verdict on exactly what happened.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from dataclasses import dataclass, field

from seal_mini.bfcl import NEW_TOOLS_USER_TEXT, Task, to_chat_tool
from seal_mini.toolcalls import CallError, ToolCall, parse_tool_calls, validate_call

# Why an episode's turn ended (TurnRecord.ended_by).
NO_CALL = "no_call"  # the model answered without a call: the normal end of a turn
TURN_LIMIT = "turn_limit"  # more tool-calling messages than allowed in one turn (BFCL: force quit)
EPISODE_LIMIT = "episode_limit"  # the per-episode call budget ran out
TRUNCATED = "truncated"  # the rollout engine hit a token limit
NOT_REACHED = "not_reached"  # the episode ended before this turn began


@dataclass
class CallEvent:
    """What became of one <tool_call> block."""

    step: int
    """Index of the model message (within the turn) that made it."""
    name: str | None
    arguments: dict | None
    error_kind: str | None = None
    """None (executed fine) | parse | unknown_tool | arguments | execution."""
    error: str = ""
    violation: str = ""
    """Schema problem: missing_required | unknown_argument | too_large (not executed) or
    wrong_type | not_in_enum | not_offered (executed anyway, as BFCL would)."""
    call: str | None = None
    """Canonical form, for executed calls (errors raised by the back end included)."""
    output: str | None = None


@dataclass
class TurnRecord:
    index: int
    user_text: str
    steps: list[list[str]] = field(default_factory=list)
    """Executed calls per tool-calling message, canonical form: the checker's input for this turn."""
    events: list[CallEvent] = field(default_factory=list)
    messages: int = 0
    """Assistant messages in this turn."""
    ended_by: str = NOT_REACHED
    final_text: str = ""
    """The text of the message that ended the turn (empty if it did not end by NO_CALL)."""


@dataclass
class StepResult:
    observation: list[dict]
    """Messages to append after the assistant message: tool results, then the next user turn if any."""
    turn_done: bool
    done: bool
    events: list[CallEvent]


def format_output(result) -> str:
    """A back-end return value as BFCL shows it: strings as is, dicts as JSON, the rest str()."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def new_instances(task: Task) -> dict[str, object]:
    """Fresh back-end instances for a task (a deep copy of its initial state; nothing cached)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    instances = {}
    for class_name in task.involved_classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
        instance = cls()
        if class_name not in STATELESS_CLASSES:
            instance._load_scenario(
                copy.deepcopy(task.initial_config.get(class_name, {})), long_context=task.long_context
            )
        instances[class_name] = instance
    return instances


def public_methods(instances: dict[str, object]) -> dict[str, object]:
    """Tool name -> bound public method; private and dunder names are never reachable."""
    methods = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                methods[name] = method
    return methods


def state_of(instances: dict[str, object]) -> dict[str, dict]:
    """Public attributes per class: what BFCL's state check compares (a deep copy)."""
    return {
        name: copy.deepcopy({k: v for k, v in vars(inst).items() if not k.startswith("_")})
        for name, inst in instances.items()
    }


def render_new_tools(docs: list[dict]) -> str:
    """The user message of a miss_func reveal turn: BFCL's sentence plus the new tools' schemas."""
    body = "\n".join(json.dumps(to_chat_tool(d)) for d in docs)
    return f"{NEW_TOOLS_USER_TEXT}\n<tools>\n{body}\n</tools>"


class Episode:
    """One BFCL multi-turn episode. Construct, then `reset()`, then `step(text)` until `done`."""

    def __init__(self, task: Task, max_calls_per_turn: int = 20, max_calls_per_episode: int = 0):
        self.task = task
        self.max_calls_per_turn = max_calls_per_turn
        self.max_calls_per_episode = max_calls_per_episode

    # -- the gym-like contract ---------------------------------------------------------------------

    def reset(self) -> tuple[list[dict], list[dict]]:
        """Fresh state. Returns (first messages, tools as chat-template dicts)."""
        self.instances = new_instances(self.task)
        self.methods = public_methods(self.instances)
        self.offered = {d["name"]: to_chat_tool(d) for d in self.task.tools}
        self.turns: list[TurnRecord] = []
        self.turn_states: list[dict] = []
        """State of the back ends after each finished turn (diagnosis evidence)."""
        self.tool_calls_made = 0
        self.done = False
        self.ended_by = ""
        first = self._begin_turn(0)
        return first, [self.offered[n] for n in self.offered]

    def step(self, text: str | bytes) -> StepResult:
        """Run one assistant message. Never raises for anything the model wrote."""
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        turn = self.turns[-1]
        step_index = turn.messages
        turn.messages += 1
        parsed = parse_tool_calls(text)
        if not parsed:
            turn.ended_by = NO_CALL
            turn.final_text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            return self._finish_turn([])

        events, observation, executed = [], [], []
        for item in parsed:
            event = self._run_one(item, step_index)
            events.append(event)
            observation.append({"role": "tool", "name": event.name or "", "content": self._observe(event)})
            if event.call is not None:
                executed.append(event.call)
        turn.events += events
        if executed:
            turn.steps.append(executed)

        # BFCL counts tool-calling messages per turn and fails the task once it exceeds the limit.
        self.tool_calls_made += 1
        calls_in_turn = len({e.step for e in turn.events})
        if calls_in_turn > self.max_calls_per_turn:
            turn.ended_by = TURN_LIMIT
            return self._end_episode(observation, events, TURN_LIMIT)
        if self.max_calls_per_episode and self.tool_calls_made >= self.max_calls_per_episode:
            turn.ended_by = EPISODE_LIMIT
            return self._end_episode(observation, events, EPISODE_LIMIT)
        return StepResult(observation, turn_done=False, done=False, events=events)

    def truncate(self) -> None:
        """The rollout engine ran out of tokens: end the episode here (the rest is never reached)."""
        if not self.done:
            self.turns[-1].ended_by = TRUNCATED
            self._end_episode([], [], TRUNCATED)

    # -- records for the verifier and the diagnoser ------------------------------------------------

    def checker_input(self) -> list[list[list[str]]]:
        """Per turn of the task, per tool-calling message, the executed calls (BFCL's decoded form)."""
        steps = [t.steps for t in self.turns]
        return steps + [[] for _ in range(len(self.task.turns) - len(steps))]

    def turn_records(self) -> list[TurnRecord]:
        """One record per task turn; turns never begun are NOT_REACHED."""
        rest = [TurnRecord(index=i, user_text=self._user_text(i)) for i in range(len(self.turns), len(self.task.turns))]
        return self.turns + rest

    # -- internals ---------------------------------------------------------------------------------

    def _user_text(self, index: int) -> str:
        if index in self.task.held_out:
            return render_new_tools(self.task.held_out[index])
        return "\n".join(m["content"] for m in self.task.turns[index] if m.get("role") == "user")

    def _begin_turn(self, index: int) -> list[dict]:
        for doc in self.task.held_out.get(index, []):
            self.offered[doc["name"]] = to_chat_tool(doc)
        self.turns.append(TurnRecord(index=index, user_text=self._user_text(index)))
        if index in self.task.held_out:
            return [{"role": "user", "content": self._user_text(index)}]
        return [dict(m) for m in self.task.turns[index]]

    def _finish_turn(self, observation: list[dict]) -> StepResult:
        self.turn_states.append(state_of(self.instances))
        next_index = len(self.turns)
        if next_index >= len(self.task.turns):
            self.done = True
            self.ended_by = NO_CALL
            return StepResult(observation, turn_done=True, done=True, events=[])
        return StepResult(observation + self._begin_turn(next_index), turn_done=True, done=False, events=[])

    def _end_episode(self, observation: list[dict], events: list[CallEvent], reason: str) -> StepResult:
        self.turn_states.append(state_of(self.instances))
        self.done = True
        self.ended_by = reason
        return StepResult(observation, turn_done=True, done=True, events=events)

    def _run_one(self, item: dict | CallError, step: int) -> CallEvent:
        if isinstance(item, CallError):
            return CallEvent(step, item.name, None, item.kind, item.message, item.violation)
        later = {d["name"]: to_chat_tool(d) for docs in self.task.held_out.values() for d in docs}
        checked = validate_call(item, self.offered, {n: t for n, t in later.items() if n not in self.offered})
        if isinstance(checked, CallError):
            return CallEvent(step, item["name"], item["arguments"], checked.kind, checked.message, checked.violation)
        return self._execute(checked, step)

    def _execute(self, call: ToolCall, step: int) -> CallEvent:
        method = self.methods.get(call.name)
        if method is None:  # offered in a doc but no back end implements it
            return CallEvent(step, call.name, call.arguments, "unknown_tool", f"tool {call.name!r} is not available")
        event = CallEvent(step, call.name, call.arguments, violation=call.violation, call=call.canonical())
        try:
            # back ends keep the lists and dicts they are given: pass copies so the record stays as called
            result = method(**copy.deepcopy(call.arguments))
        except Exception as e:  # the back end's own errors are observations, as in BFCL
            event.error_kind, event.error = "execution", str(e)
            event.output = f"Error during execution: {e}"
            return event
        event.output = format_output(result)
        if isinstance(result, dict) and "error" in result:  # most BFCL back ends report errors this way
            event.error_kind, event.error = "execution", str(result["error"])
        return event

    @staticmethod
    def _observe(event: CallEvent) -> str:
        """The bare environment's observation of one call (the interface may rewrite errors)."""
        if event.error_kind in (None, "execution"):
            return event.output or ""
        return f"Error: {event.error}"
