"""The kit's episode and verifier against BFCL's own inference loop and scorer (tests/differential.py).

The ground truth of every one of the 800 tasks, and the perturbation kinds in CI_KINDS (one for each way the
kit once departed from BFCL, and controls) on a spread quarter of them: the kit's verdict must equal BFCL's
on every episode, and so must the prompt of every model query. `PYTHONPATH=. python tests/differential.py`
plays the whole battery (PERTURBATIONS) on all 800.
"""

import copy
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from differential import (
    CI_KINDS,
    KINDS,
    PERTURBATIONS,
    REFUSAL_KINDS,
    bfcl_verdict,
    kit_verdict,
    main,
    print_report,
    run_differential,
)

from seal_mini.__main__ import main as seal_main
from seal_mini.config import RolloutConfig
from seal_mini.engine.render import ChatRenderer
from seal_mini.engine.sequences import Sequences
from seal_mini.engine.tiny import tiny_tokenizer
from seal_mini.envs.bfcl import load_tasks, tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import QWEN_FC, TOOLACE
from seal_mini.envs.scripted import DONE_TEXT, ground_truth_turns
from seal_mini.envs.toolcalls import format_call

ALL_TASKS_KINDS = (
    "ground_truth",
    "explicit_empty_lists_after_shared_default_grew",
    "mention_own_default_post",
    "long_context_card_booking",
    "card_booking_after_a_card_was_drained",
)
"""The CI kinds played on all 800 tasks: every task's ground truth, and the kinds only a few tasks allow; the
other CI kinds play one task in four of each category (EVERY), a spread sample the full command extends."""
EVERY = 4


def test_kit_and_bfcl_agree_on_every_ground_truth_of_all_800_tasks_and_a_spread_quarter_of_the_rest(capsys):
    assert set(CI_KINDS) < set(PERTURBATIONS) and not set(CI_KINDS) & set(REFUSAL_KINDS)
    assert set(ALL_TASKS_KINDS) < set(CI_KINDS)
    result = run_differential(ALL_TASKS_KINDS)
    sampled = run_differential([k for k in CI_KINDS if k not in ALL_TASKS_KINDS], every=EVERY)
    result = {"kinds": result["kinds"] | sampled["kinds"], "seconds": result["seconds"] + sampled["seconds"]}
    with capsys.disabled():
        print()
        print_report(result)
    kinds = result["kinds"]
    assert kinds["ground_truth"]["episodes"] == 800 and kinds["ground_truth"]["bfcl_passed"] == 800
    for kind, tally in kinds.items():
        few = kind in ALL_TASKS_KINDS[1:] or kind == "withheld_before_reveal"
        assert tally["episodes"] > (30 if few else 100), kind  # 79 and 32 tasks post tweets so, 50 book flights
        assert tally["agree"] == tally["episodes"], (kind, tally["disagreements"])
        assert tally["same_prompts"] == tally["episodes"], (kind, tally["prompt_differences"])
    # Not vacuous: kinds BFCL fails, and kinds it passes although the old kit failed them.
    assert kinds["one_line_tags"]["bfcl_passed"] == kinds["parse_error_then_repair"]["bfcl_passed"] == 0
    assert kinds["broken_only_call"]["bfcl_passed"] == kinds["broken_only_call"]["episodes"]
    assert kinds["step_limit_in_last_turn"]["bfcl_passed"] == kinds["step_limit_in_last_turn"]["episodes"] == 200
    assert kinds["large_integer"]["bfcl_passed"] > 0  # the kit once refused these
    assert kinds["explicit_empty_lists_after_shared_default_grew"]["bfcl_passed"] > 30  # of the 79 that post
    assert kinds["mention_own_default_post"]["bfcl_passed"] > 0
    # a booking on a shared card fails some tasks in BFCL (the ground truth then meets a drained balance)
    assert 0 < kinds["long_context_card_booking"]["bfcl_passed"] < kinds["long_context_card_booking"]["episodes"]


STATE_KINDS = (
    "ground_truth",
    "dropped_call",
    "duplicated_call",
    "long_context_card_booking",
    "mention_own_default_post",
)
"""The episodes played in a shuffled order in one process and in order in a fresh one: each task's ground
truth, and perturbations that change back-end state in ways a shared default or shared module data would
carry to later episodes."""


