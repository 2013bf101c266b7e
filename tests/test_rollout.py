"""The rollout engine on real BFCL tasks with the tiny random model (CPU, no network).

Scripted episodes: a logits hook makes the model "sample" given messages (ground-truth calls, broken
calls, a stop on another end token), while everything else (batching, caches, templates, the env, the
masks) runs as in training. The hook records what it forced, independently of the engine's records.
"""

import dataclasses
import os
from collections import defaultdict
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from seal_mini.config import ConfigError, load_config
from seal_mini.engine.logprobs import token_logprobs
from seal_mini.engine.policy import load_policy
from seal_mini.engine.render import ChatRenderer
from seal_mini.engine.rollout import RolloutStats, run_rollouts
from seal_mini.engine.tiny import tiny_tokenizer
from seal_mini.envs.bfcl import NEW_TOOLS_USER_TEXT, tasks_by_id
from seal_mini.envs.episode import TRUNCATED, Episode
from seal_mini.envs.scripted import ground_truth_turns, scripted_messages
from seal_mini.envs.verifier import check

TASKS = tasks_by_id(["base", "miss_func"])


@pytest.fixture(scope="module")
def policy():
    return load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))


def rollout_cfg(**kw):
    cfg = load_config(None, ["rollout.max_new_tokens=512"]).rollout
    return dataclasses.replace(cfg, **kw)


class Script:
    """Logits hook: each env's model calls produce the given token lists, in order (the last repeats)."""

    def __init__(self, scripts: dict[int, list[list[int]]]):
        self.scripts = scripts
        self.message = {}
        self.forced = defaultdict(list)  # env index -> list of forced token lists, one per model call

    def __call__(self, rows, sampled_so_far, logits):
        out = torch.full_like(logits, float("-inf"))
        for row, (env, so_far) in enumerate(zip(rows, sampled_so_far, strict=True)):
            if not so_far:  # a new model call begins
                self.message[env] = self.message.get(env, -1) + 1
                self.forced[env].append([])
            messages = self.scripts[env]
            token = messages[min(self.message[env], len(messages) - 1)][len(so_far)]
            out[row, token] = 0.0
            self.forced[env][-1].append(token)
        return out


def message(policy, text, end="<|im_end|>"):
    return policy.renderer.encode(text) + [policy.tokenizer.convert_tokens_to_ids(end)]


def oracle_script(policy, task):
    return [message(policy, m) for turn in ground_truth_turns(task) for m in scripted_messages(turn)]


