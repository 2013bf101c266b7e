"""The policy update alone (seal_mini.training.update): the policy gradient learns a rewarded output,
non-finite steps are skipped, every aggregation gives one gradient whatever the micro-batch, and the first
mini-batch's ratio is exactly 1 with recomputed old log-probs."""

import io
import math
from types import SimpleNamespace

import pytest
import torch
from test_distributed import NoSchedule, Recorder, perturb

from seal_mini.config import load_config
from seal_mini.core.grpo import group_advantages
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import run_rollouts
from seal_mini.training import update as update_module

TINY = ["model.name=tiny-random", "device=cpu", "model.gradient_checkpointing=false"]


class OneShot:
    """A one-message task: the reward depends only on the first token the model samples."""

    def __init__(self, i):
        self.task = SimpleNamespace(id=f"toy_{i}")
        self.done = False

    def reset(self):
        return [{"role": "user", "content": "Name a token."}], []

    def step(self, text):
        self.done = True
        return SimpleNamespace(observation=[], turn_done=True, done=True, events=[])

    def truncate(self):
        self.done = True


def test_policy_gradient_learns_a_rewarded_output():
    # Reward: the first sampled token is one of the ids divisible by 8 (chance 1/8). The LoRA also
    # covers lm_head: a tiny random model's RMS-normed hidden state cannot otherwise move its logits
    # far enough from uniform to make any token set likely.
    G, prompts = 8, 8
    cfg = load_config(
        overrides=TINY
        + [
            "rollout.max_new_tokens=1",
            f"rollout.group_size={G}",
            f"train.tasks_per_step={prompts}",
            f"train.mini_batch_tasks={prompts}",
            "train.micro_batch=64",
            "train.lr=0.02",
            "train.kl_coef=0.0",
            "lora.target_modules=[q_proj,v_proj,lm_head]",
        ]
    )
    torch.manual_seed(0)
    policy = load_policy(cfg)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    history = []
    for step in range(30):
        envs = [OneShot(i) for i in range(prompts) for _ in range(G)]
        trajs = run_rollouts(policy, envs, cfg.rollout, 1.0, step)
        rewards = [float(t.input_ids[t.prompt_len] % 8 == 0) for t in trajs]
        history.append(sum(rewards) / len(rewards))
        if history[-1] >= 0.9:
            break
        adv, _ = group_advantages(rewards, [i // G for i in range(len(trajs))])
        update_module.update(policy, optimizer, scheduler, trajs, adv, cfg)
    print("success per step:", [round(h, 3) for h in history])
    assert history[0] < 0.3  # near chance (1/8) before training
    assert history[-1] >= 0.9


# --- the update's switches and guards -------------------------------------------------------------------

UPDATE = TINY + [
    "rollout.group_size=2",
    "train.tasks_per_step=4",
    "train.mini_batch_tasks=2",
    "train.micro_batch=1",
    "train.kl_coef=0.01",
    "train.lr=0.01",
]


def _update_policy(overrides=()):
    """The tiny policy with every trainable weight moved off its start (LoRA B starts at 0), the same each call."""
    cfg = load_config(overrides=[*UPDATE, *overrides])
    torch.manual_seed(0)
    policy = load_policy(cfg, banner=False)
    perturb(policy)
    return cfg, policy


def _made_up_round(policy, n: int = 8):
    """n made-up trajectories (random tokens, 20 + 7i long, ~60% of them sampled) and advantages, from a seed."""
    from seal_mini.engine.sequences import Trajectory

    g = torch.Generator().manual_seed(1)
    trajs = []
    for i in range(n):
        length = 20 + 7 * i
        mask = [0] * 6 + [int(x) for x in (torch.rand(length - 6, generator=g) < 0.6)]
        old = [float(-8 + torch.randn(1, generator=g)) if m else 0.0 for m in mask]
        ids = torch.randint(0, len(policy.tokenizer), (length,), generator=g).tolist()
        trajs.append(Trajectory(f"t{i // 2}", None, ids, mask, old, 6, False, [], []))
    return trajs, torch.randn(n, generator=g)


def _weights(policy):
    return [p.detach().clone() for p in policy.trainable_parameters()]


def _no_schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)


def test_a_non_finite_loss_skips_its_step_and_only_its_step(capsys):
    # Mini-batch 1 (trajectories 4-7) gets a NaN advantage: its loss is NaN. The update takes mini-batch 0's
    # step only, exactly the step an update of mini-batch 0 alone takes, counts the skip and says so.
    cfg, policy = _update_policy()
    trajs, adv = _made_up_round(policy)
    adv[5] = float("nan")
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
    m = update_module.update(policy, optimizer, _no_schedule(optimizer), trajs, adv, cfg)
    assert m["losses/optimizer_steps"] == 1 and m["losses/skipped_steps"] == 1
    assert all(math.isfinite(v) for v in m.values())  # the skipped mini-batch is left out of the averages
    assert "mini-batch 1 has a non-finite loss (nan)" in capsys.readouterr().err
    assert all(p.grad is None for p in policy.trainable_parameters())  # its gradients are gone

    cfg_alone, alone = _update_policy()
    optimizer_alone = torch.optim.AdamW(alone.trainable_parameters(), lr=cfg.train.lr)
    m_alone = update_module.update(alone, optimizer_alone, _no_schedule(optimizer_alone), trajs[:4], adv[:4], cfg_alone)
    assert m_alone["losses/optimizer_steps"] == 1 and m_alone["losses/skipped_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(_weights(policy), _weights(alone), strict=True))
    assert optimizer.state_dict()["state"][0]["step"] == 1  # AdamW moved once


def test_a_non_finite_gradient_skips_every_step_and_the_weights_stay():
    # A finite loss whose gradient is NaN in one tensor (a hook poisons it): the gradient norm is NaN, so
    # no mini-batch takes its step and not one weight moves.
    cfg, policy = _update_policy()
    trajs, adv = _made_up_round(policy)
    params = policy.trainable_parameters()
    params[0].register_hook(lambda grad: grad * float("nan"))
    before = _weights(policy)
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr)
    scheduler = _no_schedule(optimizer)
    m = update_module.update(policy, optimizer, scheduler, trajs, adv, cfg)
    assert m["losses/optimizer_steps"] == 0 and m["losses/skipped_steps"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(policy), strict=True))
    assert scheduler.last_epoch == 0 and optimizer.state_dict()["state"] == {}


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_every_aggregation_gives_one_gradient_whatever_the_micro_batch(loss_agg):
    # The update divides by the counts of the whole mini-batch, so one sequence per forward or all of them
    # at once take the same step (a per-micro-batch count would weigh the sequences otherwise).
    grads = {}
    for micro_batch in (1, 4):
        cfg, policy = _update_policy([f"train.loss_agg={loss_agg}", f"train.micro_batch={micro_batch}"])
        trajs, adv = _made_up_round(policy)
        recorder = Recorder(policy.trainable_parameters())
        update_module.update(
            policy, recorder, _no_schedule(torch.optim.SGD(policy.trainable_parameters())), trajs, adv, cfg
        )
        grads[micro_batch] = recorder.grads
    assert len(grads[1]) == len(grads[4]) == 2
    for ours, theirs in zip(grads[1], grads[4], strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.abs().max() > 0
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(a.abs().max()))


