"""Backbones other than the recipes' Qwen2.5 through the same engine: a tiny random Qwen3 built from its
config (query / key norms, a head_dim wider than hidden / heads). The rollout engine must give the tokens
`model.generate` gives and the plain loop's (seal_mini.engine.reference) at 1, 3 and 8 episodes at once,
its KV slots must stay within their budget, and training must take a step and resume bit-exact
(tests/test_train.py runs its resume test on this model too)."""

import dataclasses

import pytest
import torch

from seal_mini.config import load_config
from seal_mini.engine.policy import load_policy
from seal_mini.engine.reference import reference_rollout
from seal_mini.engine.rollout import RolloutStats, kv_bytes_per_token, run_rollouts
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode

TASKS = list(tasks_by_id(["base"]).values())[:8]


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3):
    cfg = load_config(None, [f"model.name={tiny_qwen3}", "device=cpu", "model.tool_format=bfcl"])
    cfg.rollout = dataclasses.replace(cfg.rollout, max_new_tokens=12, max_response_tokens=36)
    return load_policy(cfg), cfg


@pytest.fixture(scope="module")
def plain(qwen3):
    """Each task's episode through the plain loop (one full forward per token), once for every n."""
    policy, cfg = qwen3
    return [reference_rollout(policy, Episode(task), cfg.rollout, 0.0, 0) for task in TASKS]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_engine_gives_generates_tokens_and_the_plain_loops(qwen3, plain, n):
    policy, cfg = qwen3
    assert type(policy.model.get_base_model()).__name__ == "Qwen3ForCausalLM"
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS[:n]], cfg.rollout, 0.0, 0)
    for task, traj, ref in zip(TASKS, trajs, plain, strict=False):
        assert traj.input_ids == ref.input_ids and traj.turn_starts == ref.turn_starts, task.id
        gap = max(abs(a - b) for a, b in zip(traj.old_logprobs, ref.old_logprobs, strict=True))
        assert gap < 1e-5, f"{task.id}: old log-probs differ by {gap:.1e}"
        first = traj.input_ids[traj.prompt_len :][: traj.loss_mask[traj.prompt_len :].index(0)]  # first message
        prompt = torch.tensor([traj.input_ids[: traj.prompt_len]])
        with torch.no_grad():
            out = policy.model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=len(first),
                do_sample=False,
                eos_token_id=list(policy.renderer.stop_ids),
            )
        assert out[0, traj.prompt_len :].tolist() == first, task.id
    assert sum(t.n_messages for t in trajs) > n  # episodes went on past their first message


def test_kv_slots_read_qwen3s_head_dim_and_stay_within_their_budget(qwen3, tiny_qwen3):
    from conftest import TINY_QWEN3

    policy, cfg = qwen3
    per_token = kv_bytes_per_token(policy.model.get_base_model().config, policy.dtype)
    c = TINY_QWEN3
    assert per_token == c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2 * 4  # not hidden / heads
    budget = 3 * cfg.rollout.max_total_tokens * per_token  # three slots
    rollout = dataclasses.replace(cfg.rollout, kv_budget_gb=budget / 2**30)
    stats = RolloutStats()
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS], rollout, 1.0, 0, stats=stats)
    assert stats.concurrency == 3 and stats.kv_cache_bytes <= budget and all(t.env.done for t in trajs)
