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
evolve -> log -> evaluate -> checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from seal_mini.config import (
    MATH_FREE,
    Config,
    ConfigError,
    TrainConfig,
    changed_settings,
    config_from_dict,
    load_config,
    saved_config,
)
from seal_mini.core.diagnose import diagnose_turns, failure_profile, trajectory_profile
from seal_mini.core.grpo import (
    diagnostic_weights,
    ema_rho,
    group_advantages,
    loss_divisors,
    policy_loss,
    weighted_advantages,
)
from seal_mini.core.interface import Interface, InterfaceState, active_cues, evolve, initial_state
from seal_mini.core.judge import judge_from_config
from seal_mini.distributed import (
    all_reduce_gradients,
    all_reduce_sum,
    all_reduce_sums,
    check_same,
    check_same_weights,
    gather_in_order,
    is_main,
    on_main,
    run_lock,
    share,
)
from seal_mini.engine.device import MemoryLimits, release_memory
from seal_mini.engine.logprobs import right_pad, token_logprobs
from seal_mini.engine.policy import load_policy, save_adapter
from seal_mini.engine.rollout import run_rollouts
from seal_mini.engine.sequences import Trajectory, sample_numbers, scored_temperature
from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.verifier import check_episode
from seal_mini.runio import (
    FileError,
    move_aside,
    new_dir,
    read_json,
    read_metrics,
    read_safetensors,
    read_torch,
    write_json,
    write_jsonl_gz,
    write_metrics,
    write_torch,
    write_yaml,
)
from seal_mini.training.tracking import Tracker, check_backends


@dataclass
class LoopState:
    """What the loop carries from one round to the next (saved in every checkpoint)."""

    step: int = 0
    """The next step to run."""
    interface: InterfaceState | None = None
    """Omega_t: the cues the next round trains with."""
    rho: dict[str, float] = field(default_factory=dict)
    """The utility table the last round weighed with (moves only with diagnosis.rho_update: ema)."""
    profile: dict = field(default_factory=dict)
    """C_t of the last finished round (what Omega_t and rho were last evolved from)."""


# --- data ---------------------------------------------------------------------------------------


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


def make_env(task: Task, cfg: Config, interface: InterfaceState | None):
    """The bare benchmark episode, wrapped in the training-time interface when one is given."""
    episode = Episode(task, cfg.env.max_calls_per_turn, cfg.env.max_calls_per_episode)
    return Interface(episode, interface) if interface is not None else episode


def score(envs: list) -> list:
    """The official checker's verdict on every finished episode."""
    return [check_episode(env) for env in envs]


# --- the update -----------------------------------------------------------------------------------


def collate(trajectories: list[Trajectory], device) -> tuple[torch.Tensor, ...]:
    """Right-pad a micro-batch: input_ids, attention_mask, loss_mask (B, T) and old log-probs (B, T)."""
    ids = right_pad([t.input_ids for t in trajectories], torch.long)
    attention = right_pad([[1] * len(t.input_ids) for t in trajectories], torch.long)
    mask = right_pad([t.loss_mask for t in trajectories], torch.float32)
    old = right_pad([t.old_logprobs for t in trajectories], torch.float32)
    return ids.to(device), attention.to(device), mask.to(device), old.to(device)


@dataclass(frozen=True)
class MiniBatchCounts:
    """What a mini-batch holds on all ranks together: the aggregation's denominators (grpo.loss_divisors)."""

    tokens: int
    """Loss tokens (loss_mask 1)."""
    sequences: int
    """Sequences with at least one loss token."""


