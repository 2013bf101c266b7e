"""BFCL V3 multi-turn as an in-process executable environment (reset / step), on BFCL's own protocol.

One `Episode` per rollout. `reset` builds fresh back-end instances from a deep copy of the task's
initial state. `step` takes one assistant message and does what BFCL's inference loop does with it
(seal_mini.envs.harness has the details): it decodes the message with BFCL's handler for the model (its
`protocol`: the Qwen FC handler's <tool_call> JSON, or for ToolACE-2 the LlamaHandler's Python call list); a message
that fails to decode or decodes to no call ends the user turn and the next one follows; otherwise every
decoded call runs with BFCL's executor semantics and its result (a back-end error included) comes back
as an observation. More than 20 tool-calling messages in one user turn end the episode (BFCL's force
quit). The kit's defences stay: nothing is eval()ed, and only public methods of the task's back ends run.

The episode records, per user turn, every decoded call in the form BFCL's scorer gives its checker, so
the reward (seal_mini.envs.verifier) is the official checker's verdict on exactly what BFCL would score. It
also records what BFCL drops without a word (<tool_call> blocks its decoder could not read) and each
call's schema problems: evidence for the diagnoser and the training interface, never a change to what
runs. The training interface may send an unreadable message back instead of stepping it (`send_back`,
its parse_retry); the benchmark never does.
"""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import dataclass, field

from seal_mini.envs.bfcl import NEW_TOOLS_USER_TEXT, Task, to_chat_tool
from seal_mini.envs.harness import (
    INSTANCE_PREFIX,
    QWEN_FC,
    Protocol,
    format_output,
    fresh_class,
    instance_name,
    method_owners,
    public_method_names,
    run_call,
    unread_blocks,
    unwritable,
)
from seal_mini.envs.toolcalls import CallError, validate_call

__all__ = ["INSTANCE_PREFIX"]  # re-exported for the diagnoser

# Why an episode's turn ended (TurnRecord.ended_by).
NO_CALL = "no_call"  # a message that decoded to no call (an answer, or calls BFCL could not read): BFCL's end of a turn
TURN_LIMIT = "turn_limit"  # more tool-calling messages than allowed in one turn (BFCL: force quit)
EPISODE_LIMIT = "episode_limit"  # the per-episode call budget ran out
TRUNCATED = "truncated"  # the rollout engine hit a token limit
NOT_REACHED = "not_reached"  # the episode ended before this turn began
INFERENCE_ERROR = "inference_error"  # BFCL's loop would fail writing its next prompt (see Episode.step)


@dataclass
class CallEvent:
    """What became of one decoded call, or of one <tool_call> block BFCL's decoder could not read."""

    step: int
    """Index of the model message (within the turn) that made it."""
    name: str | None
    arguments: dict | None
    error_kind: str | None = None
    """None (ran fine) | parse (a block BFCL could not read: nothing ran) | unknown_tool (the name is no
    tool of the task: BFCL's eval stops with an error) | arguments (missing or unknown arguments, or a
    call the harness refused) | execution (the back end raised or reported an error)."""
    error: str = ""
    violation: str = ""
    """Schema problem, for the diagnoser and the interface: unknown_tool | not_offered (a task tool not
    revealed yet) | missing_required | unknown_argument | wrong_type | not_in_enum. Every decoded call
    runs regardless, as in BFCL."""
    call: str | None = None
    """The call as BFCL's scorer hands it to the checker (None for a block that was not decoded)."""
    output: str | None = None
    """The execution result BFCL records and shows the model (None for a block that was not decoded)."""


@dataclass
class TurnRecord:
    index: int
    user_text: str
    steps: list[list[str]] = field(default_factory=list)
    """Decoded calls per tool-calling message, as BFCL's scorer builds them: the checker's input."""
    events: list[CallEvent] = field(default_factory=list)
    messages: int = 0
    """Assistant messages in this turn."""
    ended_by: str = NOT_REACHED
    final_text: str = ""
    """The message that ended the turn, as BFCL keeps it (empty if it did not end by NO_CALL)."""
    retried: int = 0
    """Unreadable call messages the training interface sent back for another try (always 0 in evaluation)."""


@dataclass
class StepResult:
    observation: list[dict]
    """Messages to append after the assistant message: one tool result per decoded call (in the order
    of the call events that have one), then the next user turn if any."""
    turn_done: bool
    done: bool
    events: list[CallEvent]
    retried: bool = False
    """The message was unreadable and the training interface let the model try again (parse_retry); the
    rollout engine keeps it out of the loss (seal_mini.engine.sequences.Sequences.forgive)."""


