"""SEAL training: diagnosis-weighted GRPO on LoRA with a closed-loop training-time interface.

How this differs from textbook GRPO (one prompt, one completion, one reward):
1. An episode is multi-turn: the model's messages alternate with tool results and new user turns
   in one growing token sequence; only the tokens the model sampled carry loss (`loss_mask`).
2. Rewards come from BFCL's own checker, unchanged (0/1). The diagnoser labels every turn, and the
   labels are used twice:
   a. each trajectory's advantage A_j is multiplied by w_j = clip(sum_z p_j(z) rho(z), w_min, w_max),
      which is positive, so the verifier alone decides the direction of every update;
   b. the failure profile C_t of the round decides which interface cues (schema, error feedback,
      guidelines) the next round trains with: Omega_{t+1} = Evolve(Omega_t, C_t).
3. The interface exists only at training time. Evaluation runs the bare benchmark.
4. LoRA on a (4-bit) frozen base; the KL reference is the policy the run started from: the same model
   with the adapter disabled, or a frozen copy of the starting adapter (lora.adapter_path).
5. One pass over each round's data per mini-batch, so the sampling-time log-probs serve as the "old"
   log-probs of the clipped ratio (no extra forward pass); train.old_logprobs: recompute takes them from
   one no-grad forward of the training forward instead, so the first mini-batch's ratio is exactly 1.
6. A mini-batch whose loss or gradient norm is not finite takes no optimizer step, and weights that
   hold a NaN or an inf are never saved nor resumed from.

The loop reads top to bottom in `train`: rollout -> reward -> diagnose -> advantage -> update ->
evolve -> log -> evaluate -> checkpoint. Around it: the update's plumbing (training/update.py), checkpoints
and resume (training/checkpoint.py), what rank 0 writes (training/tracking.py: RunWriter), and the command
line (programs/pipeline.py). Under torchrun every rank runs this loop; seal_mini.distributed says what they split.
"""

from __future__ import annotations

import random
import time

import torch
import transformers
from tqdm import tqdm

from seal_mini import __version__
from seal_mini.config import Config
from seal_mini.core.diagnose import diagnose_turns, failure_profile, trajectory_profile
from seal_mini.core.grpo import (
    diagnostic_weights,
    ema_rho,
    group_advantages,
    shuffled_among_failures,
    turn_scales,
    weighted_advantages,
)
from seal_mini.core.interface import Interface, InterfaceState, evolve
from seal_mini.core.judge import judge_from_config
from seal_mini.distributed import check_same, check_same_weights, from_rank0, gather_in_order, is_main, rank_positions
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import run_rollouts
from seal_mini.engine.sequences import Trajectory, episode_seed, sample_numbers
from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import PROTOCOLS
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.verifier import check_episode
from seal_mini.evaluation.agents import ModelAgent
from seal_mini.evaluation.heldin import evaluate
from seal_mini.training.checkpoint import open_run, restore
from seal_mini.training.tracking import RunWriter, check_backends, metrics_row, trajectory_rows
from seal_mini.training.update import update