def update(
    policy,
    optimizer,
    scheduler,
    trajectories: list[Trajectory],
    advantages: torch.Tensor,
    cfg: Config,
    positions: list[int] | None = None,
):
    """One pass of clipped policy-gradient steps: mini-batches of tasks, micro-batches of sequences.

    `positions` says where each trajectory stands in the round (default: they are the round, in order).
    With several ranks each holds some of the round: it computes the gradients of its part of every
    mini-batch, and the mini-batch's counts and the gradients are summed over the ranks before the step.

    A mini-batch whose loss or gradient norm is not finite takes no step: its gradients are dropped, the
    skip is counted (losses/skipped_steps) and printed, and the averages leave it out. Every rank sees the
    same summed loss and gradient, and any rank's non-finite value skips the step on all of them.

    A CUDA out-of-memory error redoes the mini-batch from its start with half the micro-batch (then half
    the log-prob chunk); the smaller setting stays for the rest of the run (policy.limits)."""
    model, tc = policy.model, cfg.train
    params = policy.trainable_parameters()
    per_mini = tc.mini_batch_tasks * cfg.rollout.group_size
    positions = list(range(len(trajectories))) if positions is None else positions
    round_size = all_reduce_sum(len(trajectories))  # the round's trajectories, on all ranks together
    # episodes that sampled nothing (a prompt over the limit) carry no loss and are left out
    minis = [
        [i for i, p in enumerate(positions) if start <= p < start + per_mini and any(trajectories[i].loss_mask)]
        for start in range(0, round_size, per_mini)
    ]
    model.train()
    if tc.old_logprobs == "recompute":  # the old log-probs of the current policy, before it takes a step
        trajectories = recompute_old_logprobs(policy, trajectories, minis, cfg)
    # policy_loss divides every micro-batch by its mini-batch's counts, so metric sums over one
    # mini-batch are that mini-batch's means; averaging over the optimizer steps gives the round's.
    sums: dict[str, float] = {}
    first: dict[str, float] = {}
    steps = skipped = 0
    for k, mini in enumerate(minis):
        counts = MiniBatchCounts(
            tokens=all_reduce_sum(sum(sum(trajectories[i].loss_mask) for i in mini)),
            sequences=all_reduce_sum(len(mini)),
        )
        if counts.tokens == 0:
            continue
        mine = [trajectories[i] for i in mini]
        mini_sums = accumulate_gradients(policy, mine, advantages[mini], counts, cfg)
        while mini_sums is None:  # out of memory: the mini-batch again, from its start, smaller
            optimizer.zero_grad(set_to_none=True)  # the failed try's partial gradients go
            release_memory(policy.device)
            shrink_update(policy.limits, tc)
            mini_sums = accumulate_gradients(policy, mine, advantages[mini], counts, cfg)
        all_reduce_gradients(params)  # several ranks: the mini-batch's gradient is the sum of theirs
        mini_sums = all_reduce_sums(mini_sums)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tc.max_grad_norm))
        if not first:  # the first mini-batch's ratio is exactly 1 with recomputed old log-probs
            first = {
                "losses/first_ratio_mean": mini_sums.get("losses/ratio_mean", 1.0),
                "losses/first_approx_kl": mini_sums.get("losses/approx_kl", 0.0),
            }
        loss = mini_sums.get("losses/loss", 0.0)  # a rank without episodes here adds no key
        if all_reduce_sum(int(not (math.isfinite(loss) and math.isfinite(grad_norm)))):
            optimizer.zero_grad(set_to_none=True)  # the step is not taken: its gradients go
            skipped += 1
            if is_main():
                print(
                    f"[train] warning: mini-batch {k} has a non-finite loss ({loss}) or gradient norm ({grad_norm}); "
                    "its optimizer step is skipped",
                    file=sys.stderr,
                    flush=True,
                )
            continue
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        for key, v in mini_sums.items():
            sums[key] = sums.get(key, 0.0) + v
        sums["losses/grad_norm"] = sums.get("losses/grad_norm", 0.0) + grad_norm
        steps += 1
    model.eval()
    out = {k: (v if k == "losses/tokens" else v / max(steps, 1)) for k, v in sums.items()}
    out.update({key: v for key, v in first.items() if math.isfinite(v)})
    out["losses/optimizer_steps"] = steps
    out["losses/skipped_steps"] = skipped
    out["losses/lr"] = scheduler.get_last_lr()[0]
    return out


def accumulate_gradients(
    policy, trajectories: list[Trajectory], advantages: torch.Tensor, counts: MiniBatchCounts, cfg: Config
) -> dict[str, float] | None:
    """Forward and backward one mini-batch, a micro-batch at a time (gradients add up); returns metric sums,
    or None if the GPU ran out of memory (returning drops the failed try's tensors with its traceback)."""
    try:
        return _accumulate(policy, trajectories, advantages, counts, cfg)
    except torch.OutOfMemoryError:
        return None


