"""The batched rollout engine against the reference rollout (one episode, one full forward per token).

Same episodes, same seeds: the engine (KV slots handed from episode to episode, a shared prompt prefix,
batched prefill with padding, decode across slots) must lay down the same tokens, loss_mask and messages,
stop and truncate at the same places, and give the same old log-probs as the plain loop in seal_mini.engine.reference, up to float rounding.

Tolerance on log-probs: 1e-5 (float32 on the CPU). The engine and the reference run the same weights on
the same tokens, but the engine's attention reads cached keys through masks, in batches with padding,
and the reference runs the whole sequence at once; float32 sums in another order differ by about 1e-6
here (printed: one float32 step at a log-prob of -8). A log-prob taken at the wrong position or for the
wrong token is off by far more: even under the nearly uniform tiny random model, neighbouring sampled tokens'
log-probs differ by over 1e-2 (asserted). Subtler faults are small too: a shared prompt prefix copied one KV
column short moved log-probs by about 2e-4, which a tolerance of 1e-4 would still catch, but only just.
"""

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from reference import reference_rollout

from seal_mini.config import load_config
from seal_mini.engine.policy import load_policy
from seal_mini.engine.render import ChatRenderer
from seal_mini.engine.rollout import RolloutStats, run_rollouts
from seal_mini.engine.sequences import Trajectory, sample_numbers, task_id
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import TRUNCATED, Episode
from seal_mini.envs.scripted import ground_truth_turns, scripted_messages

TASKS = tasks_by_id(["base", "miss_func"])
LOGPROB_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def policy():
    return load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))


def rollout_cfg(**kw):
    return dataclasses.replace(load_config(None, []).rollout, **kw)


class Script:
    """Logits hook: each episode's model calls sample the given token lists, in order (the last repeats).
    Only sampling sees it; old log-probs stay the model's own."""

    def __init__(self, scripts: dict[int, list[list[int]]]):
        self.scripts, self.calls = scripts, defaultdict(lambda: -1)

    def __call__(self, rows, sampled_so_far, logits):
        out = torch.full_like(logits, float("-inf"))
        for row, (env, so_far) in enumerate(zip(rows, sampled_so_far, strict=True)):
            if env not in self.scripts:
                out[row] = logits[row]  # not scripted: the model samples freely
                continue
            self.calls[env] += not so_far  # a new model call begins
            messages = self.scripts[env]
            out[row, messages[min(self.calls[env], len(messages) - 1)][len(so_far)]] = 0.0
        return out


def message(policy, text, end="<|im_end|>"):
    return policy.renderer.encode(text) + [policy.tokenizer.convert_tokens_to_ids(end)]


def both(policy, make_envs, cfg, temperature, seed, scripts=None) -> tuple[list[Trajectory], list[Trajectory], dict]:
    """The same episodes through run_rollouts and, one by one, through reference_rollout."""
    stats = RolloutStats()
    hook = Script(scripts) if scripts else None
    batched = run_rollouts(policy, make_envs(), cfg, temperature, seed, stats=stats, logits_hook=hook)
    envs = make_envs()
    samples = sample_numbers([task_id(env, i) for i, env in enumerate(envs)])
    hook = Script(scripts) if scripts else None
    reference = [
        reference_rollout(policy, env, cfg, temperature, seed, samples[i], i, logits_hook=hook)
        for i, env in enumerate(envs)
    ]
    return batched, reference, stats.summary() | {"pad_tokens": stats.pad_tokens}