def train(cfg: Config, resume: bool = False, restart: bool = False):
    """Run (or continue) SEAL training; returns (run directory, trained policy).

    resume: continue from the newest checkpoint (from step 0 while the run has none yet).
    restart: first move whatever the run directory holds aside, then start at step 0."""
    check_backends(cfg)  # a missing logging extra is an error now, not after the first step
    check_same("settings", {"config": cfg.to_dict(), **package_versions()})  # several ranks: one run
    found = from_rank0(open_run, cfg, resume, restart, what="waiting for rank 0 to open the run")
    split = load_split(cfg)
    train_tasks = pick(split["train"], cfg.data.max_train_tasks)
    G = cfg.rollout.group_size

    if cfg.sft.enabled:  # the backbone is the run's warm start: built (or reused) once, before anything else
        from seal_mini.training.sft import ensure_warm_start

        from_rank0(ensure_warm_start, cfg, found is not None, what="waiting for rank 0 to build the warm start")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg)
    # optional small-model refinement of ambiguous failures (diagnosis.small_model; off by default)
    judge = judge_from_config(cfg.diagnosis, policy.model, policy.tokenizer) if cfg.train.diagnose else None
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    warmup = max(cfg.train.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    state, history = restore(found, cfg, policy, optimizer, scheduler)
    out = RunWriter(cfg, split, history)  # rank 0 writes the run directory; the other ranks write nothing

    quiet = not is_main()  # progress bars and the plan: rank 0's
    if not quiet:
        print(f"[train] {epoch_plan(len(train_tasks), cfg.train.tasks_per_step, cfg.train.steps)}")
    steps = range(state.step, cfg.train.steps)
    for step in tqdm(steps, desc="train", initial=state.step, total=cfg.train.steps, disable=quiet):
        t0 = time.perf_counter()

        # 1. rollouts: G on-policy episodes per task, through the interface Omega_t (but for the groups of
        #    interface.bare_share of the tasks, which play the bare benchmark); each episode samples
        #    from its own stream, seeded by (seed, step, task, sample). With several ranks, each plays its
        #    own tasks of the step (all of them in one process).
        tasks = tasks_for_step(train_tasks, step, cfg.train.tasks_per_step, cfg.seed)
        local = [k * G + s for k in rank_positions(len(tasks)) for s in range(G)]  # this rank's episodes
        numbers = sample_numbers([task.id for task in tasks for _ in range(G)])
        samples = [numbers[i] for i in local]  # each episode's place among its task's: its stream's `sample`
        bare = bare_tasks(len(tasks), cfg.interface.bare_share, cfg.seed, step)
        envs = [make_env(tasks[i // G], cfg, None if i // G in bare else state.interface) for i in local]
        with tqdm(total=len(envs), desc=f"step {step} rollouts", unit="episode", leave=False, disable=quiet) as bar:
            trajs = run_rollouts(
                policy, envs, cfg.rollout, cfg.rollout.temperature, (cfg.seed, step), progress=bar, samples=samples
            )
        t_rollout = time.perf_counter() - t0

        # 2. rewards: the unchanged benchmark verifier
        verdicts = score(envs)

        # 3. diagnosis: one label per turn
        if cfg.train.diagnose:
            diagnoses = [diagnose_turns(env, v, judge) for env, v in zip(envs, verdicts, strict=True)]
        else:
            diagnoses = [[] for _ in envs]
        # every rank now sees every episode of the round, in the order one process plays them
        episodes = gather_in_order(episode_records(trajs, verdicts, diagnoses), local, "gathering the round")
        rewards = [e["reward"] for e in episodes]
        labels = [e["labels"] for e in episodes]
        profile = failure_profile(labels, rewards) if cfg.train.diagnose else {}  # C_t

        # 4. advantages: group-relative, then scaled by the diagnostic weight w_j > 0. In the ema variant
        #    rho first moves with this round's profile (rho_t from rho_{t-1} and C_t), so the weights answer
        #    the failures of the round they scale.
        group_ids = [i // G for i in range(len(episodes))]
        adv, adv_metrics = group_advantages(rewards, group_ids, cfg.train.adv_eps, cfg.train.adv_estimator)
        rho_metrics = {}
        if cfg.diagnosis.rho_update == "ema" and profile:
            state.rho, rho_metrics = ema_rho(state.rho, profile, cfg.diagnosis)
        scales = None  # the turn-level variant: w_j spread over trajectory j's tokens by its turns' labels
        if cfg.train.reweight and cfg.train.diagnose:
            dc = cfg.diagnosis
            weighed = labels
            if dc.shuffle_weights:  # the control: the same weights, traded among each group's failures
                stream = torch.Generator().manual_seed(episode_seed((cfg.seed, step), "shuffle_weights", 0))
                weighed = shuffled_among_failures(labels, rewards, G, stream)
            shares = [trajectory_profile(z) for z in weighed]
            weights, w_metrics = diagnostic_weights(shares, state.rho, dc.w_min, dc.w_max)
            if dc.weight_level != "trajectory":
                scales = [
                    turn_scales(dc.weight_level, weighed[i], t.turn_starts, t.loss_mask, state.rho, dc.w_min, dc.w_max)
                    for i, t in zip(local, trajs, strict=True)
                ]
        else:
            weights, w_metrics = torch.ones(len(episodes)), {"weights/mean": 1.0}
        adv = weighted_advantages(adv, weights)

        # 5. policy update (this rank's episodes; several ranks sum their gradients)
        t1 = time.perf_counter()
        loss_metrics = {}
        if cfg.train.update:  # off only in a control run that shows what the update contributes
            with tqdm(desc=f"step {step} update", unit="seq", leave=False, disable=quiet) as bar:
                loss_metrics = update(policy, optimizer, scheduler, trajs, adv[local], cfg, local, bar, scales)
        t_update = time.perf_counter() - t1
        check_same_weights(policy.trainable_parameters())  # several ranks: each took the same step

        # 6. environment update: Omega_{t+1} = Evolve(Omega_t, C_t)
        used = state.interface.to_dict() if state.interface else {}
        if state.interface is not None:
            state.interface = evolve(state.interface, profile, cfg.interface)

        # 7. log: the round's trajectories and record, then its metrics row
        seconds = {"rollout_s": t_rollout, "update_s": t_update, "step_s": time.perf_counter() - t0}
        row = metrics_row(step, episodes, profile, used, seconds, adv_metrics, w_metrics, loss_metrics, rho_metrics)
        rows = trajectory_rows(step, G, episodes, weights.tolist(), adv.tolist())
        record = {"step": step, "interface_used": used, "profile": profile, "rho": state.rho}
        if bare and state.interface is not None:
            record["bare_tasks"] = sorted(tasks[k].id for k in bare)
        out.round(step, rows, record)

        # 8. held-in evaluation (bare benchmark, no interface; split over the ranks) and checkpoint
        state.step, state.profile = step + 1, profile
        if cfg.train.eval_every and state.step % cfg.train.eval_every == 0 and state.step < cfg.train.steps:
            row.update(evaluate_during_training(policy, cfg, split["eval"], f"step_{state.step:04d}"))
        out.step_done(row, rows, state, policy, optimizer, scheduler)
        tqdm.write(
            f"[train] step {step}: reward {row['charts/reward']:.3f} "
            f"loss {row.get('losses/loss', float('nan')):.4f} kl {row.get('losses/kl_ref', 0.0):.4f} "
            f"weights {row['weights/mean']:.2f} ({t_rollout:.0f}s rollout, {t_update:.0f}s update)"
        )
    out.finish(policy)
    return cfg.run_dir, policy


# --- what the loop calls ------------------------------------------------------------------------------


def make_env(task: Task, cfg: Config, interface: InterfaceState | None):
    """The bare benchmark episode, wrapped in the training-time interface when one is given."""
    episode = Episode(task, cfg.env.max_calls_per_turn, cfg.env.max_calls_per_episode, PROTOCOLS[cfg.model.protocol])
    return Interface(episode, interface) if interface is not None else episode


def bare_tasks(n_tasks: int, share: float, seed: int, step: int) -> set[int]:
    """Positions of the step's tasks whose groups play without the interface (interface.bare_share): a
    function of (seed, step) alone, so every rank and a resumed run pick the same."""
    return set(random.Random(f"bare:{seed}:{step}").sample(range(n_tasks), round(share * n_tasks)))


def score(envs: list) -> list:
    """The official checker's verdict on every finished episode."""
    return [check_episode(env) for env in envs]


def episode_records(trajs: list[Trajectory], verdicts: list, diagnoses: list) -> list[dict]:
    """What the rest of the round needs of each finished episode, as plain data (ranks exchange these)."""
    return [
        {
            "task_id": t.task_id,
            "category": t.env.task.category,
            "reward": v.reward,
            "error_type": v.error_type,
            "labels": [d.label for d in z],
            "reasons": [d.reason + (f" [{d.detail}]" if d.detail else "") for d in z],
            "truncated": t.truncated,
            "n_sampled": t.n_sampled,
            "n_tokens": len(t.input_ids),
            "messages": t.messages,
            # -sum log p of the sampled tokens, for the entropy estimate
            "surprisal": sum(-lp for lp, m in zip(t.old_logprobs, t.loss_mask, strict=True) if m),
        }
        for t, v, z in zip(trajs, verdicts, diagnoses, strict=True)
    ]


def evaluate_during_training(policy, cfg: Config, eval_ids: list[str], tag: str) -> dict:
    """Held-in success without the interface (the bare benchmark), written to eval/<tag>.json."""
    tasks = pick(eval_ids, cfg.data.max_eval_tasks)
    result = evaluate(ModelAgent(policy, cfg), tasks, cfg, cfg.run_dir / "eval", tag, source=f"adapter at {tag}")
    return {f"eval/{k}": v for k, v in result["success"].items()}


def package_versions() -> dict[str, str]:
    """The versions whose code shapes a run (every rank must run the same)."""
    return {"seal_mini": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


# --- which tasks a step plays --------------------------------------------------------------------------


def epoch_steps(n_tasks: int, per_step: int) -> int:
    """Steps one epoch takes: its n_tasks dealt into slices of at most per_step tasks (train.tasks_per_step)."""
    return -(-n_tasks // per_step)  # ceil(N / B)


def tasks_for_step(tasks: list[Task], step: int, per_step: int, seed: int) -> list[Task]:
    """The tasks of one step. An epoch is every training task once, in its own seeded order, dealt into
    ceil(N / B) steps of near-equal size (they differ by at most one task; none holds more than B), so no
    step straddles two epochs or holds a task twice. A function of (seed, step) alone: a resumed run, and
    every rank of a data-parallel one, draws exactly the tasks the uninterrupted run would."""
    n, per_epoch = len(tasks), epoch_steps(len(tasks), per_step)
    epoch, k = divmod(step, per_epoch)
    order = list(range(n))
    random.Random(seed * 100_003 + epoch).shuffle(order)
    return [tasks[i] for i in order[k * n // per_epoch : (k + 1) * n // per_epoch]]


def epoch_plan(n_tasks: int, per_step: int, steps: int) -> str:
    """One line saying how the run's steps fall into epochs (printed when training starts)."""
    per_epoch = epoch_steps(n_tasks, per_step)
    low, high = n_tasks // per_epoch, -(-n_tasks // per_epoch)
    whole, rest = divmod(steps, per_epoch)
    tail = f" and {_count(rest, 'step')} of one more" if rest else ""
    return (
        f"{_count(n_tasks, 'training task')}, at most {per_step} a step: an epoch is {_count(per_epoch, 'step')} "
        f"of {low if low == high else f'{low}-{high}'} tasks; {steps} steps = {_count(whole, 'whole epoch')}{tail}"
    )


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