def _accumulate(policy, trajectories: list[Trajectory], advantages: torch.Tensor, counts: MiniBatchCounts, cfg):
    model, tc = policy.model, cfg.train
    micro_batch, chunk = update_limits(policy.limits, tc)
    token_sum_norm = tc.token_sum_norm or cfg.rollout.max_response_tokens
    temperature = scored_temperature(cfg.rollout.temperature)  # the distribution the rollouts drew from
    sums: dict[str, float] = {}
    for m in range(0, len(trajectories), micro_batch):
        ids, attention, mask, old = collate(trajectories[m : m + micro_batch], policy.device)
        ref = None
        if tc.kl_coef > 0:
            with torch.no_grad(), policy.reference():
                ref = token_logprobs(model, ids, attention, mask, chunk, temperature)  # (b, T)
        logp = token_logprobs(model, ids, attention, mask, chunk, temperature)  # (b, T)
        micro_adv = advantages[m : m + micro_batch].to(policy.device)  # (b,)
        divisors = loss_divisors(mask, tc.loss_agg, counts.tokens, counts.sequences, token_sum_norm)  # (b,)
        loss, metrics = policy_loss(logp, old, ref, micro_adv, mask, tc.clip_ratio, tc.kl_coef, counts.tokens, divisors)
        loss.backward()
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return sums


def recompute_old_logprobs(
    policy, trajectories: list[Trajectory], minis: list[list[int]], cfg: Config
) -> list[Trajectory]:
    """The trajectories with the current policy's log-probs as their old ones (train.old_logprobs: recompute).

    One no-grad forward, in the mode (model.train()) and the micro-batches of the training forward, so the
    first mini-batch's training forward computes the very same numbers and its ratio is exactly 1. Sampling
    runs other kernels (a KV cache, left padding, bf16 or 4-bit no-grad paths on a GPU), so the log-probs it
    recorded differ from the training forward's and would bias every ratio. Out of GPU memory: the shrunk
    micro-batch or log-prob chunk, from the start."""
    while True:
        try:
            return _recompute(policy, trajectories, minis, cfg)
        except torch.OutOfMemoryError:
            pass  # leaving the except block drops the failed try's tensors
        release_memory(policy.device)
        shrink_update(policy.limits, cfg.train)


def _recompute(policy, trajectories: list[Trajectory], minis: list[list[int]], cfg: Config) -> list[Trajectory]:
    micro_batch, chunk = update_limits(policy.limits, cfg.train)
    temperature = scored_temperature(cfg.rollout.temperature)
    out = list(trajectories)
    with torch.no_grad():
        for mini in minis:
            for m in range(0, len(mini), micro_batch):
                part = mini[m : m + micro_batch]
                ids, attention, mask, _ = collate([trajectories[i] for i in part], policy.device)
                logp = token_logprobs(policy.model, ids, attention, mask, chunk, temperature).cpu()  # (b, T)
                for row, i in enumerate(part):
                    n = len(trajectories[i].input_ids)
                    out[i] = replace(trajectories[i], old_logprobs=logp[row, :n].tolist())
    return out


MIN_LOGPROB_CHUNK = 32
"""Out of memory with one sequence per micro-batch: the log-prob chunk halves down to this."""


def update_limits(limits: MemoryLimits, tc: TrainConfig) -> tuple[int, int]:
    """(micro-batch, log-prob chunk) of the update: the config's, or smaller where out-of-memory errors shrank them."""
    return (
        min(tc.micro_batch, limits.micro_batch or tc.micro_batch),
        min(tc.logprob_chunk, limits.logprob_chunk or tc.logprob_chunk),
    )