def sampled_spans(traj):
    spans, start = [], None
    for i, m in enumerate(traj.loss_mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def first_message_of_each_turn(traj, forgiven: tuple[int, ...] = ()) -> list[int]:
    """Where each task turn's first assistant message begins, read from the conversation: the k-th sampled
    span (with the starts of `forgiven` messages, out of the loss) is the k-th assistant message, and its
    turn is the count of user messages before it, less one."""
    turns, users = [], 0
    for m in traj.messages:
        users += m["role"] == "user"
        if m["role"] == "assistant":
            turns.append(users - 1)
    starts = sorted([s for s, _ in sampled_spans(traj)] + list(forgiven))
    return [starts[turns.index(k)] for k in range(max(turns) + 1)]


def check_exact(policy, traj, forced):
    """Loss-mask-1 positions are exactly the forced tokens; the rest is the template's rendering."""
    r, ids = policy.renderer, traj.input_ids
    spans = sampled_spans(traj)
    assert [ids[s:e] for s, e in spans] == forced
    assert sum(traj.loss_mask) == traj.n_sampled == sum(len(f) for f in forced)
    assert len(ids) == len(traj.loss_mask) == len(traj.old_logprobs)
    for s, e in spans:
        assert r.decode(ids[:s]).endswith("<|im_start|>assistant\n")  # each call starts a template turn
        if ids[e - 1] != r.end_of_turn_id:  # cut, or stopped by another end token: closed, not sampled
            assert ids[e] == r.end_of_turn_id and traj.loss_mask[e] == 0
    assert all(lp < 0 for lp, m in zip(traj.old_logprobs, traj.loss_mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(traj.old_logprobs, traj.loss_mask, strict=True) if not m)
    assert traj.exact and r.decode(ids) == r.render(traj.messages, traj.tools)


def test_scripted_episodes_tool_calls_errors_reveal_and_other_end_token(policy):
    base, reveal, two_turns = TASKS["multi_turn_base_50"], TASKS["multi_turn_miss_func_50"], TASKS["multi_turn_base_11"]
    broken = [
        message(policy, '<tool_call>\n{"name": "cd", "arguments": {"no_such_argument": 1}}\n</tool_call>'),
        message(policy, '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>'),
        message(policy, "I could not do that."),
        message(policy, "Done.", end="<|endoftext|>"),  # stops on eos, not on the template's <|im_end|>
    ]
    script = Script({0: oracle_script(policy, base), 1: oracle_script(policy, reveal), 2: broken})
    envs = [Episode(base), Episode(reveal), Episode(two_turns)]
    trajs = run_rollouts(policy, envs, rollout_cfg(), 1.0, 0, logits_hook=script)

    for i, traj in enumerate(trajs):
        check_exact(policy, traj, script.forced[i])
        assert not traj.truncated and traj.env.done and traj.prompt_len > 1000
        assert traj.turn_starts == first_message_of_each_turn(traj)  # where a turn-level weight begins
    assert [len(t.turn_starts) for t in trajs] == [len(base.turns), len(reveal.turns), 2]
    assert [t.task_id for t in trajs] == [base.id, reveal.id, two_turns.id]

    # The ground truth, sampled token by token through the engine, passes the official checker.
    for traj, task in ((trajs[0], base), (trajs[1], reveal)):
        assert check(task, traj.env.checker_input()).reward == 1.0
    assert any(m["role"] == "user" and m["content"].endswith(NEW_TOOLS_USER_TEXT) for m in trajs[1].messages)
    assert sum(m["role"] == "tool" for m in trajs[0].messages) >= 1

    errors = [m["content"] for m in trajs[2].messages if m["role"] == "tool"]
    assert len(errors) == 2 and all(e.startswith("Error") for e in errors)
    assert trajs[2].messages[-1] == {"role": "assistant", "content": "Done.<|endoftext|>"}
    assert trajs[2].env.turns[-1].final_text == "Done."  # the env never sees the end token


def test_cut_messages_and_a_total_length_truncation(policy):
    task, too_long = TASKS["multi_turn_base_11"], TASKS["multi_turn_base_45"]
    prompt = len(policy.renderer.prompt_ids(*Episode(task).reset()))
    cfg = rollout_cfg(max_new_tokens=16, max_total_tokens=prompt + 60, max_prompt_tokens=prompt + 59)
    script = Script({0: oracle_script(policy, task)})
    trajs = run_rollouts(policy, [Episode(task), Episode(too_long)], cfg, 0.0, logits_hook=script)

    cut = trajs[0]
    check_exact(policy, cut, script.forced[0])
    assert cut.truncated and cut.env.ended_by == TRUNCATED and cut.n_cut >= 1
    assert len(cut.input_ids) <= cfg.max_total_tokens
    assert all(len(f) <= 16 for f in script.forced[0])
    # the env got the cut text: a call whose closing tag never came, which BFCL reads as no call at all
    assert any("never closed" in e.error for t in cut.env.turns for e in t.events)

    skipped = trajs[1]  # its first prompt alone is over the limit: no tokens at all
    assert skipped.truncated and skipped.env.done and skipped.input_ids == [] and not skipped.exact


def test_response_budget_truncates_in_mid_message(policy):
    task = TASKS["multi_turn_base_50"]
    script = Script({0: oracle_script(policy, task)})
    (traj,) = run_rollouts(policy, [Episode(task)], rollout_cfg(max_response_tokens=20), 0.0, logits_hook=script)
    check_exact(policy, traj, script.forced[0])
    assert traj.truncated and traj.n_sampled == 20 and traj.n_messages == 1
    assert traj.env.turns[0].steps == []  # the cut call was never executed
    assert traj.turn_starts == [traj.prompt_len]  # the one turn it began; the others were never reached


class Breaks(Episode):
    """An environment with a defect: its step raises on the second message (Episode.step never should)."""

    def step(self, text):
        self.messages_seen = getattr(self, "messages_seen", 0) + 1
        if self.messages_seen == 2:
            raise RecursionError("maximum recursion depth exceeded")
        return super().step(text)


def test_an_environment_that_raises_ends_its_episode_not_the_rollouts(policy, capsys):
    task = TASKS["multi_turn_base_50"]
    script = Script({0: oracle_script(policy, task), 1: oracle_script(policy, task)})
    broken, fine = run_rollouts(policy, [Breaks(task), Episode(task)], rollout_cfg(), 0.0, logits_hook=script)
    assert broken.truncated and broken.env.ended_by == TRUNCATED and broken.n_messages == 2
    assert check(task, fine.env.checker_input()).reward == 1.0  # the other episode ran to its end
    err = capsys.readouterr().err
    assert "[rollout] warning: multi_turn_base_50: the environment raised RecursionError" in err


def test_prompt_mode_renders_tools_itself(policy):
    prompt_policy = dataclasses.replace(policy, renderer=ChatRenderer(policy.tokenizer, "prompt"))
    task = TASKS["multi_turn_base_50"]
    script = Script({0: oracle_script(policy, task)})
    (traj,) = run_rollouts(prompt_policy, [Episode(task)], rollout_cfg(), 0.0, logits_hook=script)
    check_exact(prompt_policy, traj, script.forced[0])
    text = prompt_policy.renderer.decode(traj.input_ids)
    assert "<tools>" in text and "<tool_response>" in text and "<|im_start|>tool" not in text
    assert check(task, traj.env.checker_input()).reward == 1.0


@pytest.fixture(scope="module")
def sampled(policy):
    envs = lambda: [Episode(TASKS[i]) for i in ("multi_turn_base_50", "multi_turn_miss_func_50") * 2]  # noqa: E731
    cfg = rollout_cfg(max_new_tokens=24)
    stats = RolloutStats()
    first = run_rollouts(policy, envs(), cfg, 1.0, 7, stats=stats)
    again = run_rollouts(policy, envs(), cfg, 1.0, 7)
    other = run_rollouts(policy, envs(), cfg, 1.0, 8)
    return first, again, other, stats


def padded(trajs) -> tuple[torch.Tensor, ...]:
    """Trajectories as right-padded tensors: input ids, attention mask, loss mask, sampling-time log-probs."""
    width = max(len(t.input_ids) for t in trajs)
    pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs])  # noqa: E731
    return (
        pad([t.input_ids for t in trajs], 0),
        pad([[1] * len(t.input_ids) for t in trajs], 0),
        pad([t.loss_mask for t in trajs], 0),
        pad([t.old_logprobs for t in trajs], 0.0),
    )