def _sampled_round(cfg, policy):
    """A round of real rollouts (the one-message toy task), so the old log-probs are the sampler's."""
    envs = [OneShot(i) for i in range(cfg.train.tasks_per_step) for _ in range(cfg.rollout.group_size)]
    trajs = run_rollouts(policy, envs, cfg.rollout, 1.0, 0)
    return trajs, torch.linspace(-1.0, 1.0, len(trajs))


FIRST_RATIO = [
    "rollout.max_new_tokens=4",
    "rollout.group_size=4",
    "train.lr=0.05",
    "train.kl_coef=0.0",
    "lora.target_modules=[q_proj,v_proj,lm_head]",
]


def test_first_mini_batch_ratio_is_logged_and_is_exactly_one_with_recomputed_old_logprobs(monkeypatch):
    seen = []
    real_loss = update_module.policy_loss

    def spy(logprobs, old_logprobs, *args):
        seen.append((logprobs.detach().clone(), old_logprobs.clone(), args[2].bool()))  # args[2]: loss_mask
        return real_loss(logprobs, old_logprobs, *args)

    metrics = {}
    for old, micro_batch in (("sampled", 8), ("recompute", 8), ("recompute", 2)):
        cfg, policy = _update_policy([*FIRST_RATIO, f"train.old_logprobs={old}", f"train.micro_batch={micro_batch}"])
        trajs, adv = _sampled_round(cfg, policy)
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
        seen.clear()
        monkeypatch.setattr(update_module, "policy_loss", spy)
        metrics[old, micro_batch] = update_module.update(policy, optimizer, _no_schedule(optimizer), trajs, adv, cfg)
        monkeypatch.setattr(update_module, "policy_loss", real_loss)
        if old == "recompute":  # every micro-batch of the first mini-batch: the same numbers, to the last bit
            first = seen[: 8 // micro_batch]
            assert all(torch.equal(logp[mask], o[mask]) for logp, o, mask in first)
            assert not torch.equal(seen[-1][0][seen[-1][2]], seen[-1][1][seen[-1][2]])  # the policy moved since
    print(
        {
            k: (v["losses/first_ratio_mean"], v["losses/first_approx_kl"], v["losses/ratio_mean"])
            for k, v in metrics.items()
        }
    )
    # the sampler's log-probs (KV cache, other batch shapes) match the training forward's within float error on CPU
    sampled = metrics["sampled", 8]
    assert abs(sampled["losses/first_ratio_mean"] - 1.0) < 1e-4 and abs(sampled["losses/first_approx_kl"]) < 1e-8
    recomputed = metrics["recompute", 8]  # one micro-batch per mini-batch: the token mean of exact ones
    assert recomputed["losses/first_ratio_mean"] == 1.0 and recomputed["losses/first_approx_kl"] == 0.0
    assert recomputed["losses/ratio_mean"] != 1.0  # the average over mini-batches is another number
    assert metrics["recompute", 2]["losses/first_approx_kl"] == 0.0
    assert metrics["recompute", 2]["losses/first_ratio_mean"] == pytest.approx(1.0, abs=1e-12)

    # old log-probs that are not the policy's (made up: about -8 per token): sampled keeps them, recompute
    # replaces them with the policy's own
    for old in ("sampled", "recompute"):
        cfg, policy = _update_policy([f"train.old_logprobs={old}", "train.micro_batch=4"])
        trajs, adv = _made_up_round(policy)
        m = update_module.update(policy, Recorder(policy.trainable_parameters()), NoSchedule(), trajs, adv, cfg)
        metrics[old, "made up"] = m
    print(
        {
            old: (metrics[old, "made up"]["losses/first_ratio_mean"], metrics[old, "made up"]["losses/first_approx_kl"])
            for old in ("sampled", "recompute")
        }
    )
    assert abs(metrics["sampled", "made up"]["losses/first_ratio_mean"] - 1.0) > 0.01
    assert metrics["sampled", "made up"]["losses/first_approx_kl"] > 0.01
    assert metrics["recompute", "made up"]["losses/first_ratio_mean"] == 1.0
    assert metrics["recompute", "made up"]["losses/first_approx_kl"] == 0.0


@pytest.mark.parametrize("old, passes", [("sampled", 1), ("recompute", 2)])
def test_the_progress_bar_counts_every_sequence_once_per_forward_even_after_running_out_of_memory(old, passes):
    # 8 sequences in 2 mini-batches of 4, 2 a micro-batch (a reference and a policy forward each). The 5th
    # training forward (mini-batch 0's second micro-batch) runs out of memory, once its first micro-batch
    # has counted: the mini-batch starts again one sequence at a time, and its sequences count once.
    from test_rollout import OutOfMemoryAbove
    from tqdm import tqdm

    cfg, policy = _update_policy([f"train.old_logprobs={old}", "train.micro_batch=2"])
    trajs, adv = _made_up_round(policy)
    injected = OutOfMemoryAbove(policy.model, rows=1, after=2 + (passes - 1) * 4)  # after the recompute's 4
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
    with tqdm(file=io.StringIO()) as bar:
        try:
            update_module.update(policy, optimizer, _no_schedule(optimizer), trajs, adv, cfg, progress=bar)
        finally:
            injected.hook.remove()
        assert injected.raised == 1 and policy.limits.micro_batch == 1
        assert bar.total == bar.n == passes * len(trajs)


@pytest.mark.parametrize("loss_agg, factor", [("token_mean", 1.0), ("seq_mean_token_sum", 2.0)])
@pytest.mark.parametrize("old", ["sampled", "recompute"])
def test_a_trajectorys_segments_train_as_rows_of_their_own_with_its_advantage(loss_agg, factor, old):
    """Four trajectories of two segments each (a prompt BFCL wrote anew) take the step their eight segments
    take as trajectories of their own with the same advantages and per-token scales, in one mini-batch: the
    same for a token mean; twice it for a sequence mean of token sums, which counts 4 sequences, not 8."""
    from dataclasses import replace

    grads = {}
    for joined in (True, False):
        cfg, policy = _update_policy([f"train.loss_agg={loss_agg}", f"train.old_logprobs={old}", "train.micro_batch=3"])
        rows, adv = _made_up_round(policy)
        scales = [torch.linspace(0.5, 1.5, len(t.input_ids)) for t in rows]
        if joined:
            trajs = [
                replace(a, input_ids=a.input_ids + b.input_ids, loss_mask=a.loss_mask + b.loss_mask,
                        old_logprobs=a.old_logprobs + b.old_logprobs, segments=[len(a.input_ids)])
                for a, b in zip(rows[::2], rows[1::2], strict=True)
            ]  # fmt: skip
            args = (trajs, adv[::2], cfg, None, None, [torch.cat(scales[i : i + 2]) for i in (0, 2, 4, 6)])
        else:  # every segment a trajectory, all in the first mini-batch
            args = (rows, adv[::2].repeat_interleave(2), cfg, [i // 2 for i in range(8)], None, scales)
        recorder = Recorder(policy.trainable_parameters())
        m = update_module.update(policy, recorder, NoSchedule(), *args)
        assert m["losses/optimizer_steps"] == 1
        grads[joined] = recorder.grads[0]
    for a, b in zip(grads[True], grads[False], strict=True):
        assert a.abs().max() > 0
        assert torch.allclose(a, factor * b, rtol=1e-4, atol=1e-6 * float(a.abs().max()))
