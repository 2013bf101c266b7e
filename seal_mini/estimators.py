"""The update's named choices, each declared once beside its function: advantage estimators
(train.adv_estimator), loss aggregations (train.loss_agg) and the level of the diagnostic weight
(diagnosis.weight_level).

LEARNER EDIT POINT: a new estimator or aggregation is one function and one entry in its table below;
the config accepts the new name at once (it validates against these tables), and seal_mini.core.grpo
calls it. The functions use tensor methods only, so the config can read the tables without importing
torch (`oracle` and `diagnose-check` never load it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

# --- advantage estimators ---------------------------------------------------------------------------
# Each maps the rewards of one task group, r (G,) with G >= 2 and not all equal, to advantages (G,).
# group_advantages (core/grpo.py) gives groups of one or of equal rewards exactly 0 before any is called.


def grpo_advantages(r: Tensor, eps: float) -> Tensor:
    """GRPO (the paper): (r_j - mean) / (std + eps), Bessel-corrected std."""
    return (r - r.mean()) / (r.std(correction=1) + eps)


def dr_grpo_advantages(r: Tensor, eps: float) -> Tensor:
    """Dr. GRPO: r_j - mean. Without the std division a group with little spread (nearly all succeed, or
    nearly all fail) is not amplified to the loudness of one split half and half."""
    return r - r.mean()


def rloo_advantages(r: Tensor, eps: float) -> Tensor:
    """RLOO: r_j minus the mean of the other G-1 rewards of the group (a baseline that excludes j itself);
    equal to G / (G-1) * (r_j - mean)."""
    others_mean = (r.sum() - r) / (r.numel() - 1)  # (G,)
    return r - others_mean


ADVANTAGE_ESTIMATORS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}

# --- loss aggregations ------------------------------------------------------------------------------
# Each maps, per sequence, (its loss-token count n_i (B,), the mini-batch's loss tokens N, the
# mini-batch's sequences S, token_sum_norm) to the divisor of that sequence's token sum of the loss.
# The mini-batch's loss is then sum_i sum_t loss_it / divisor_i, whatever micro-batches (and ranks) the
# sequences are spread over, since N and S are the whole mini-batch's counts.


def token_mean(n_i: Tensor, n_tokens: float, n_sequences: float, norm: float) -> Tensor:
    """(1 / N) sum over every loss token of the mini-batch: each token weighs the same (the paper)."""
    return n_i.new_full(n_i.shape, n_tokens)


def seq_mean_token_mean(n_i: Tensor, n_tokens: float, n_sequences: float, norm: float) -> Tensor:
    """(1 / S) sum_i (1 / n_i) sum_t: each sequence weighs the same, a short one's tokens more than a long one's."""
    return n_sequences * n_i.clamp(min=1.0)  # a sequence without loss tokens adds 0, never 0/0


def seq_mean_token_sum(n_i: Tensor, n_tokens: float, n_sequences: float, norm: float) -> Tensor:
    """(1 / S) sum_i (1 / norm) sum_t: a constant per sequence (Dr. GRPO), so a long sequence weighs more."""
    return n_i.new_full(n_i.shape, n_sequences * norm)


LOSS_AGGREGATIONS: dict[str, Callable[[Tensor, float, float, float], Tensor]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
}

# --- the level of the diagnostic weight ----------------------------------------------------------------
# Each maps, for one trajectory, u (K,) the clipped rho of each task turn's label and turn (T,) the task
# turn of each token to a scale per token (T,) whose mean over the sampled tokens `mask` (T,) is 1. The
# token's weight is then w_j times its scale: the trajectory's mean token weight stays w_j, the weight
# the paper gives the whole trajectory (core/grpo.py: turn_scales).


def trajectory_level(u: Tensor, turn: Tensor, mask: Tensor) -> Tensor:
    """The paper and the authors' release: one weight for every token of the trajectory."""
    return turn.new_ones(turn.shape, dtype=u.dtype)


def turn_level(u: Tensor, turn: Tensor, mask: Tensor) -> Tensor:
    """The weight where the diagnosis puts it: each token in proportion to its own turn's rho, so a failed
    turn's tokens are louder (or quieter) than the passed turns' of the same trajectory. The scale is not
    clipped: w_j x scale reaches w_max^2 / w_min for a short failed turn beside long passed ones."""
    per_token = u[turn]  # (T,)
    mean = (per_token * mask).sum() / mask.sum().clamp(min=1)
    return per_token / mean


WEIGHT_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "trajectory": trajectory_level,
    "turn": turn_level,
}