def test_training_forward_reproduces_sampling_time_log_probs(policy, sampled):
    trajs = sampled[0]
    ids, attention, loss_mask, old = padded(trajs)
    with torch.no_grad():
        new = token_logprobs(policy.model, ids, attention, loss_mask, chunk=64)
    diff = (new - old).abs().max().item()
    print(f"max |training-time - sampling-time log-prob| = {diff:.2e} over {int(loss_mask.sum())} tokens")
    assert loss_mask.sum() > 100 and diff < 1e-4


def test_old_log_probs_score_the_tempered_distribution_the_sampler_drew_from(policy):
    """At temperature 0.7 the sampling-time log-probs are those of softmax(logits / 0.7), and the training
    forward at that temperature reproduces them; at temperature 1 it does not."""
    envs = [Episode(TASKS[i]) for i in ("multi_turn_base_50", "multi_turn_miss_func_50")]
    trajs = run_rollouts(policy, envs, rollout_cfg(max_new_tokens=24), 0.7, 7)
    ids, attention, loss_mask, old = padded(trajs)
    with torch.no_grad():
        tempered = token_logprobs(policy.model, ids, attention, loss_mask, chunk=64, temperature=0.7)
        plain = token_logprobs(policy.model, ids, attention, loss_mask, chunk=64)
    assert loss_mask.sum() > 20
    assert (tempered - old).abs().max().item() < 1e-4
    assert (plain - old).abs().max().item() > 1e-2


