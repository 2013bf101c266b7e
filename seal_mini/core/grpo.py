"""The math of one SEAL update, as small pure functions: advantages, diagnostic weights, the loss.

How this differs from textbook GRPO (paper, section "the loop", steps 5-7):
1. Advantages are group-relative per task, A_j = (r_j - mean_g) / (std_g + eps), with the
   Bessel-corrected std (torch.std's default, the one verl's GRPO uses). A group whose rewards are
   all equal carries no signal: its advantages are exactly 0 (never 0/0). Two other estimators are a
   config key away (train.adv_estimator; each is declared once, in seal_mini/estimators.py): dr_grpo, rloo.
2. Each advantage is scaled by a diagnostic weight w_j = clip(sum_z p_j(z) rho(z), w_min, w_max) > 0,
   where p_j(z) is the share of trajectory j's turns labelled z. The weight is positive, so the
   verifier alone decides the sign; the diagnosis only decides how loud the signal is. Two kit variants
   (diagnosis.weight_level: turn, and diagnosis.shuffle_weights, a control): the weight spread over the
   tokens by each turn's label (turn_scales), and the labels permuted among a group's failures.
3. The loss is the PPO clipped surrogate, a token-mean over the tokens the model sampled
   (loss_mask), plus a k3 KL term to the reference policy; no entropy bonus. Two other aggregations
   are a config key away (train.loss_agg, seal_mini/estimators.py). The log-ratios are clamped
   before exp and the k3 term after it, as verl does (LOG_RATIO_CLAMP, KL_CLAMP).

Every function returns (value, metrics) where metrics are plain floats with namespaced keys
(`adv/...`, `weights/...`, `rho/...`, `losses/...`), ready for metrics.jsonl.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seal_mini.config import DiagnosisConfig
from seal_mini.estimators import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, WEIGHT_LEVELS
from seal_mini.labels import RHO_HELD


def _group_index(n: int, group_ids) -> torch.Tensor:
    """group_ids as a tensor (N,) of ids, or an int G meaning consecutive groups of G."""
    if isinstance(group_ids, int):
        assert group_ids > 0 and n % group_ids == 0, f"{n} rewards do not split into groups of {group_ids}"
        return torch.arange(n) // group_ids
    ids = torch.as_tensor(group_ids)
    assert ids.shape == (n,), f"group_ids shape {tuple(ids.shape)} != rewards shape ({n},)"
    return ids


def group_advantages(rewards, group_ids, eps: float = 1e-6, estimator: str = "grpo") -> tuple[torch.Tensor, dict]:
    """Group-relative advantages per task group (default GRPO's (r_j - mean_g) / (std_g + eps)); groups of
    one or of all-equal rewards get exactly 0 whatever the estimator."""
    assert estimator in ADVANTAGE_ESTIMATORS, f"unknown estimator {estimator!r}; known: {list(ADVANTAGE_ESTIMATORS)}"
    r = torch.as_tensor(rewards, dtype=torch.float32)  # (N,)
    assert r.dim() == 1, f"rewards must be 1-D (N,), got shape {tuple(r.shape)}"
    assert torch.isfinite(r).all(), "rewards contain NaN or inf"
    ids = _group_index(r.numel(), group_ids)  # (N,)
    adv = torch.zeros_like(r)  # (N,)
    flat_groups = 0
    groups = torch.unique(ids)
    for g in groups:
        members = ids == g
        r_g = r[members]  # (G,)
        # A group of one or of equal rewards has no spread: the advantage is 0 by definition, and
        # computing it would divide 0 by eps (or give NaN from a one-sample unbiased std).
        if r_g.numel() < 2 or bool((r_g == r_g[0]).all()):
            flat_groups += 1
            continue
        adv[members] = ADVANTAGE_ESTIMATORS[estimator](r_g, eps)
    metrics = {
        "adv/zero_frac": float((adv == 0).float().mean()) if r.numel() else 0.0,
        "adv/flat_group_frac": flat_groups / max(len(groups), 1),
        "adv/abs_mean": float(adv.abs().mean()) if r.numel() else 0.0,
        "adv/reward_mean": float(r.mean()) if r.numel() else 0.0,
    }
    return adv, metrics


def diagnostic_weights(
    profiles: Sequence[dict[str, float]], rho: dict[str, float], w_min: float, w_max: float
) -> tuple[torch.Tensor, dict]:
    """w_j = clip(sum_z p_j(z) rho(z), w_min, w_max), one weight per trajectory."""
    assert 0 < w_min <= w_max, f"need 0 < w_min <= w_max, got {w_min}, {w_max}"
    raw = []
    for j, shares in enumerate(profiles):
        total = sum(shares.values())
        assert abs(total - 1.0) < 1e-6, f"trajectory {j}: label shares sum to {total}, not 1"
        unknown = [z for z in shares if z not in rho]
        assert not unknown, f"trajectory {j}: labels {unknown} have no rho value"
        raw.append(sum(p * rho[z] for z, p in shares.items()))
    raw_t = torch.tensor(raw, dtype=torch.float32)  # (N,)
    w = raw_t.clamp(w_min, w_max)  # (N,)
    n = max(len(raw), 1)
    metrics = {
        "weights/mean": float(w.mean()) if raw else 0.0,
        "weights/min": float(w.min()) if raw else 0.0,
        "weights/max": float(w.max()) if raw else 0.0,
        "weights/clip_low_frac": float((raw_t < w_min).sum()) / n,
        "weights/clip_high_frac": float((raw_t > w_max).sum()) / n,
    }
    return w, metrics


def turn_scales(
    level: str,
    labels: list[str],
    turn_starts: list[int],
    loss_mask: list[int],
    rho: dict[str, float],
    w_min: float,
    w_max: float,
) -> torch.Tensor:
    """(T,) one trajectory's scale per token (mean 1 over its sampled tokens): w_j x scale is the token's weight.

    `labels` has one label per task turn, `turn_starts` where each played turn's tokens begin (Trajectory).
    u_k = clip(rho(z_k), w_min, w_max); diagnosis.weight_level picks how u becomes scales (estimators.py)."""
    mask = torch.tensor(loss_mask, dtype=torch.float32)  # (T,)
    if not turn_starts or not mask.any():
        return torch.ones_like(mask)
    u = torch.tensor([min(w_max, max(w_min, rho[z])) for z in labels], dtype=torch.float32)  # (K,)
    starts = torch.tensor(turn_starts[: len(labels)])  # (K',)
    turn = (torch.searchsorted(starts, torch.arange(len(loss_mask)), right=True) - 1).clamp(min=0)  # (T,)
    return WEIGHT_LEVELS[level](u, turn, mask)


def shuffled_among_failures(labels: list[list[str]], rewards: list[float], group_size: int, generator) -> list:
    """The control of diagnosis.shuffle_weights: each group's failed trajectories (reward below the group's
    best) trade their labels at random, so the weights keep their sizes (and, with 0/1 rewards, the group's
    total on its failures) and lose which failed trajectory gets which. Successes, and groups with one
    failure or none, keep theirs."""
    out = list(labels)
    for g in range(0, len(labels), group_size):
        best = max(rewards[g : g + group_size])
        failed = [i for i in range(g, g + group_size) if rewards[i] < best]
        for i, j in zip(failed, [failed[k] for k in torch.randperm(len(failed), generator=generator)], strict=True):
            out[i] = labels[j]
    return out


def weighted_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """w_j * A_j; the weights must be positive so no advantage changes sign."""
    assert advantages.shape == weights.shape, f"shapes differ: {tuple(advantages.shape)} vs {tuple(weights.shape)}"
    assert bool((weights > 0).all()), "diagnostic weights must be > 0 (a weight <= 0 would flip or erase a sign)"
    return advantages * weights  # (N,)


def ema_rho(
    rho_prev: dict[str, float] | None, profile: dict[str, dict], cfg: DiagnosisConfig, held: tuple[str, ...] = RHO_HELD
) -> tuple[dict[str, float], dict]:
    """The authors' release variant: rho_t moves from rho_{t-1} towards a target drawn from this round's C_t.

    target(z) = base(z) * (1 + prevalence(z) * (1 - success_rate(z)) * min(1, count(z) / count_scale))
    rho_t(z)  = clip(decay * rho_{t-1}(z) + (1 - decay) * target(z), rho_min, rho_max)
    with base = cfg.rho and the other constants from cfg (diagnosis.rho_ema_*, rho_min, rho_max); rho_prev
    None starts the walk from the base. Labels in `held` (pass, not_reached) keep their base value. The clip
    is applied to the moved value, the plainest reading of "EMA ..., clipped [0.5, 2]"."""
    rho_base, decay, count_scale = cfg.rho, cfg.rho_ema_decay, cfg.rho_ema_count_scale
    rho_min, rho_max = cfg.rho_min, cfg.rho_max
    assert 0.0 <= decay <= 1.0, f"decay must be in [0, 1], got {decay}"
    assert count_scale > 0 and 0 < rho_min <= rho_max
    prev = dict(rho_base) if rho_prev is None else rho_prev
    assert set(prev) == set(rho_base), f"rho_prev labels {sorted(prev)} differ from rho_base labels {sorted(rho_base)}"
    new, metrics = {}, {}
    for z, base in rho_base.items():
        entry = profile.get(z)
        boost = 0.0
        if entry is not None and entry["count"] > 0:  # an absent label's target is its base: it relaxes back
            missing = [k for k in ("count", "prevalence", "success_rate") if k not in entry]
            assert not missing, f"profile entry {z!r} lacks {missing}"
            confidence = min(1.0, entry["count"] / count_scale)  # few sightings move rho little
            boost = entry["prevalence"] * (1.0 - entry["success_rate"]) * confidence
        target = base * (1.0 + boost)
        moved = min(rho_max, max(rho_min, decay * prev[z] + (1.0 - decay) * target))
        new[z] = base if z in held else moved
        metrics[f"rho/{z}"] = new[z]
    return new, metrics


# --- the loss -------------------------------------------------------------------------------------

LOG_RATIO_CLAMP = 20.0
"""|log pi - log pi_old| and |log pi_ref - log pi| are clamped to this before exp, as verl does: exp(20) is
about 4.9e8, finite in float32 and bf16, while a log-ratio that has run away (a token the sampler drew at
a probability the training forward puts near 0) would overflow to inf and turn the loss into NaN."""
KL_CLAMP = 10.0
"""The per-token k3 KL term is clamped to [-KL_CLAMP, KL_CLAMP], as verl's low_var_kl is: one token far
from the reference cannot dominate the loss (k3 >= 0, so only the upper bound can bite)."""


def loss_divisors(
    loss_mask: torch.Tensor,
    loss_agg: str,
    n_tokens: float,
    n_sequences: float,
    token_sum_norm: float = 1.0,
    n_i: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,) what each sequence's token sum of the loss is divided by; pass it to policy_loss as `divisors`.

    n_tokens and n_sequences are the counts of the WHOLE mini-batch (over its micro-batches, and summed
    over the ranks), so the micro-batch losses add up to the mini-batch's aggregate however it is split.
    n_i (B,): each sequence's loss tokens where a row is one segment of a longer trajectory (its
    trajectory's; default: the row's own loss_mask sum)."""
    assert loss_agg in LOSS_AGGREGATIONS, f"unknown loss_agg {loss_agg!r}; known: {list(LOSS_AGGREGATIONS)}"
    assert loss_mask.dim() == 2, f"loss_mask must be (B, T), got {tuple(loss_mask.shape)}"
    assert n_tokens > 0 and n_sequences > 0 and token_sum_norm > 0
    n_i = loss_mask.float().sum(-1) if n_i is None else n_i.float()  # (B,)
    return LOSS_AGGREGATIONS[loss_agg](n_i, float(n_tokens), float(n_sequences), float(token_sum_norm))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_ratio: float,
    kl_coef: float,
    num_tokens: float | None = None,
    divisors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate + kl_coef * k3 KL to the reference, summed over loss_mask / num_tokens.

    Token-mean under gradient accumulation: a mini-batch is split into micro-batches, each gets its
    own backward. Pass num_tokens = the loss_mask sum of the WHOLE mini-batch to every micro-batch
    call and do not divide again: the micro-batch losses then add up to the token-mean over the
    mini-batch, whatever the split (dividing each micro-batch by its own token count would weight a
    short sequence's tokens more than a long one's). num_tokens=None uses this call's own count.
    Another aggregation (train.loss_agg) passes `divisors` (B,) from loss_divisors: sequence i's token
    sum of the loss is divided by divisors[i] instead of num_tokens.

    Every metric but losses/tokens is likewise a sum over this call's tokens divided by num_tokens,
    so summing a metric over the micro-batches of a mini-batch gives its token mean over the
    mini-batch (losses/tokens is a plain count and sums to the mini-batch's count). losses/loss,
    losses/pg_loss and losses/kl_ref are the loss's own terms, so they follow `divisors` when given;
    the diagnostics (ratio, approx_kl, clipfrac) stay token means whatever the aggregation.

    Positions where loss_mask is 0 may hold anything (log-probs are only computed where it is 1):
    they are zeroed before any exp, so they can never produce inf or NaN."""
    assert logprobs.dim() == 2, f"logprobs must be (B, T), got {tuple(logprobs.shape)}"
    B, T = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("loss_mask", loss_mask)):
        assert t.shape == (B, T), f"{name} shape {tuple(t.shape)} != logprobs shape {(B, T)}"
    assert advantages.shape in ((B,), (B, T)), f"advantages must be (B,) or (B, T), got {tuple(advantages.shape)}"
    assert kl_coef == 0 or ref_logprobs is not None, "kl_coef > 0 needs ref_logprobs"
    assert clip_ratio > 0

    mask = loss_mask.bool()  # (B, T)
    maskf = mask.float()  # (B, T)
    n = float(num_tokens) if num_tokens is not None else max(float(maskf.sum()), 1.0)
    assert n > 0, "num_tokens must be > 0"
    logp = logprobs.float()  # (B, T)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if divisors is None:
        token_weight = maskf / n  # (B, T): token-mean
    else:
        assert divisors.shape == (B,), f"divisors must be (B,) = ({B},), got {tuple(divisors.shape)}"
        token_weight = maskf / divisors.float().to(logp.device)[:, None]  # (B, T)

    log_ratio = torch.where(mask, logp - old_logprobs.float(), zero)  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.float().to(logp.device)  # (B,) the sequence's advantage, or (B, T) one per token
    adv = adv[:, None] if adv.dim() == 1 else adv
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)  # (B, T)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # (B, T): the pessimistic of the two
    pg_loss = (pg * token_weight).sum()
    loss = pg_loss

    kl_ref = torch.zeros((), device=logp.device)
    if ref_logprobs is not None:
        # k3 estimator of KL(pi || pi_ref): exp(d) - d - 1 with d = log pi_ref - log pi; >= 0, unbiased.
        d = torch.where(mask, ref_logprobs.float() - logp, zero)  # (B, T)
        d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_tok = (torch.exp(d) - d - 1.0).clamp(-KL_CLAMP, KL_CLAMP)  # (B, T)
        kl_ref = (kl_tok * token_weight).sum()
        if kl_coef:
            loss = loss + kl_coef * kl_ref

    with torch.no_grad():
        # clipfrac counts tokens where the clipped branch is the active one (their gradient is 0).
        clipped = (pg_clipped > pg_unclipped) & mask
        approx_kl = ((ratio - 1.0) - log_ratio) * maskf  # k3 estimate of KL(old || new), per token
        metrics = {
            "losses/loss": float(loss.detach()),
            "losses/pg_loss": float(pg_loss.detach()),
            "losses/kl_ref": float(kl_ref.detach()),
            "losses/approx_kl": float(approx_kl.sum()) / n,
            "losses/clipfrac": float(clipped.float().sum()) / n,
            "losses/ratio_mean": float((ratio * maskf).sum()) / n,
            "losses/tokens": float(maskf.sum()),
        }
    return loss, metrics