def shrink_update(limits: MemoryLimits, tc: TrainConfig) -> None:
    """After an out-of-memory error in the update: halve the micro-batch, else the log-prob chunk; say so."""
    micro_batch, chunk = update_limits(limits, tc)
    if micro_batch > 1:
        limits.micro_batch = micro_batch // 2
        what = f"train.micro_batch {micro_batch} -> {limits.micro_batch}"
    elif chunk > MIN_LOGPROB_CHUNK:
        limits.logprob_chunk = max(MIN_LOGPROB_CHUNK, chunk // 2)
        what = f"train.logprob_chunk {chunk} -> {limits.logprob_chunk}"
    else:
        raise ConfigError(
            f"out of GPU memory in the update with one sequence per micro-batch and log-prob chunks of {chunk}: "
            "the longest sequences do not fit; lower rollout.max_total_tokens, set model.gradient_checkpointing=true, "
            "or use a smaller model (python -m seal_mini preflight RECIPE measures it)"
        )
    print(f"[memory] out of GPU memory in the update: {what}; the mini-batch starts again", file=sys.stderr, flush=True)


# --- checkpoints ------------------------------------------------------------------------------------

CHECKPOINT_PARTS = (
    "adapter/adapter_model.safetensors",
    "adapter/adapter_config.json",
    "optim.pt",
    "rng.pt",
    "state.json",
)
KEEP_CHECKPOINTS = 2
"""The newest checkpoint, and the one before it as a spare until the next one is on disk."""


def rng_states() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def checkpoints(run_dir: Path) -> list[Path]:
    """The saved checkpoints, checkpoint/step_NNNN, newest first (a half-written one has a temporary name)."""
    folder = Path(run_dir) / "checkpoint"
    found = [p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors that hold a NaN or an inf."""
    return [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]


def check_finite_weights(policy, what: str) -> None:
    """Refuse to save weights that hold a NaN or an inf: a run must never continue from them."""
    bad = nonfinite_tensors({n: p.detach() for n, p in policy.model.named_parameters() if p.requires_grad})
    if bad:
        raise ConfigError(
            f"{what}: not saved, {len(bad)} trained tensors hold NaN or inf (first: {bad[0]}); the checkpoints "
            "already on disk are kept. The run diverged: start it again (--restart) with a lower train.lr or "
            "train.max_grad_norm"
        )


LOOP_VERSION = 3
"""What a checkpoint's loop is. A change that would make a resumed run differ from the one that wrote the
checkpoint (which tasks a step draws, which rho weighs a round, what the prompts say) raises it, and a
checkpoint of another version is refused rather than continued as a different run. 2: whole epochs, rho_t
from the round's own profile, the interface's note after the template's default system text. 3: log-probs
of the rollouts' temperature (logits / T), calls on a turn that needs none labelled spurious_tool_call, an
unreadable message the interface let the model retry out of the loss."""


def save_checkpoint(run_dir: Path, policy, optimizer, scheduler, state: LoopState) -> None:
    """Adapter, optimizer, scheduler, RNG states and loop state as checkpoint/step_NNNN: written whole
    under a temporary name and made durable before it gets its name; only then does the oldest go.
    Weights that hold a NaN or an inf are refused (check_finite_weights)."""
    check_finite_weights(policy, f"checkpoint of step {state.step}")
    with new_dir(run_dir / "checkpoint" / f"step_{state.step:04d}") as tmp:
        save_adapter(policy, tmp / "adapter")
        write_torch({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        write_torch(rng_states(), tmp / "rng.pt")
        write_json(
            tmp / "state.json",
            {
                "loop": LOOP_VERSION,
                "step": state.step,
                "interface": state.interface.to_dict() if state.interface else None,
                "rho": state.rho,
                "profile": state.profile,
            },
        )
    for old in checkpoints(run_dir)[KEEP_CHECKPOINTS:]:
        shutil.rmtree(old)


def checkpoint_fix(found: list[Path]) -> str:
    """What to do when the newest checkpoint cannot be loaded."""
    if len(found) > 1:
        newest, previous = found[0].name, found[1].name
        return f"restore the file, or rename {newest} (e.g. to {newest}.broken) to continue from {previous}"
    return "restore the file, or start the run again with --restart (moves its results aside)"


def load_checkpoint(path: Path, policy, optimizer, scheduler, fix: str = "restore the file") -> LoopState:
    from peft import set_peft_model_state_dict

    saved = read_json(path / "state.json", fix)
    if saved.get("loop", 1) != LOOP_VERSION:  # checkpoints before versions were written are version 1
        raise ConfigError(
            f"{path} was written by loop version {saved.get('loop', 1)} and this kit runs version {LOOP_VERSION} "
            "(see LOOP_VERSION in seal_mini/training/train.py): continued, it would not be the run it started as. "
            "Start it again with --restart (its results are moved aside), or finish it with the kit that began it"
        )
    weights = read_safetensors(path / "adapter" / "adapter_model.safetensors", fix)
    bad = nonfinite_tensors(weights)
    if bad:  # never continue from a diverged step (save_checkpoint refuses them; this file got them anyway)
        raise FileError(
            f"{path / 'adapter' / 'adapter_model.safetensors'}: {len(bad)} tensors hold NaN or inf "
            f"(first: {bad[0]}); {fix}"
        )
    set_peft_model_state_dict(policy.model, weights)
    optim = read_torch(path / "optim.pt", fix)
    optimizer.load_state_dict(optim["optimizer"])
    scheduler.load_state_dict(optim["scheduler"])
    rng = read_torch(path / "rng.pt", fix)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    interface = InterfaceState.from_dict(saved["interface"]) if saved["interface"] else None
    return LoopState(step=saved["step"], interface=interface, rho=saved["rho"], profile=saved["profile"])


# --- starting or continuing a run -------------------------------------------------------------------

LEFTOVERS = ("metrics.jsonl", "rounds", "trajectories", "adapter", "report", "checkpoint")
"""What a training attempt writes into its run directory besides config.yaml, split.json and its held-in
evaluations (eval/step_NNNN*). eval/ also holds evaluations made by `eval` alone (the backbone measured
before training, say): those are not training's to clear or to count."""


def _step_of(path: Path) -> int | None:
    """N of a training output named step_NNNN[.json|.jsonl.gz|.partial|...], else None."""
    return int(path.name[5:9]) if path.name.startswith("step_") and path.name[5:9].isdigit() else None


def results_past_first_checkpoint(run_dir: Path, cfg: Config) -> list[str]:
    """What in run_dir only a run that got to its first checkpoint writes. An attempt stopped before it
    leaves outputs of its first steps alone; those are run again anyway, so they may be cleared."""
    tc = (saved_config(run_dir) if (run_dir / "config.yaml").exists() else cfg).train
    first = min(tc.save_every, tc.steps)  # LoopState.step of the first checkpoint: steps 0..first-1 precede it
    past = ["metrics.jsonl"] if any(r.get("step", first) >= first for r in read_metrics(run_dir)) else []
    for folder in ("rounds", "trajectories", "eval"):
        # held-in evaluations during training are tagged with the LoopState.step they follow, hence the +1
        last = first + (folder == "eval") - 1
        if any((_step_of(p) or 0) > last for p in (run_dir / folder).glob("step_*")):
            past.append(f"{folder}/")
    return past + ["adapter/"] * (run_dir / "adapter").exists()


def open_run(cfg: Config, resume: bool, restart: bool) -> Path | None:
    """The checkpoint a run continues from, or None to start at step 0. Refuses whatever would lose or
    mix work: a fresh start over a run, results without a checkpoint to continue them, other settings."""
    run_dir = cfg.run_dir
    if restart and (aside := move_aside(run_dir)) is not None:
        print(f"[train] --restart: what {run_dir} held is now in {aside}")
    found = checkpoints(run_dir)
    if found:
        missing = [part for part in CHECKPOINT_PARTS if not (found[0] / part).is_file()]
        if missing:
            raise FileError(f"{found[0]}: incomplete ({', '.join(missing)} missing); {checkpoint_fix(found)}")
        if not resume:
            raise ConfigError(
                f"{run_dir} already holds a training run; continue it with `train --resume {run_dir}`, start it "
                "over with --restart (the old run is moved aside), or pick another name (name=...)"
            )
        free, other = changed_settings(saved_config(run_dir), cfg)
        if other:
            raise ConfigError(
                f"{run_dir} was made with other settings ({', '.join(other)}); a run that continues may change "
                f"only {', '.join(MATH_FREE)}. Use the run's own settings, or give this run another name (name=...)"
            )
        for key, (old, new) in free.items():
            print(f"[train] {key}: {old} -> {new} ({MATH_FREE[key]})")
        return found[0]
    past = results_past_first_checkpoint(run_dir, cfg)
    if past:
        raise FileError(
            f"{run_dir} holds results ({', '.join(past)}) but no checkpoint to continue them from "
            f"({run_dir / 'checkpoint'} is missing or empty); restore it, or start again with --restart "
            "(moves these results aside, deletes nothing)"
        )
    # an attempt stopped before its first checkpoint: its steps are run again
    leftovers = [run_dir / name for name in LEFTOVERS] + list((run_dir / "eval").glob("step_*"))
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return None


# --- logging helpers --------------------------------------------------------------------------------


def trajectory_rows(step: int, group_size: int, episodes: list[dict], weights, advantages) -> list[dict]:
    """One row per trajectory of a round (the schema of trajectories/*.jsonl.gz; see seal_mini.programs.dataset)."""
    return [
        {
            "task_id": e["task_id"],
            "category": e["category"],
            "step": step,
            "sample": i % group_size,
            "reward": e["reward"],
            "error_type": e["error_type"],
            "labels": e["labels"],
            "reasons": e["reasons"],
            "weight": float(w),
            "advantage": float(a),
            "truncated": e["truncated"],
            "n_sampled": e["n_sampled"],
            "n_tokens": e["n_tokens"],
            "messages": e["messages"],
        }
        for i, (e, w, a) in enumerate(zip(episodes, weights, advantages, strict=True))
    ]


def print_samples(rows: list[dict], n: int, step: int) -> None:
    """Show what the model does: the first success and the first failure of the round."""
    picks = [r for r in rows if r["reward"] > 0][:1] + [r for r in rows if r["reward"] == 0][:1]
    for row in picks[:n]:
        print(f"\n--- step {step} sample: {row['task_id']} reward={row['reward']} labels={row['labels']}")
        for m, shown in zip(row["messages"], _sample_lengths(row["messages"]), strict=True):
            text = str(m.get("content", ""))
            print(f"[{m['role']}] {text[:shown]}{f' ... ({len(text)} chars)' if len(text) > shown else ''}")


def _sample_lengths(messages: list[dict]) -> list[int]:
    """How much of each message to print: the model's own words in full, the long prompt parts short."""
    return [2000 if m["role"] == "assistant" else 160 if m["role"] == "system" else 300 for m in messages]


def evaluate_during_training(policy, cfg: Config, eval_ids: list[str], run_dir: Path, tag: str) -> dict:
    """Held-in success without the interface (the bare benchmark), written to eval/<tag>.json."""
    from seal_mini.evaluation.agents import ModelAgent
    from seal_mini.evaluation.heldin import evaluate

    tasks = pick(eval_ids, cfg.data.max_eval_tasks)
    result = evaluate(ModelAgent(policy, cfg), tasks, cfg, run_dir / "eval", tag, source=f"adapter at {tag}")
    return {f"eval/{k}": v for k, v in result["success"].items()}


# --- the loop ---------------------------------------------------------------------------------------


def train(cfg: Config, resume: bool = False, restart: bool = False):
    """Run (or continue) SEAL training; returns (run directory, trained policy).

    resume: continue from the newest checkpoint (from step 0 while the run has none yet).
    restart: first move whatever the run directory holds aside, then start at step 0.
    Under torchrun every rank runs this function; see seal_mini.distributed for what they split."""
    run_dir = cfg.run_dir
    check_backends(cfg)  # a missing logging extra is an error now, not after the first step
    check_same("settings", {"config": cfg.to_dict(), **package_versions()})  # several ranks: one run
    checkpoint = on_main(open_run, cfg, resume, restart, what="waiting for rank 0 to open the run")
    split = load_split(cfg)
    train_tasks = pick(split["train"], cfg.data.max_train_tasks)
    G = cfg.rollout.group_size

    if cfg.sft.enabled:  # the backbone is the run's warm start: built (or reused) once, before anything else
        from seal_mini.training.sft import ensure_warm_start

        on_main(ensure_warm_start, cfg, checkpoint is not None, what="waiting for rank 0 to build the warm start")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg)
    # optional small-model refinement of ambiguous failures (diagnosis.small_model; off by default)
    judge = judge_from_config(cfg.diagnosis, policy.model, policy.tokenizer) if cfg.train.diagnose else None
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    warmup = max(cfg.train.warmup_steps, 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))

    state = LoopState(step=0, interface=initial_state(cfg.interface) if cfg.interface.enabled else None)
    state.rho = dict(cfg.diagnosis.rho)
    metrics_rows = []
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, policy, optimizer, scheduler, checkpoint_fix(checkpoints(run_dir)))
        # a label the kit gained after this checkpoint was written starts from its configured rho
        state.rho = {**cfg.diagnosis.rho, **state.rho}
        # steps after the checkpoint are run again, so their old metric lines go
        metrics_rows = [r for r in read_metrics(run_dir) if r["step"] < state.step]
        lost = sorted(set(range(state.step)) - {r["step"] for r in metrics_rows})
        if lost and is_main():
            print(
                f"[train] warning: metrics.jsonl has no row for steps {lost}; the report will lack them",
                file=sys.stderr,
            )
        print(f"[train] {run_dir} has a checkpoint of step {state.step}: continuing that run")
    tracker = None
    if is_main():  # rank 0 writes the run directory
        # written once the checkpoint has loaded, so a resume that fails changes nothing in the run
        run_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(run_dir / "config.yaml", cfg.to_dict())
        write_json(run_dir / "split.json", split)
        tracker = Tracker(cfg, run_dir, history=metrics_rows)
    from tqdm import tqdm

    quiet = not is_main()  # progress bars: rank 0's
    if is_main():
        print(f"[train] {epoch_plan(len(train_tasks), cfg.train.tasks_per_step, cfg.train.steps)}")
    steps = range(state.step, cfg.train.steps)
    for step in tqdm(steps, desc="train", initial=state.step, total=cfg.train.steps, disable=quiet):
        t0 = time.perf_counter()

        # 1. rollouts: G on-policy episodes per task, through the interface Omega_t; each episode samples
        #    from its own stream, seeded by (seed, step, task, sample). With several ranks, each plays its
        #    share of the tasks (all of them in one process).
        tasks = tasks_for_step(train_tasks, step, cfg.train.tasks_per_step, cfg.seed)
        mine = [k * G + s for k in share(len(tasks)) for s in range(G)]  # positions of this rank's episodes
        samples = sample_numbers([task.id for task in tasks for _ in range(G)])
        envs = [make_env(tasks[i // G], cfg, state.interface) for i in mine]
        with tqdm(total=len(envs), desc=f"step {step} rollouts", unit="episode", leave=False, disable=quiet) as bar:
            trajs = run_rollouts(
                policy,
                envs,
                cfg.rollout,
                cfg.rollout.temperature,
                (cfg.seed, step),
                progress=bar,
                samples=[samples[i] for i in mine],
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
        episodes = gather_in_order(episode_records(trajs, verdicts, diagnoses), mine, "gathering the round")
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
            state.rho, rho_metrics = ema_rho(
                cfg.diagnosis.rho,
                state.rho,
                profile,
                cfg.diagnosis.rho_ema_decay,
                cfg.diagnosis.rho_ema_count_scale,
                cfg.diagnosis.rho_min,
                cfg.diagnosis.rho_max,
            )
        if cfg.train.reweight and cfg.train.diagnose:
            shares = [trajectory_profile(z) for z in labels]
            weights, w_metrics = diagnostic_weights(shares, state.rho, cfg.diagnosis.w_min, cfg.diagnosis.w_max)
        else:
            weights, w_metrics = torch.ones(len(episodes)), {"weights/mean": 1.0}
        adv = weighted_advantages(adv, weights)

        # 5. policy update (this rank's episodes; several ranks sum their gradients)
        t1 = time.perf_counter()
        loss_metrics = {}
        if cfg.train.update:  # off only in a control run that shows what the update contributes
            loss_metrics = update(policy, optimizer, scheduler, trajs, adv[mine], cfg, positions=mine)
        t_update = time.perf_counter() - t1
        check_same_weights(policy.trainable_parameters())  # several ranks: each took the same step

        # 6. environment update: Omega_{t+1} = Evolve(Omega_t, C_t)
        active = state.interface.to_dict() if state.interface else {}
        if state.interface is not None:
            state.interface = evolve(state.interface, profile, cfg.interface)

        # 7. log
        row = {
            "step": step,
            "charts/reward": sum(rewards) / len(rewards),
            "charts/truncated_frac": sum(e["truncated"] for e in episodes) / len(episodes),
            "charts/sampled_tokens_mean": sum(e["n_sampled"] for e in episodes) / len(episodes),
            "charts/episode_tokens_mean": sum(e["n_tokens"] for e in episodes) / len(episodes),
            "policy/entropy_estimate": _entropy_estimate(episodes),
            **adv_metrics,
            **w_metrics,
            **loss_metrics,
            **rho_metrics,
            **{f"labels/{z}": p["count"] for z, p in profile.items()},
            "interface/cues": active_cues(active),
            "time/rollout_s": round(t_rollout, 2),
            "time/update_s": round(t_update, 2),
            "time/step_s": round(time.perf_counter() - t0, 2),
        }
        rows = trajectory_rows(step, G, episodes, weights.tolist(), adv.tolist())
        if is_main():
            write_jsonl_gz(run_dir / "trajectories" / f"step_{step:04d}.jsonl.gz", rows)
            write_json(
                run_dir / "rounds" / f"step_{step:04d}.json",
                {"step": step, "interface_used": active, "profile": profile, "rho": state.rho},
            )
            print_samples(rows, cfg.train.print_samples, step)

        # 8. held-in evaluation (bare benchmark, no interface; split over the ranks) and checkpoint
        state.step, state.profile = step + 1, profile
        if cfg.train.eval_every and state.step % cfg.train.eval_every == 0 and state.step < cfg.train.steps:
            row.update(evaluate_during_training(policy, cfg, split["eval"], run_dir, f"step_{state.step:04d}"))
        metrics_rows.append(row)
        if is_main():
            write_metrics(run_dir, metrics_rows)
            tracker.log(row, rows)  # the live views (TensorBoard, W&B) the recipe asks for
            if state.step % cfg.train.save_every == 0 or state.step == cfg.train.steps:
                save_checkpoint(run_dir, policy, optimizer, scheduler, state)
        tqdm.write(
            f"[train] step {step}: reward {row['charts/reward']:.3f} "
            f"loss {row.get('losses/loss', float('nan')):.4f} kl {row.get('losses/kl_ref', 0.0):.4f} "
            f"weights {row['weights/mean']:.2f} ({t_rollout:.0f}s rollout, {t_update:.0f}s update)"
        )
    if is_main():
        tracker.close()
        check_finite_weights(policy, f"{run_dir / 'adapter'}")
        with new_dir(run_dir / "adapter") as tmp:
            save_adapter(policy, tmp)
    return run_dir, policy


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


def _entropy_estimate(episodes: list[dict]) -> float:
    """-mean log p of the sampled tokens: a Monte Carlo estimate of the sampling policy's entropy."""
    return sum(e["surprisal"] for e in episodes) / max(sum(e["n_sampled"] for e in episodes), 1)


def package_versions() -> dict[str, str]:
    """The versions whose code shapes a run (every rank must run the same)."""
    import transformers

    from seal_mini import __version__

    return {"seal_mini": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def resume_config(run_dir: Path, recipe: str | None, overrides: list[str]) -> Config:
    """The config `train --resume RUN_DIR [RECIPE] [k=v ...]` continues with: the run's saved config (or
    the recipe) plus overrides, living where run_dir is now; train() refuses any change to the math."""
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    if any(text.split("=", 1)[0].strip() in ("name", "out_dir") for text in overrides):
        raise ConfigError(f"--resume {run_dir} names the run already; drop the name= / out_dir= overrides")
    cfg = load_config(recipe, overrides) if recipe else config_from_dict(saved_config(run_dir).to_dict(), overrides)
    cfg.out_dir, cfg.name = str(run_dir.parent), run_dir.name  # the folder may have moved
    return cfg


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini train", description="SEAL training")
    parser.add_argument("recipe", nargs="?", help="recipes/X.yaml (optional with --resume)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR (settings in MATH_FREE may change)"
    )
    parser.add_argument(
        "--restart", action="store_true", help="move what the run directory holds aside, start at step 0"
    )
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.recipe and "=" in args.recipe and not args.recipe.endswith((".yaml", ".yml")):
        args.overrides, args.recipe = [args.recipe, *args.overrides], None  # only overrides were given
    if args.resume:
        if args.restart:
            raise ConfigError("--resume continues a run and --restart starts it over; give one of them")
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise ConfigError(f"--resume {run_dir}: no such folder")
    elif not args.recipe:
        raise ConfigError("train needs a recipe (e.g. recipes/cpu_smoke.yaml) or --resume RUN_DIR")
    else:
        cfg = load_config(args.recipe, args.overrides)
        run_dir = cfg.run_dir
    with run_lock(run_dir, " ".join([parser.prog, *argv])):
        if args.resume:  # read the run's config only once no other command can be writing it
            cfg = resume_config(run_dir, args.recipe, args.overrides)
        run_dir, _ = train(cfg, resume=bool(args.resume), restart=args.restart)
    print(json.dumps({"run_dir": str(run_dir)}))
    return 0