def test_an_unreadable_message_the_interface_lets_the_model_retry_is_out_of_the_loss(policy):
    """parse_retry: the unreadable message stays in the sequence (the model saw it, and the error after it)
    with loss_mask 0; the corrected call and the answer that follow carry the loss, in the engine and in the
    plain reference rollout alike."""
    from reference import reference_rollout

    from seal_mini.core.interface import Interface, InterfaceState

    task = TASKS["multi_turn_base_50"]
    good = oracle_script(policy, task)
    broken = message(policy, '<tool_call>\n{"name": "ls", "arguments": {}\n</tool_call>')
    messages = [broken] + good
    state = InterfaceState(error_feedback=True, parse_retry=True)
    cfg = rollout_cfg()
    (traj,) = run_rollouts(policy, [Interface(Episode(task), state)], cfg, 1.0, 0, logits_hook=Script({0: messages}))
    ref = reference_rollout(policy, Interface(Episode(task), state), cfg, 1.0, 0, logits_hook=Script({0: messages}))
    assert traj.env.turns[0].retried == 1
    spans = sampled_spans(traj)
    assert [traj.input_ids[s:e] for s, e in spans] == good  # every forced message but the forgiven one
    start = next(i for i in range(len(traj.input_ids)) if traj.input_ids[i : i + len(broken)] == broken)
    assert traj.loss_mask[start : start + len(broken)] == [0] * len(broken)
    assert traj.n_sampled == sum(len(m) for m in messages)
    assert ref.loss_mask == traj.loss_mask and ref.input_ids == traj.input_ids
    assert check(task, traj.env.checker_input()).reward == 1.0
    # the forgiven message is its turn's first: its turn's tokens (and turn-level weight) start there
    assert traj.turn_starts[0] == start == traj.prompt_len and len(traj.turn_starts) == len(task.turns)
    assert traj.turn_starts == ref.turn_starts == first_message_of_each_turn(traj, forgiven=(start,))


def test_sampling_is_reproducible_and_sequences_are_exact(policy, sampled):
    first, again, other, stats = sampled
    assert [t.input_ids for t in first] == [t.input_ids for t in again]
    assert [t.old_logprobs for t in first] == [t.old_logprobs for t in again]
    assert [t.input_ids for t in first] != [t.input_ids for t in other]
    for t in first:
        assert t.exact and policy.renderer.decode(t.input_ids) == policy.renderer.render(t.messages, t.tools)
        assert t.n_sampled <= 24 * t.n_messages
    # every token went through the model at most once; two samples of each prompt share its prefill
    assert stats.model_tokens < 0.6 * stats.sequence_tokens and stats.concurrency == 4


def test_the_same_episode_object_twice_is_refused(policy):
    env = Episode(TASKS["multi_turn_base_50"])
    with pytest.raises(ValueError, match="more than once"):
        run_rollouts(policy, [env, env], rollout_cfg(), 0.0)


def test_batched_and_one_at_a_time_greedy_rollouts_agree(policy):
    ids = ("multi_turn_base_50", "multi_turn_base_11", "multi_turn_miss_func_50")
    runs = []
    for slots in (3, 1):
        cfg = rollout_cfg(max_new_tokens=8, max_concurrent=slots)
        runs.append(run_rollouts(policy, [Episode(TASKS[i]) for i in ids], cfg, 0.0))
    for a, b in zip(*runs, strict=True):
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        assert max(abs(x - y) for x, y in zip(a.old_logprobs, b.old_logprobs, strict=True)) < 1e-4


class ToyEnv:
    """Not an Episode: anything with reset / step / truncate / done can be rolled out."""

    def __init__(self):
        self.done = False

    def reset(self):
        self.turn, self.done = 0, False
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}], []

    def step(self, text):
        if "<tool_call>" in text:
            return SimpleNamespace(observation=[{"role": "tool", "content": "ok"}], turn_done=False, done=False)
        self.turn += 1
        self.done = self.turn >= 2
        observation = [] if self.done else [{"role": "user", "content": "Again."}]
        return SimpleNamespace(observation=observation, turn_done=True, done=self.done)

    def truncate(self):
        self.done = True