def canonical(value, seen=frozenset()):
    """A back end's state as plain JSON data, objects by their attributes (a cycle named once), so states
    made in two processes compare equal exactly when they are the same."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if id(value) in seen:
        return "<cycle>"
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return [[canonical(k, seen), canonical(v, seen)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [canonical(v, seen) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(canonical(v, seen)) for v in value)
    if hasattr(value, "__dict__"):  # public attributes, as BFCL compares them (a file's _last_modified is the clock)
        public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        return {"class": type(value).__name__, "attributes": canonical(public, seen)}
    return repr(value)


def outcomes(order: list) -> dict[str, list]:
    """'task:kind' -> [reward, error type, labels, digest of the final public state], played in this order."""
    from differential import play_script

    from seal_mini.core.diagnose import diagnose
    from seal_mini.envs.episode import state_of
    from seal_mini.envs.verifier import check_episode

    tasks = tasks_by_id()
    out = {}
    for task_id, kind in order:
        task = tasks[task_id]
        script = PERTURBATIONS[kind](task, ground_truth_turns(task), random.Random(f"0:{task_id}:{kind}"))
        env = Episode(task)
        play_script(env, script)
        verdict = check_episode(env)
        state = json.dumps(canonical(state_of(env.instances)))
        digest = hashlib.sha256(state.encode()).hexdigest()
        out[f"{task_id}:{kind}"] = [verdict.reward, verdict.error_type, diagnose(env, verdict), digest]
    return out


PLAY_IN_ORDER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_differential import outcomes
print(json.dumps(outcomes(json.loads(sys.stdin.read()))))
"""


def test_every_task_played_in_shuffled_order_in_one_process_is_what_a_fresh_process_gives():
    """Nothing of one episode, check or diagnosis reaches another: not a default argument, not module data."""
    tasks = tasks_by_id()
    order = [
        (task_id, kind)
        for task_id, task in sorted(tasks.items())
        for kind in STATE_KINDS
        if PERTURBATIONS[kind](task, ground_truth_turns(task), random.Random(f"0:{task_id}:{kind}")) is not None
    ]
    assert len(order) > 2400  # 800 tasks x 3 kinds, 50 bookings, 32 mentions
    fresh = subprocess.run(
        [sys.executable, "-c", PLAY_IN_ORDER, str(Path(__file__).parent)],
        input=json.dumps(order),
        capture_output=True,
        text=True,
        check=True,
    )
    expected = json.loads(fresh.stdout)
    got = outcomes(random.Random(1).sample(order, len(order)))  # after whatever this process played before
    differ = [key for key in expected if got[key] != expected[key]]
    assert not differ, (len(differ), differ[:5])
    assert sum(reward for reward, *_ in expected.values()) > 800  # not vacuous: ground truths pass


def test_the_kits_refusals_differ_from_bfcl_only_by_failing_what_bfcl_evals():
    result = run_differential([k for k in REFUSAL_KINDS if k in KINDS["qwen_fc"]], limit=16)["kinds"]
    for kind, tally in result.items():
        assert tally["episodes"] > 0, kind
        assert tally["agree"] + tally["bfcl_passed"] - tally["kit_passed"] == tally["episodes"], kind
    # code in a name or key: BFCL evals it and runs the call it spells, the kit refuses it
    assert result["code_in_name"]["kit_passed"] == result["code_in_key"]["kit_passed"] == 0
    assert result["code_in_key"]["bfcl_passed"] > 0


def test_the_command_fails_only_on_a_difference_outside_the_refusal_kinds(capsys):
    assert main(["--kinds", "ground_truth", "code_in_name", "--limit", "2"]) == 0  # code_in_name differs
    assert "code_in_name" in capsys.readouterr().out


def test_the_reference_is_bfcls_loop_answered_by_the_script():
    task = tasks_by_id()["multi_turn_base_0"]
    first = format_call("cd", {"folder": "document"})
    # the script answers every query; a message that decodes to no call ends BFCL's turn
    played = bfcl_verdict(task, [[first], [], [], []])
    assert (played.valid, played.error_type) == (False, "multi_turn:instance_state_mismatch")
    assert len(played.prompts) == 5 and played.prompts[0].startswith("<|im_start|>system\n# Tools\n")
    for side in (bfcl_verdict, kit_verdict):
        played = side(task, [[DONE_TEXT]] * 4)
        assert (played.valid, played.error_type) == (False, "multi_turn:empty_turn_model_response")


def test_a_message_bfcls_prompt_cannot_write_back_fails_the_entry_at_the_next_query():
    task = tasks_by_id()["multi_turn_base_0"]
    no_arguments = '<tool_call>\n{"name": "cd"}\n</tool_call>'
    gt = [[format_call(n, a) for n, a in calls] for calls in ground_truth_turns(task)]
    for script, valid in (([[no_arguments], *gt[1:]], False), ([*gt[:-1], [*gt[-1], no_arguments]], True)):
        for side in (bfcl_verdict, kit_verdict):
            played = side(task, script)
            assert played.valid == valid, (side.__name__, played)
            assert valid or played.error_type == "multi_turn:inference_error"