def new_instances(task: Task, classes: dict[str, type] | None = None) -> dict[str, object]:
    """Fresh back-end instances for a task: a deep copy of its initial state, of classes of their own
    (`classes`, by default a fresh_class per back end), so nothing is shared with any other episode. A
    class reads its state with `_load_scenario`, as BFCL's do; a recipe's own class without one gets each
    key of the state as the public attribute of that name (seal_mini.envs.world checks the keys)."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    instances = {}
    for class_name in task.involved_classes:
        instance = (classes[class_name] if classes else fresh_class(class_name))()
        if class_name not in STATELESS_CLASSES:
            state = copy.deepcopy(task.initial_config.get(class_name, {}))
            if hasattr(instance, "_load_scenario"):
                instance._load_scenario(state, long_context=task.long_context)
            else:
                vars(instance).update(state)
        instances[class_name] = instance
    return instances


def public_methods(instances: dict[str, object]) -> dict[str, object]:
    """Tool name -> bound public method; private and dunder names are never reachable."""
    return {name: getattr(inst, name) for inst in instances.values() for name in public_method_names(inst)}


def call_directly(methods: dict, name: str, arguments: dict) -> tuple[str, bool]:
    """(output as BFCL records it, whether the call failed) of one reference call run directly on a method
    of `methods` (public_methods: a name outside it fails like any raising call)."""
    try:
        result = methods[name](**copy.deepcopy(arguments))
    except Exception as e:  # noqa: BLE001 - the episode and the checker record a raising call the same way
        return f"Error during execution: {e}", True
    return format_output(result), isinstance(result, dict) and "error" in result


def public_state(instance) -> dict:
    """A back end's public attributes, not copied: what BFCL's state check compares."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


STATE_LIMIT = 100_000
"""Objects a state may unfold to and still be compared or shown: BFCL's mv and cp share a directory between
paths, so a few dozen calls build a tree whose unfolded size (what == and repr walk) doubles every six."""


def unfolded_size(value, limit: int = STATE_LIMIT) -> int:
    """The objects == or repr visits in `value` (a shared part counted on every path, walked once; a
    back reference skipped), up to `limit`; a value nested deeper than Python recurses counts as above it."""
    sizes: dict[int, int] = {}

    def size(v, enclosing: frozenset) -> int:
        if id(v) in sizes:
            return sizes[id(v)]
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple, set, frozenset)):
            children = v
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            enclosing = enclosing | {id(v)}
            children = [c for k, c in vars(v).items() if not k.startswith("_") and id(c) not in enclosing]
        else:
            return 1
        total = 1
        for child in children:
            total += 1 if type(child) in _LEAVES else size(child, enclosing)
            if total > limit:
                break
        sizes[id(v)] = total
        return total

    try:
        return size(value, frozenset())
    except RecursionError:
        return limit + 1


_LEAVES = {str, int, float, bool, type(None)}