def test_any_env_with_the_protocol_and_a_template_that_strips_whitespace(policy):
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "message['content'] + '<|im_end|>", "message['content'] | trim + '<|im_end|>"
    )
    stripping = dataclasses.replace(policy, renderer=ChatRenderer(tokenizer, "template"))
    texts = ["  hi <tool_call>{}</tool_call>  \n", "hi again \n", "bye"]
    script = Script({0: [message(policy, t) for t in texts]})
    (traj,) = run_rollouts(stripping, [ToyEnv()], rollout_cfg(), 0.0, logits_hook=script)
    # The sampled tokens stay exactly as sampled, the rest follows the template, and the text differs
    # from the template's rendering only where it stripped the assistant's whitespace.
    assert [traj.input_ids[s:e] for s, e in sampled_spans(traj)] == script.forced[0]
    assert not traj.exact and traj.env.done and [m["role"] for m in traj.messages][-1] == "assistant"
    text = stripping.renderer.decode(traj.input_ids)
    assert text.count("<|im_start|>assistant\n") == 3 and "<|im_start|>tool\nok<|im_end|>" in text
    squeeze = lambda t: t.replace(" ", "").replace("\n", "")  # noqa: E731
    rendered = stripping.renderer.render(traj.messages, traj.tools)
    assert squeeze(text) == squeeze(rendered) and text != rendered


def test_engine_refuses_an_unsloth_patched_model(monkeypatch):
    """unsloth's forward returns a fresh KV cache instead of growing the engine's: refuse it clearly."""
    from seal_mini.engine.logprobs import causal_lm
    from seal_mini.engine.rollout import _check_cache_layout

    policy = load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))
    decoder_class = type(causal_lm(policy.model).model)

    def patched_forward(self, *args, **kwargs):  # stands in for unsloth's fast forward
        raise AssertionError("never called")

    patched_forward.__module__ = "unsloth.models.llama"
    monkeypatch.setattr(decoder_class, "forward", patched_forward)
    with pytest.raises(ConfigError, match="use model.backend=hf"):
        _check_cache_layout(policy.model)


def sampled_episodes(policy, slots: int, seed: int = 3) -> list:
    """16 episodes (8 tasks x 2 samples) sampled at temperature 1 with `slots` of them at once."""
    ids = [i for i in TASKS if i.endswith(("_1", "_2", "_3", "_4"))]
    assert len(ids) == 8
    cfg = rollout_cfg(max_new_tokens=12, max_response_tokens=48, max_concurrent=slots)
    envs = [Episode(TASKS[i]) for i in ids for _ in range(2)]
    stats = RolloutStats()
    trajs = run_rollouts(policy, envs, cfg, 1.0, seed, stats=stats)
    assert stats.concurrency == slots
    return trajs


def test_samples_do_not_depend_on_how_many_episodes_run_at_once(policy):
    """Each episode draws from its own stream (seed, task, sample): 1, 3 or 16 at once, the same tokens."""
    runs = {slots: sampled_episodes(policy, slots) for slots in (1, 3, 16)}
    one = runs[1]
    assert len({tuple(t.input_ids) for t in one}) == 16  # two samples of a task differ: their own streams
    for slots in (3, 16):
        for a, b in zip(one, runs[slots], strict=True):
            assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask and a.messages == b.messages
            assert max(abs(x - y) for x, y in zip(a.old_logprobs, b.old_logprobs, strict=True)) < 1e-4
    assert [t.input_ids for t in sampled_episodes(policy, 3, seed=4)] != [t.input_ids for t in one]


def test_a_part_of_a_round_samples_as_the_whole_round_does(policy):
    """A rank playing some episodes of a round passes their sample numbers in the whole round; it then draws
    what one process playing the round draws (here a task that appears twice, as when a step straddles two
    epochs, and whose second group went to another rank)."""
    cfg = rollout_cfg(max_new_tokens=12, max_response_tokens=48)
    ids = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_1"]
    whole = run_rollouts(policy, [Episode(TASKS[i]) for i in ids for _ in range(2)], cfg, 1.0, (5, 0))
    part = run_rollouts(policy, [Episode(TASKS[ids[2]]) for _ in range(2)], cfg, 1.0, (5, 0), samples=[2, 3])
    assert [t.input_ids for t in part] == [t.input_ids for t in whole[4:]]
    assert whole[4].input_ids != whole[0].input_ids  # the second group of a task has streams of its own
    default = run_rollouts(policy, [Episode(TASKS[ids[2]]) for _ in range(2)], cfg, 1.0, (5, 0))
    assert [t.input_ids for t in default] == [t.input_ids for t in whole[:2]]  # without samples: 0, 1