def _engine_prompts(task, script, renderer, protocol=QWEN_FC) -> tuple[list[list[int]], object]:
    """The token ids the rollout engine's bookkeeping lays down before each model query of a scripted
    episode (the scripted messages stand in for sampled tokens), and its trajectory."""
    limit = 1_000_000
    cfg = RolloutConfig(
        max_new_tokens=limit, max_prompt_tokens=limit, max_response_tokens=limit, max_total_tokens=limit
    )
    sequences, env = Sequences(renderer, cfg), Episode(task, protocol=protocol)
    live = sequences.start(0, env, seed=0)
    prompts = []
    for k in range(len(task.turns)):
        sent = 0
        while not env.done and len(env.turns) == k + 1:
            text = script[k][sent] if sent < len(script[k]) else DONE_TEXT
            sent += 1
            prompts.append(live.traj.input_ids[live.traj.base :])
            for token in renderer.encode(text) + [renderer.end_of_turn_id]:
                sequences.sampled(live, token, 0.0)
            sequences.end_message(live)
    return prompts, live.traj


@pytest.mark.parametrize("category", ["base", "miss_func", "miss_param", "long_context"])
def test_the_engine_lays_down_bfcls_prompt_token_for_token(category):
    """In `model.tool_format: bfcl` the rollout engine's token ids before each query are the tokenization of
    the prompt BFCL's handler formats, for ground-truth episodes (the kit's ChatML tokenizer stands in for
    Qwen's, which cannot be downloaded here: the texts are equal, so any tokenizer gives equal ids for them)."""
    renderer = ChatRenderer(tiny_tokenizer(), "bfcl")
    for task in load_tasks([category])[::40]:
        script = [[format_call(n, a) for n, a in calls] if calls else [] for calls in ground_truth_turns(task)]
        kit, trajectory = _engine_prompts(task, script, renderer)
        bfcl = [renderer.encode(p) for p in bfcl_verdict(task, script).prompts]
        assert kit == bfcl and trajectory.exact, task.id


@pytest.mark.parametrize("kind", ["reasoning_before_calls", "think_block", "duplicated_call", "prose_around_calls"])
def test_where_bfcls_history_writes_a_message_otherwise_the_engine_goes_on_from_bfcls_prompt(kind):
    """BFCL's history drops a thinking model's reasoning at the next user turn, a <think> block around calls
    and the prose around calls, and writes two equal calls with no newline between them. The engine then
    begins a new segment with BFCL's prompt: every prompt it lays down is BFCL's, token for token, and the
    segments hold every token the model sampled, once."""
    renderer = ChatRenderer(tiny_tokenizer(), "bfcl")
    segmented = 0
    for task in load_tasks()[::50]:
        script = PERTURBATIONS[kind](task, ground_truth_turns(task), random.Random(f"0:{task.id}:{kind}"))
        kit, trajectory = _engine_prompts(task, script, renderer)
        bfcl = [renderer.encode(p) for p in bfcl_verdict(task, script).prompts]
        assert kit == bfcl and trajectory.exact, task.id
        segmented += bool(trajectory.segments)
        sampled = [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask, strict=True) if m]
        sent = "".join(m["content"] + "<|im_end|>" for m in trajectory.messages if m["role"] == "assistant")
        assert renderer.decode(sampled) == sent and len(sampled) == trajectory.n_sampled, task.id
    assert segmented > 0


def test_a_new_segment_starts_where_the_old_one_had_no_room_left():
    """A long reasoning fills the first segment to its limit; BFCL's next prompt drops it and fits, so the
    episode goes on in a new segment instead of ending truncated."""
    renderer = ChatRenderer(tiny_tokenizer(), "bfcl")
    task = tasks_by_id()["multi_turn_base_0"]
    thinking = f"<think>\n{'plan ' * 400}\n</think>\n\n{DONE_TEXT}"
    prompt = len(renderer.prompt_ids(*Episode(task).reset()))
    message = renderer.encode(thinking) + [renderer.end_of_turn_id]
    limit = prompt + len(message) + 2 + len(renderer.close_ids)  # no room for the next user turn after it
    cfg = RolloutConfig(
        max_new_tokens=len(message), max_prompt_tokens=prompt, max_response_tokens=10**6, max_total_tokens=limit
    )
    sequences, env = Sequences(renderer, cfg), Episode(task)
    live = sequences.start(0, env, seed=0)
    for token in message:
        sequences.sampled(live, token, 0.0)
    assert sequences.end_message(live) and not live.traj.truncated
    assert live.traj.segments == [prompt + len(message)]
    assert live.traj.input_ids[live.traj.base :] == renderer.prompt_ids(live.traj.messages, live.traj.tools)