def assert_same(batched: list[Trajectory], reference: list[Trajectory]) -> float:
    """Everything equal but the log-probs, which agree within LOGPROB_TOLERANCE; returns their largest gap."""
    gap = 0.0
    for i, (a, b) in enumerate(zip(batched, reference, strict=True)):
        where = f"episode {i} ({a.task_id})"
        assert a.input_ids == b.input_ids, f"{where}: tokens differ at {first_difference(a.input_ids, b.input_ids)}"
        assert a.loss_mask == b.loss_mask, f"{where}: loss_mask differs at {first_difference(a.loss_mask, b.loss_mask)}"
        assert a.messages == b.messages and a.tools == b.tools, where
        for name in ("task_id", "prompt_len", "truncated", "exact", "n_sampled", "n_messages", "n_cut", "turn_starts"):
            assert getattr(a, name) == getattr(b, name), f"{where}: {name} {getattr(a, name)} != {getattr(b, name)}"
        assert a.env.done and b.env.done, where
        assert len(a.old_logprobs) == len(b.old_logprobs) == len(a.input_ids), where
        assert all(x == 0.0 for x, m in zip(a.old_logprobs, a.loss_mask, strict=True) if not m), where
        assert all(x == 0.0 for x, m in zip(b.old_logprobs, b.loss_mask, strict=True) if not m), where
        for x, y in zip(a.old_logprobs, b.old_logprobs, strict=True):
            gap = max(gap, abs(x - y))
        assert gap < LOGPROB_TOLERANCE, f"{where}: old log-probs differ by {gap:.2e}"
    return gap


def first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_sampled_episodes_cut_by_max_new_tokens_and_the_response_limit(policy):
    """Free sampling at temperature 1: the tiny model never ends a message itself, so every message is cut at
    max_new_tokens, and the third meets the response limit exactly there (the limit ends the episode; the
    message is not a cut one handed to the env). 7 episodes on 4 slots, so prefills batch episodes of
    different lengths (padding), slots are handed on, and two samples of a task share a prompt."""
    names = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_3", "multi_turn_base_1"]
    names += ["multi_turn_miss_func_50", "multi_turn_base_4", "multi_turn_miss_func_51"]
    cfg = rollout_cfg(max_new_tokens=6, max_response_tokens=18, max_concurrent=4)
    batched, reference, stats = both(policy, lambda: [Episode(TASKS[n]) for n in names], cfg, 1.0, 7)
    gap = assert_same(batched, reference)
    print(f"largest |engine - reference| old log-prob gap {gap:.2e}; engine {stats}")

    # what the test claims to cover did happen
    assert stats["pad_tokens"] > 0 and stats["kv_pad_fraction"] > 0 and stats["concurrency"] == 4
    assert all(t.n_cut >= 1 for t in batched)
    by_response = [t for t in batched if t.n_sampled == cfg.max_response_tokens]
    assert by_response and all(t.truncated and t.env.ended_by == TRUNCATED for t in by_response)
    assert all(t.n_messages == 3 and t.n_cut == 2 for t in by_response)
    assert any(not t.truncated for t in batched)
    assert batched[0].input_ids != batched[3].input_ids  # two samples of a task: two streams
    # neighbouring sampled tokens' log-probs differ by far more than the tolerance (the tiny random model is
    # nearly uniform, so this is the smallest error a shift by one position could make)
    sampled = torch.tensor([x for t in batched for x, m in zip(t.old_logprobs, t.loss_mask, strict=True) if m])
    assert sampled.numel() > 50 and (sampled[1:] - sampled[:-1]).abs().median() > 1000 * LOGPROB_TOLERANCE