def state_of(instances: dict[str, object], previous: dict | None = None) -> dict[str, dict]:
    """Public attributes per class (a copy: a pickle round trip, about three times faster than deepcopy on
    these states). A class whose state did not change since `previous` shares that snapshot: only for
    snapshots that are never mutated."""
    out = {}
    for name, inst in instances.items():
        public = public_state(inst)
        if previous is not None and public == previous[name]:
            out[name] = previous[name]
            continue
        try:
            out[name] = pickle.loads(pickle.dumps(public, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - a value that does not pickle is copied the slow way
            try:
                out[name] = copy.deepcopy(public)
            except RecursionError:  # a model's calls nested a tree deeper than Python recurses (mkdir/cd)
                out[name] = {"<state nested too deep to copy>": True}  # equal to no state a task reaches
    return out


def render_new_tools(docs: list[dict]) -> str:
    """The user message of a reveal turn for a task of the kit's own that has none (a BFCL task holds
    BFCL's): the new tools' schemas first, then BFCL's sentence saying that more functions are available."""
    body = "\n".join(json.dumps(to_chat_tool(d)) for d in docs)
    return f"<tools>\n{body}\n</tools>\n{NEW_TOOLS_USER_TEXT}"


class Episode:
    """One BFCL multi-turn episode. Construct, then `reset()`, then `step(text)` until `done`."""

    def __init__(
        self, task: Task, max_calls_per_turn: int = 20, max_calls_per_episode: int = 0, protocol: Protocol = QWEN_FC
    ):
        self.task = task
        self.max_calls_per_turn = max_calls_per_turn
        self.max_calls_per_episode = max_calls_per_episode
        self.protocol = protocol
        """The BFCL handler whose decoding and instance names this episode follows (harness.PROTOCOLS)."""

    # -- the gym-like contract ---------------------------------------------------------------------

    def reset(self) -> tuple[list[dict], list[dict]]:
        """Fresh state. Returns (first messages, the tools offered from the start as the task's BFCL docs:
        the renderer shows them in the model's format). Tools revealed later come in a user message."""
        self.instances = new_instances(self.task)
        self.methods = public_methods(self.instances)
        # BFCL's executor knows each instance by a global name and maps every public method to it
        prefix = self.protocol.instance_prefix
        self.scope = {instance_name(prefix, self.task.id, c): i for c, i in self.instances.items()}
        self.owners = method_owners(self.scope)
        self.offered = {d["name"]: to_chat_tool(d) for d in self.task.tools}
        self.later = {d["name"]: to_chat_tool(d) for docs in self.task.held_out.values() for d in docs}
        """Tools of the task not offered yet (miss_func); each moves to `offered` at its reveal."""
        self.turns: list[TurnRecord] = []
        self.turn_states: list[dict] = []
        """State of the back ends after each finished turn (diagnosis evidence)."""
        self.tool_calls_made = 0
        self.done = False
        self.ended_by = ""
        first = self._begin_turn(0)
        return first, copy.deepcopy(self.task.tools)

    def step(self, text: str | bytes) -> StepResult:
        """Run one assistant message as BFCL's inference loop does. Never raises for anything the model wrote."""
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        turn = self.turns[-1]
        step_index = turn.messages
        turn.messages += 1
        decoded = self.protocol.decode(text)
        unread = [CallEvent(step_index, name, None, "parse", problem) for name, problem in unread_blocks(decoded)]
        if decoded.ends_turn:
            turn.events += unread
            turn.ended_by = NO_CALL
            turn.final_text = decoded.text
            result = self._finish_turn()
        else:
            events = [
                self._run(call, item, step_index) for call, item in zip(decoded.calls, decoded.items, strict=True)
            ]
            turn.events += events + unread
            turn.steps.append([e.call for e in events])
            observation = [{"role": "tool", "name": e.name or "", "content": e.output} for e in events]
            result = self._after_tool_message(turn, observation, events + unread)
        if not self.done and self.protocol == QWEN_FC and unwritable(text):
            # BFCL's chat history keeps this message's calls as its decoder found them, and its prompt
            # cannot write one of them: its loop stops the entry with an error at the next query, which
            # its scorer fails (a message with no later query does no harm)
            return self._end_episode(result.observation, result.events, INFERENCE_ERROR)
        return result

    def send_back(self, unread: list[tuple[str | None, str]], feedback: str) -> StepResult:
        """An unreadable message the training interface returns to the model instead of stepping it (its
        parse_retry; BFCL would end the turn). Nothing runs; `unread` ((name, problem) per block) is
        recorded as parse errors, `feedback` comes back as a tool message, the turn stays open, and the
        attempt counts toward the turn's limits as a message with calls does."""
        if self.done:
            raise RuntimeError("send_back() after the episode ended; call reset()")
        turn = self.turns[-1]
        events = [CallEvent(turn.messages, name, None, "parse", problem) for name, problem in unread]
        turn.messages += 1
        turn.events += events
        turn.retried += 1
        result = self._after_tool_message(turn, [{"role": "tool", "name": "", "content": feedback}], events)
        result.retried = True
        return result

    def truncate(self) -> None:
        """The rollout engine ran out of tokens: end the episode here (the rest is never reached)."""
        if not self.done:
            self.turns[-1].ended_by = TRUNCATED
            self._end_episode([], [], TRUNCATED)

    @property
    def turn_index(self) -> int:
        """The task turn being played (the rollout engine marks where each turn's tokens begin)."""
        return len(self.turns) - 1

    # -- records for the verifier and the diagnoser ------------------------------------------------

    def checker_input(self) -> list[list[list[str]]]:
        """Per turn of the task, per tool-calling message, the decoded calls (BFCL's scorer's form)."""
        steps = [t.steps for t in self.turns]
        return steps + [[] for _ in range(len(self.task.turns) - len(steps))]

    def turn_records(self) -> list[TurnRecord]:
        """One record per task turn; turns never begun are NOT_REACHED."""
        rest = [TurnRecord(index=i, user_text=self._user_text(i)) for i in range(len(self.turns), len(self.task.turns))]
        return self.turns + rest

    # -- internals ---------------------------------------------------------------------------------

    def _messages(self, index: int) -> list[dict]:
        """The messages that open turn `index`: the task's, or at a reveal turn without any, the kit's."""
        if not self.task.turns[index] and index in self.task.held_out:
            return [{"role": "user", "content": render_new_tools(self.task.held_out[index])}]
        return [dict(m) for m in self.task.turns[index]]

    def _user_text(self, index: int) -> str:
        return "\n".join(m["content"] for m in self._messages(index) if m.get("role") == "user")

    def _begin_turn(self, index: int) -> list[dict]:
        for doc in self.task.held_out.get(index, []):
            self.offered[doc["name"]] = self.later.pop(doc["name"], None) or to_chat_tool(doc)
        self.turns.append(TurnRecord(index=index, user_text=self._user_text(index)))
        return self._messages(index)

    def _after_tool_message(self, turn: TurnRecord, observation: list[dict], events: list[CallEvent]) -> StepResult:
        """The limits after a message that made calls. BFCL counts such messages per user turn and
        force-quits the task once there are more than its limit (20)."""
        self.tool_calls_made += 1
        if len(turn.steps) + turn.retried > self.max_calls_per_turn:
            turn.ended_by = TURN_LIMIT
            return self._end_episode(observation, events, TURN_LIMIT)
        if self.max_calls_per_episode and self.tool_calls_made >= self.max_calls_per_episode:
            turn.ended_by = EPISODE_LIMIT
            return self._end_episode(observation, events, EPISODE_LIMIT)
        return StepResult(observation, turn_done=False, done=False, events=events)

    def _finish_turn(self) -> StepResult:
        if len(self.turns) >= len(self.task.turns):
            return self._end_episode([], [], NO_CALL)
        self.turn_states.append(state_of(self.instances))
        return StepResult(self._begin_turn(len(self.turns)), turn_done=True, done=False, events=[])

    def _end_episode(self, observation: list[dict], events: list[CallEvent], reason: str) -> StepResult:
        self.turn_states.append(state_of(self.instances))
        self.done = True
        self.ended_by = reason
        return StepResult(observation, turn_done=True, done=True, events=events)

    def _run(self, call: str, item: dict, step: int) -> CallEvent:
        """One decoded call through BFCL's executor semantics (seal_mini.envs.harness.run_call)."""
        outcome = run_call(call, self.scope, self.owners)
        plan = outcome.plan
        name = plan.name if plan.kind == "call" else _text_name(item)
        arguments = plan.arguments if plan.kind == "call" else _item_arguments(item)
        violation = self._violation(name, arguments)
        event = CallEvent(step, name, arguments, violation=violation, call=outcome.checker_call, output=outcome.output)
        if plan.kind == "call" and outcome.raised is None:
            if isinstance(outcome.result, dict) and "error" in outcome.result:  # most back ends report errors so
                event.error_kind, event.error = "execution", str(outcome.result["error"])
            return event
        event.error = str(outcome.raised) if plan.kind == "call" else plan.error
        if violation == "unknown_tool":
            event.error_kind = "unknown_tool"
        elif plan.kind == "refused" or (
            isinstance(outcome.raised, TypeError) and violation in ("missing_required", "unknown_argument")
        ):
            event.error_kind = "arguments"  # refused, or Python rejected the arguments before the method ran
        else:
            event.error_kind = "execution"
        return event

    def _violation(self, name: str | None, arguments: dict | None) -> str:
        """The schema violation of a call against the tools offered so far and those revealed later ("" if none)."""
        if not isinstance(name, str) or not name:
            return "unknown_tool"
        checked = validate_call({"name": name, "arguments": arguments or {}}, self.offered, self.later, limits=False)
        if isinstance(checked, CallError) and checked.kind == "unknown_tool":
            return "unknown_tool"
        return checked.violation


def _text_name(item: dict) -> str | None:
    name = item.get("name")
    return name if isinstance(name, str) else (None if name is None else str(name))


def _item_arguments(item: dict) -> dict | None:
    """The arguments of a decoded JSON call as a dict (BFCL also accepts them as a JSON string)."""
    arguments = item.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return arguments if isinstance(arguments, dict) else None