def test_bad_options_are_one_line_naming_the_option(capsys):
    assert main(["--kinds", "bogus"]) == 2
    assert "error: --kinds: no kinds ['bogus'] for qwen_fc; its kinds: ground_truth" in capsys.readouterr().err
    assert main(["--protocol", "llama_prompt", "--kinds", "one_line_tags"]) == 2
    assert "no kinds ['one_line_tags'] for llama_prompt" in capsys.readouterr().err
    assert seal_main(["oracle", "--differential", "--limit", "1"]) == 2  # the command it once was names this file
    assert "tests/differential.py" in capsys.readouterr().err


def test_a_limit_below_zero_is_one_line_not_a_run_of_nothing(capsys):
    from seal_mini.__main__ import main as seal_main

    for command, argv in ((main, ["--limit", "-1"]), (seal_main, ["diagnose-check", "--limit", "-1"])):
        try:
            command(argv)
            raise AssertionError(f"{argv} ran")
        except SystemExit as e:  # argparse's own one-line refusal
            assert e.code == 2
        assert "argument --limit: must be >= 0, got -1" in capsys.readouterr().err, argv


def test_without_the_optional_extra_the_command_says_what_to_install(capsys, monkeypatch):
    import differential

    monkeypatch.setattr(differential, "_installed", lambda name: name != "overrides")
    differential.reference_modules.cache_clear()
    try:
        assert differential.main(["--limit", "1"]) == 2
    finally:
        differential.reference_modules.cache_clear()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "pip install -r requirements-ood.txt" in err


# --- BFCL's LlamaHandler (ToolACE-2): a Python call list, BFCL's own system prompt -------------------------

LLAMA_CI_KINDS = (
    "ground_truth",
    "ground_truth_stepwise",
    "dropped_call",
    "wrong_value",
    "withheld_before_reveal",
    "step_limit_in_last_turn",
    "method_name_in_string",  # the checker's names are ToolACE's, not Qwen's
    "checker_instance_attribute",
    *(k for k in KINDS["llama_prompt"] if k.startswith("call_list_") and k not in REFUSAL_KINDS),
)


def test_kit_and_bfcl_agree_on_the_llama_protocol_of_toolace():
    """The first 25 tasks of each category under BFCL's LlamaHandler: every verdict and every prompt (the
    command plays all 800: `tests/differential.py --protocol llama_prompt`)."""
    result = run_differential(LLAMA_CI_KINDS, limit=25, protocol="llama_prompt")["kinds"]
    for kind, tally in result.items():
        assert tally["episodes"] > (1 if kind in ("call_list_tuples_for_lists", "call_list_unary_plus") else 10), kind
        assert tally["agree"] == tally["episodes"], (kind, tally["disagreements"])
        assert tally["same_prompts"] == tally["episodes"], (kind, tally["prompt_differences"])
    assert result["ground_truth"]["bfcl_passed"] == 100
    # not vacuous: BFCL's decoder drops a positional argument, ends the turn on prose, reads +N as -N
    assert result["call_list_positional_argument"]["bfcl_passed"] < result["call_list_positional_argument"]["episodes"]
    assert result["call_list_with_prose"]["bfcl_passed"] == result["call_list_unary_plus"]["bfcl_passed"] == 0
    assert result["call_list_without_brackets"]["bfcl_passed"] == result["call_list_without_brackets"]["episodes"]
    # the operation the kit does not evaluate: BFCL runs the call, the kit's turn ends
    refused = run_differential(["call_list_operation"], limit=8, protocol="llama_prompt")["kinds"][
        "call_list_operation"
    ]
    assert refused["episodes"] > 0 and refused["kit_passed"] == 0 and refused["bfcl_passed"] == refused["episodes"]


def llama_tokenizer():
    """The tiny tokenizer with Llama 3's special tokens (ToolACE-2's cannot be downloaded here; equal texts
    give equal ids whatever the tokenizer)."""
    tokenizer = copy.deepcopy(tiny_tokenizer())
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


@pytest.mark.parametrize("category", ["base", "miss_func", "long_context"])
def test_the_engine_lays_down_bfcls_llama_prompt_token_for_token(category):
    renderer = ChatRenderer(llama_tokenizer(), "bfcl_llama")
    assert renderer.close_text == "<|eot_id|>"
    for task in load_tasks([category])[::50]:
        script = [[TOOLACE.write(calls)] if calls else [] for calls in ground_truth_turns(task)]
        kit, trajectory = _engine_prompts(task, script, renderer, TOOLACE)
        bfcl = [renderer.encode(p) for p in bfcl_verdict(task, script, TOOLACE).prompts]
        assert kit == bfcl and trajectory.exact, task.id
        assert any(trajectory.env.checker_input()) and kit_verdict(task, script, TOOLACE).valid