def test_sampled_episodes_ended_by_the_total_and_prompt_limits(policy):
    """max_total_tokens 8 above the longest prompt: one episode is cut in its first message, one in its second
    (a task whose first two prompts leave room for one message: BFCL's prompts moved which task that is),
    one has its next user turn refused for want of room; one prompt is over max_prompt_tokens."""
    prompt = lambda name: len(policy.renderer.prompt_ids(*Episode(TASKS[name]).reset()))  # noqa: E731
    names = ["multi_turn_base_11", "multi_turn_base_176", "multi_turn_base_54", "multi_turn_base_45"]
    longest = prompt(names[0])
    assert longest - 100 < prompt(names[1]) < prompt(names[2]) < longest < prompt(names[3])
    cfg = rollout_cfg(
        max_new_tokens=10, max_response_tokens=200, max_total_tokens=longest + 8, max_prompt_tokens=longest
    )
    batched, reference, stats = both(policy, lambda: [Episode(TASKS[n]) for n in names], cfg, 1.0, 7)
    gap = assert_same(batched, reference)
    print(f"largest |engine - reference| old log-prob gap {gap:.2e}; engine {stats}")

    assert all(t.truncated and t.env.ended_by == TRUNCATED for t in batched)
    first, second, no_room, over = batched
    assert first.n_messages == 1 and first.n_cut == 0 and len(first.input_ids) == cfg.max_total_tokens
    assert second.n_messages == 2 and second.n_cut == 1 and len(second.input_ids) == cfg.max_total_tokens
    assert no_room.n_messages == no_room.n_cut == 1 and len(no_room.input_ids) < cfg.max_total_tokens
    assert over.input_ids == [] and not over.exact


class Desk:
    """A small environment with one tool and short prompts (the reference's full forwards stay cheap): a call
    to `echo` returns its text, any other call an error; a message without a call ends the user turn; two
    user turns."""

    TOOL = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Return the text.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }

    def __init__(self):
        self.done = False

    def reset(self):
        self.turn, self.done = 0, False
        return [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "Echo hi."}], [self.TOOL]

    def step(self, text):
        if "<tool_call>" in text:
            result = "hi" if '"name": "echo"' in text else "Error: no such tool"
            return SimpleNamespace(observation=[{"role": "tool", "content": result}], done=False)
        self.turn += 1
        self.done = self.turn == 2
        return SimpleNamespace(observation=[] if self.done else [{"role": "user", "content": "Again."}], done=self.done)

    def truncate(self):
        self.done = True


@pytest.mark.parametrize("tool_format", ["template", "prompt"])
def test_scripted_tool_calls_errors_and_end_tokens(policy, tool_format):
    """Scripted messages through both, in both tool formats: on a small environment a call, a call that errs
    (the error comes back as an observation), a stop on another end token than the template's and a second
    user turn; with the template's tool format also a BFCL task's ground-truth call (a real tool result; its
    long prompt makes the reference's forwards slow, and the other format renders tools the same way)."""
    if tool_format == "prompt":
        renderer = ChatRenderer(policy.tokenizer, "prompt", extra_stop_ids=tuple(policy.renderer.stop_ids))
        policy = dataclasses.replace(policy, renderer=renderer)
    task = TASKS["multi_turn_base_50"]
    desk = [
        message(policy, '<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>'),
        message(policy, '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>'),
        message(policy, "Done.", end="<|endoftext|>"),  # stops on eos, not on the template's <|im_end|>
        message(policy, "Done again."),
    ]
    scripts = {0: desk, 1: [message(policy, m) for turn in ground_truth_turns(task) for m in scripted_messages(turn)]}
    make = lambda: [Desk(), Episode(task)] if tool_format == "template" else [Desk()]  # noqa: E731
    cfg = rollout_cfg(max_new_tokens=128, max_response_tokens=512)
    batched, reference, stats = both(policy, make, cfg, 1.0, 3, scripts)
    gap = assert_same(batched, reference)
    print(f"{tool_format}: largest |engine - reference| old log-prob gap {gap:.2e}; engine {stats}")

    small = batched[0]
    assert all(t.exact and not t.truncated for t in batched)
    if tool_format == "template":
        assert any(m["role"] == "tool" for m in batched[1].messages)  # the ground truth's call ran
    assert [m["content"] for m in small.messages if m["role"] == "tool"] == ["hi", "Error: no such tool"]
    assert {"role": "assistant", "content": "Done.<|endoftext|>"} in small.messages
    assert small.n_messages == 4 and small.n_cut == 0
