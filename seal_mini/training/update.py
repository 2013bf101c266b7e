"""The policy update of one round: clipped policy-gradient steps over mini-batches of its trajectories.

A round's B x G trajectories are cut into mini-batches of train.mini_batch_tasks tasks; each mini-batch is
one optimizer step, its gradient accumulated over micro-batches of train.micro_batch sequences. The math
of the loss (advantages, weights, clipped surrogate, KL, aggregation) is in seal_mini.core.grpo; this file
is the plumbing around it: padding, gradient accumulation, ranks, non-finite guards, out-of-memory retries.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from functools import partial

import torch
from tqdm import tqdm

from seal_mini.config import Config, ConfigError, TrainConfig
from seal_mini.core.grpo import loss_divisors, policy_loss
from seal_mini.distributed import all_reduce_gradients, all_reduce_sum, all_reduce_sums, is_main
from seal_mini.engine.device import MemoryLimits, until_it_fits
from seal_mini.engine.logprobs import right_pad, token_logprobs
from seal_mini.engine.sequences import Trajectory, scored_temperature


def collate(trajectories: list[Trajectory], device) -> tuple[torch.Tensor, ...]:
    """Right-pad a micro-batch: input_ids, attention_mask, loss_mask (B, T) and old log-probs (B, T)."""
    ids = right_pad([t.input_ids for t in trajectories], torch.long)
    attention = right_pad([[1] * len(t.input_ids) for t in trajectories], torch.long)
    mask = right_pad([t.loss_mask for t in trajectories], torch.float32)
    old = right_pad([t.old_logprobs for t in trajectories], torch.float32)
    return ids.to(device), attention.to(device), mask.to(device), old.to(device)


def segment(t: Trajectory, start: int, end: int) -> Trajectory:
    """One segment of a trajectory as a sequence of its own (Trajectory.spans)."""
    if (start, end) == (0, len(t.input_ids)):
        return t
    cut = slice(start, end)
    return replace(
        t, input_ids=t.input_ids[cut], loss_mask=t.loss_mask[cut], old_logprobs=t.old_logprobs[cut], segments=[]
    )


def update(
    policy,
    optimizer,
    scheduler,
    trajectories: list[Trajectory],
    advantages: torch.Tensor,
    cfg: Config,
    positions: list[int] | None = None,
    progress: tqdm | None = None,
    scales: list[torch.Tensor] | None = None,
):
    """One pass of clipped policy-gradient steps: mini-batches of tasks, micro-batches of sequences.

    `positions` says where each trajectory stands in the round (default: they are the round, in order).
    With several ranks each holds some of the round: it computes the gradients of its part of every
    mini-batch, and the mini-batch's counts and the gradients are summed over the ranks before the step.
    Each segment of a trajectory (a prompt BFCL wrote anew, Trajectory.segments) is a sequence of its own,
    with its trajectory's advantage; the aggregation still counts the trajectory as one sequence.
    `scales` (diagnosis.weight_level: turn) holds a (T,) scale per trajectory: the advantage of its token t
    is then advantages[i] x scales[i][t] (grpo.turn_scales). `progress` (a tqdm bar) counts this rank's
    sequences through each forward pass.

    A mini-batch whose loss or gradient norm is not finite takes no step: its gradients are dropped, the
    skip is counted (losses/skipped_steps) and printed, and the averages leave it out. Every rank sees the
    same summed loss and gradient, and any rank's non-finite value skips the step on all of them. A CUDA
    out-of-memory error redoes the mini-batch from its start with half the micro-batch (then half the
    log-prob chunk); the smaller setting stays for the rest of the run (policy.limits)."""
    model, tc = policy.model, cfg.train
    progress = tqdm(disable=True) if progress is None else progress
    params = policy.trainable_parameters()
    per_mini = tc.mini_batch_tasks * cfg.rollout.group_size
    positions = list(range(len(trajectories))) if positions is None else positions
    round_size = all_reduce_sum(len(trajectories))  # the round's trajectories, on all ranks together
    spans = [(i, a, b) for i, t in enumerate(trajectories) for a, b in t.spans()]
    rows = [segment(trajectories[i], a, b) for i, a, b in spans]
    owned = [sum(trajectories[i].loss_mask) for i, _, _ in spans]  # loss tokens of each row's trajectory
    # rows that sampled nothing (a prompt over the limit) carry no loss and are left out
    minis = [
        [r for r, (i, _, _) in enumerate(spans) if start <= positions[i] < start + per_mini and any(rows[r].loss_mask)]
        for start in range(0, round_size, per_mini)
    ]
    model.train()
    recompute = tc.old_logprobs == "recompute"
    progress.reset(total=(1 + recompute) * sum(len(mini) for mini in minis))
    if recompute:  # the old log-probs of the current policy, before it takes a step
        rows = recompute_old_logprobs(policy, rows, minis, cfg, progress)
    # policy_loss divides every micro-batch by its mini-batch's counts, so metric sums over one
    # mini-batch are that mini-batch's means; averaging over the optimizer steps gives the round's.
    sums: dict[str, float] = {}
    first: dict[str, float] = {}
    steps = skipped = 0

    def redo_smaller() -> None:  # out of memory: the failed try's partial gradients go, the next try is smaller
        optimizer.zero_grad(set_to_none=True)
        shrink_update(policy.limits, tc)
        progress.n = bar_start  # the mini-batch's sequences count again

    for k, mini in enumerate(minis):
        # the aggregation's denominators (grpo.loss_divisors), on all ranks together: the mini-batch's loss
        # tokens and its trajectories (every row of it has loss tokens)
        n_tokens = all_reduce_sum(sum(sum(rows[r].loss_mask) for r in mini))
        n_sequences = all_reduce_sum(len({spans[r][0] for r in mini}))
        if n_tokens == 0:
            continue
        batch = [rows[r] for r in mini]
        bar_start = progress.n
        if scales is None:
            adv = advantages[[spans[r][0] for r in mini]]
        else:
            adv = [(advantages[i] * scales[i][a:b]).tolist() for i, a, b in (spans[r] for r in mini)]
        whole = torch.tensor([owned[r] for r in mini], dtype=torch.float32)
        attempt = partial(accumulate_gradients, policy, batch, adv, n_tokens, n_sequences, cfg, progress, whole)
        mini_sums = until_it_fits(attempt, redo_smaller, policy.device)
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
    policy,
    trajectories: list[Trajectory],
    advantages: torch.Tensor | list[list[float]],
    n_tokens: int,
    n_sequences: int,
    cfg: Config,
    progress: tqdm,
    whole: torch.Tensor,
) -> dict[str, float]:
    """Forward and backward one mini-batch, a micro-batch at a time (gradients add up); returns metric sums.
    `advantages` is one per sequence (B,), or a list of one per token for each sequence; n_tokens and
    n_sequences count the whole mini-batch on all ranks; `whole` (B,) holds the loss tokens of the
    trajectory each sequence is a segment of."""
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
        micro_adv = advantages[m : m + micro_batch]  # (b,), or b lists of T_i
        micro_adv = (right_pad(micro_adv, torch.float32) if isinstance(micro_adv, list) else micro_adv).to(
            policy.device
        )
        n_i = whole[m : m + micro_batch].to(policy.device)  # (b,)
        divisors = loss_divisors(mask, tc.loss_agg, n_tokens, n_sequences, token_sum_norm, n_i)  # (b,)
        loss, metrics = policy_loss(logp, old, ref, micro_adv, mask, tc.clip_ratio, tc.kl_coef, n_tokens, divisors)
        loss.backward()
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        progress.update(len(micro_adv))
    return sums


def recompute_old_logprobs(
    policy, trajectories: list[Trajectory], minis: list[list[int]], cfg: Config, progress: tqdm
) -> list[Trajectory]:
    """The trajectories with the current policy's log-probs as their old ones (train.old_logprobs: recompute).

    One no-grad forward, in the mode (model.train()) and the micro-batches of the training forward, so the
    first mini-batch's training forward computes the very same numbers and its ratio is exactly 1. Sampling
    runs other kernels (a KV cache, left padding, bf16 or 4-bit no-grad paths on a GPU), so the log-probs it
    recorded differ from the training forward's and would bias every ratio. Out of GPU memory: the shrunk
    micro-batch or log-prob chunk, from the start."""
    start = progress.n

    def recompute() -> list[Trajectory]:
        progress.n = start  # a retry after running out of memory counts from the start again
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
                    progress.update(len(part))
        return out

    return until_it_fits(recompute, lambda: shrink_update(policy.limits, cfg.train), policy.device)


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