class OutOfMemoryAbove:
    """Makes every model forward with more than `rows` sequences raise CUDA's out-of-memory error (after
    `after` forwards have run), as a card too small for that batch would."""

    def __init__(self, model, rows: int, after: int = 0):
        self.rows, self.after, self.forwards, self.raised = rows, after, 0, 0
        decoder = model.get_base_model().model
        self.hook = decoder.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.forwards += 1
        if kwargs["input_ids"].shape[0] > self.rows and self.forwards > self.after:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


class CountingEpisode(Episode):
    def reset(self):
        self.resets = getattr(self, "resets", 0) + 1
        return super().reset()


def test_out_of_memory_in_a_wave_redoes_the_unfinished_episodes_with_fewer_slots(capsys):
    policy = load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))
    ids = [i for i in TASKS if i.endswith(("_1", "_2", "_3"))]
    cfg = rollout_cfg(max_new_tokens=12, max_response_tokens=48, max_concurrent=6)
    envs = [CountingEpisode(TASKS[i]) for i in ids]
    injected = OutOfMemoryAbove(policy.model, rows=1, after=50)  # some episodes finish before it strikes
    stats = RolloutStats()
    try:
        trajs = run_rollouts(policy, envs, cfg, 1.0, 5, stats=stats)
    finally:
        injected.hook.remove()
    warning = capsys.readouterr().err
    assert injected.raised >= 2 and stats.out_of_memory == injected.raised
    assert "6 -> 3 episodes at once" in warning and "3 -> 1 episodes at once" in warning
    assert policy.limits.max_concurrent == 1 and stats.concurrency == 1
    kept = [env for env in envs if env.resets == 1]
    assert kept and len(kept) < len(envs)  # finished ones were kept, the others started again
    # nothing lost, and the round is the one the smaller setting computes
    policy.limits.max_concurrent = 0
    again = run_rollouts(policy, [Episode(TASKS[i]) for i in ids], dataclasses.replace(cfg, max_concurrent=1), 1.0, 5)
    assert len(trajs) == len(envs) and all(t.env.done for t in trajs)
    for a, b in zip(trajs, again, strict=True):
        assert a.input_ids == b.input_ids and a.messages == b.messages


def test_eager_attention_gets_additive_masks_and_flash_attention_is_refused(policy):
    eager = load_policy(load_config(None, ["model.name=tiny-random", "device=cpu", "model.attn_implementation=eager"]))
    ids = ("multi_turn_base_50", "multi_turn_base_11", "multi_turn_miss_func_50")
    cfg = rollout_cfg(max_new_tokens=8, max_concurrent=3)
    a = run_rollouts(eager, [Episode(TASKS[i]) for i in ids], cfg, 0.0)
    b = run_rollouts(policy, [Episode(TASKS[i]) for i in ids], cfg, 0.0)
    for x, y in zip(a, b, strict=True):  # eager and sdpa compute the same attention
        assert x.input_ids == y.input_ids
        assert max(abs(p - q) for p, q in zip(x.old_logprobs, y.old_logprobs, strict=True)) < 1e-4
    eager.model.get_base_model().config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="use sdpa or eager"):
        run_rollouts(eager, [Episode(TASKS[ids[0]])], cfg, 0.0)


class Floods(ToyEnv):
    """A tool that answers with 10 MB of text."""

    def step(self, text):
        return SimpleNamespace(observation=[{"role": "tool", "content": "x" * 10_000_000}], turn_done=False, done=False)


def test_an_observation_too_long_to_fit_ends_the_episode_before_it_is_tokenized(policy, monkeypatch):
    """10 MB of tool output took about 20 s to tokenize before the limit cut it: a text of N characters
    needs at least N / max_token_chars tokens, so one that cannot fit is never handed to the tokenizer."""
    seen = []
    real = policy.renderer.continuation

    def spy(ids, before, new, *args):
        seen.append(sum(len(str(m.get("content") or "")) for m in new))
        return real(ids, before, new, *args)

    monkeypatch.setattr(policy.renderer, "continuation", spy)
    script = Script({0: [message(policy, "<tool_call>{}</tool_call>")]})
    (traj,) = run_rollouts(policy, [Floods()], rollout_cfg(max_total_tokens=4096), 0.0, logits_hook=script)
    assert traj.truncated and traj.env.done and traj.n_messages == 1
    assert seen and max(seen) < 1_000  # the flood never reached the tokenizer
    assert policy.renderer.max_token_chars >= max(len(policy.renderer.decode([i])) for i in range(200))
