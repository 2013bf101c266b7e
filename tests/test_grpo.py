"""seal_mini.core.grpo against numbers computed by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from seal_mini.config import DEFAULT_RHO, ConfigError, DiagnosisConfig, load_config
from seal_mini.core.grpo import (
    KL_CLAMP,
    LOG_RATIO_CLAMP,
    diagnostic_weights,
    ema_rho,
    group_advantages,
    loss_divisors,
    policy_loss,
    shuffled_among_failures,
    turn_scales,
    weighted_advantages,
)
from seal_mini.estimators import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

LN2 = math.log(2.0)
LN15 = math.log(1.5)


# --- advantages ----------------------------------------------------------------------------------


def test_group_advantages_unbiased_std_by_hand():
    # Group [1, 0, 0, 0]: mean 0.25, deviations 0.75, -0.25 x3, sum of squares 0.75,
    # Bessel-corrected variance 0.75 / 3 = 0.25, std 0.5 -> A = 1.5, -0.5, -0.5, -0.5.
    # Group [1, 1, 0, 0]: mean 0.5, sum of squares 1.0, variance 1/3, std 0.57735 -> A = +-0.866025.
    adv, m = group_advantages([1, 0, 0, 0, 1, 1, 0, 0], 4, eps=0.0)
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.866025, 0.866025, -0.866025, -0.866025])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert m["adv/zero_frac"] == 0.0
    # A population std (divide by 4) would give 0.75 / 0.4330 = 1.732 for the first entry instead.
    assert not math.isclose(float(adv[0]), 1.732, abs_tol=1e-2)


def test_group_advantages_eps_in_denominator():
    # Group [1, 0]: mean 0.5, std (n-1) = sqrt(0.5) = 0.707107; with eps 0.1: 0.5 / 0.807107 = 0.619497.
    adv, _ = group_advantages([1.0, 0.0], 2, eps=0.1)
    assert torch.allclose(adv, torch.tensor([0.619497, -0.619497]), atol=1e-5)


def test_all_equal_groups_are_exactly_zero_no_nan():
    rewards = [1, 1, 1, 1, 0, 0, 0, 0, 0.3, 0.3, 0.3, 0.3, 1, 0, 1, 0]
    adv, m = group_advantages(rewards, 4)
    assert torch.isfinite(adv).all()
    assert (adv[:12] == 0).all()  # exactly zero, not merely small
    assert m["adv/zero_frac"] == 12 / 16
    assert m["adv/flat_group_frac"] == 3 / 4


def test_group_ids_need_not_be_consecutive():
    # Same numbers as the first test, interleaved, with explicit ids.
    adv, _ = group_advantages([1, 1, 0, 1, 0, 0, 0, 0], [7, 3, 7, 3, 7, 3, 7, 3], eps=0.0)
    expected = torch.tensor([1.5, 0.866025, -0.5, 0.866025, -0.5, -0.866025, -0.5, -0.866025])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_group_of_one_is_zero():
    adv, _ = group_advantages([1.0, 1.0, 0.0], [0, 0, 1])
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_group_advantages_reject_bad_input():
    with pytest.raises(AssertionError, match="groups of 3"):
        group_advantages([1, 0, 1, 0], 3)
    with pytest.raises(AssertionError, match="NaN"):
        group_advantages([1, float("nan")], 2)


# --- diagnostic weights --------------------------------------------------------------------------


def test_diagnostic_weights_by_hand_with_clip():
    rho = dict(DEFAULT_RHO)
    profiles = [
        {"pass": 1.0},  # 1.0
        {"pass": 0.5, "spurious_tool_call": 0.5},  # 0.5 * 1.0 + 0.5 * 2.0 = 1.5
        {"response_mismatch": 0.75, "pass": 0.25},  # 0.675 + 0.25 = 0.925
        {"spurious_tool_call": 1.0},  # 2.0, exactly at the upper bound (not clipped)
    ]
    w, m = diagnostic_weights(profiles, rho, 0.5, 2.0)
    assert torch.allclose(w, torch.tensor([1.0, 1.5, 0.925, 2.0]))
    assert m["weights/clip_low_frac"] == 0.0 and m["weights/clip_high_frac"] == 0.0
    # Tighter clip [0.95, 1.4]: 1.0 stays, 1.5 -> 1.4, 0.925 -> 0.95, 2.0 -> 1.4.
    w, m = diagnostic_weights(profiles, rho, 0.95, 1.4)
    assert torch.allclose(w, torch.tensor([1.0, 1.4, 0.95, 1.4]))
    assert m["weights/clip_low_frac"] == 0.25 and m["weights/clip_high_frac"] == 0.5
    assert m["weights/min"] == pytest.approx(0.95) and m["weights/max"] == pytest.approx(1.4)
    assert m["weights/mean"] == pytest.approx((1.0 + 1.4 + 0.95 + 1.4) / 4)


def test_diagnostic_weights_reject_bad_profiles():
    with pytest.raises(AssertionError, match="sum to"):
        diagnostic_weights([{"pass": 0.5}], DEFAULT_RHO, 0.5, 2.0)
    with pytest.raises(AssertionError, match="no rho"):
        diagnostic_weights([{"made_up": 1.0}], DEFAULT_RHO, 0.5, 2.0)


def test_weighted_advantages_preserve_sign():
    adv = torch.tensor([1.5, -0.5, 0.0, -2.0])
    w = torch.tensor([2.0, 0.5, 1.8, 1.2])
    out = weighted_advantages(adv, w)
    assert out.tolist() == pytest.approx([3.0, -0.25, 0.0, -2.4])
    assert (torch.sign(out) == torch.sign(adv)).all()
    with pytest.raises(AssertionError, match="> 0"):
        weighted_advantages(adv, torch.tensor([1.0, 0.0, 1.0, 1.0]))


# --- rho, release variant ------------------------------------------------------------------------


def test_ema_rho_by_hand():
    base = {"pass": 1.0, "state_mismatch": 1.0, "spurious_tool_call": 2.0, "missing_tool_call": 1.5}
    profile = {
        # target = 1.0 * (1 + 0.4 * (1 - 0.25) * min(1, 16/32)) = 1 + 0.4*0.75*0.5 = 1.15
        "state_mismatch": {"count": 16, "prevalence": 0.4, "success_rate": 0.25},
        # target = 1.5 * (1 + 0.2 * 1.0 * 1) = 1.8 (count 64 saturates at 1)
        "missing_tool_call": {"count": 64, "prevalence": 0.2, "success_rate": 0.0},
        # target = 2.0 * (1 + 0.5 * 0.5 * 1) = 2.5; EMA from 2.0: 0.75*2 + 0.25*2.5 = 2.125 -> clip 2.0
        "spurious_tool_call": {"count": 40, "prevalence": 0.5, "success_rate": 0.5},
    }
    prev = {"pass": 0.6, "state_mismatch": 1.0, "spurious_tool_call": 2.0, "missing_tool_call": 1.5}
    rho, m = ema_rho(prev, profile, DiagnosisConfig(rho=base))
    # pass carries no failure to emphasise: it stays at its base value whatever the previous rho said
    assert rho["pass"] == 1.0
    assert rho["state_mismatch"] == pytest.approx(0.75 * 1.0 + 0.25 * 1.15)  # 1.0375
    assert rho["missing_tool_call"] == pytest.approx(0.75 * 1.5 + 0.25 * 1.8)  # 1.575
    assert rho["spurious_tool_call"] == 2.0
    assert m["rho/state_mismatch"] == pytest.approx(1.0375)
    # Without a previous rho the walk starts from the base.
    rho0, _ = ema_rho(None, {}, DiagnosisConfig(rho=base))
    assert rho0 == base


def test_ema_rho_holds_pass_and_not_reached_at_their_base():
    base = {"pass": 1.0, "not_reached": 1.0, "missing_tool_call": 1.5}
    profile = {
        # were they moved: target 1.0 * (1 + 0.5 * 1.0 * 1) = 1.5, rho 0.75 * 1.0 + 0.25 * 1.5 = 1.125
        "pass": {"count": 64, "prevalence": 0.5, "success_rate": 0.0},
        "not_reached": {"count": 64, "prevalence": 0.3, "success_rate": 0.0},
        # target 1.5 * (1 + 0.25 * 0.5 * 8/32) = 1.546875; rho 0.75 * 1.5 + 0.25 * 1.546875 = 1.51171875
        "missing_tool_call": {"count": 8, "prevalence": 0.25, "success_rate": 0.5},
    }
    rho, m = ema_rho(None, profile, DiagnosisConfig(rho=base))
    assert rho == {"pass": 1.0, "not_reached": 1.0, "missing_tool_call": pytest.approx(1.51171875)}
    assert m["rho/pass"] == 1.0 and m["rho/not_reached"] == 1.0
    rho, _ = ema_rho(
        {"pass": 1.0, "not_reached": 1.0, "missing_tool_call": 1.5}, profile, DiagnosisConfig(rho=base), held=()
    )
    assert rho["pass"] == pytest.approx(1.125)  # the same profile moves them once nothing is held


def test_ema_rho_rejects_incomplete_profile():
    with pytest.raises(AssertionError, match="lacks"):
        ema_rho(None, {"pass": {"count": 3}}, DiagnosisConfig(rho={"pass": 1.0}))


# --- the loss ------------------------------------------------------------------------------------


def _four_cases():
    """Four one-token sequences, ratio inside/outside the clip for A = +1 and -1.

    Second position is masked and holds garbage (huge values) that must not matter."""
    logp = torch.tensor([[LN15, 50.0], [-LN2, 50.0], [LN15, 50.0], [-LN2, 50.0]], requires_grad=True)
    old = torch.tensor([[0.0, -60.0], [0.0, -60.0], [0.0, -60.0], [0.0, -60.0]])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.tensor([[1, 0], [1, 0], [1, 0], [1, 0]])
    return logp, old, adv, mask


def test_policy_loss_clip_cases_by_hand():
    logp, old, adv, mask = _four_cases()
    loss, m = policy_loss(logp, old, None, adv, mask, clip_ratio=0.2, kl_coef=0.0)
    # ratio 1.5, A=+1: max(-1.5, -1.2) = -1.2 (clipped; no gradient)
    # ratio 0.5, A=+1: max(-0.5, -0.8) = -0.5 (unclipped)
    # ratio 1.5, A=-1: max( 1.5,  1.2) =  1.5 (unclipped)
    # ratio 0.5, A=-1: max( 0.5,  0.8) =  0.8 (clipped; no gradient)
    # token mean over 4 tokens: (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.15
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert m["losses/pg_loss"] == pytest.approx(0.15, abs=1e-6)
    assert m["losses/clipfrac"] == pytest.approx(0.5)
    assert m["losses/ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5) / 4)
    # approx_kl (k3 vs old): ratio 1.5 -> 0.5 - ln 1.5 = 0.094535; ratio 0.5 -> -0.5 + ln 2 = 0.193147
    assert m["losses/approx_kl"] == pytest.approx((2 * 0.0945349 + 2 * 0.1931472) / 4, abs=1e-6)
    assert m["losses/tokens"] == 4.0
    loss.backward()
    # d/dlogp of -A * ratio / 4 = -A * ratio / 4 where unclipped, 0 where clipped, 0 where masked.
    expected = torch.tensor([[0.0, 0.0], [-0.5 / 4, 0.0], [1.5 / 4, 0.0], [0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_policy_loss_k3_kl_by_hand():
    logp = torch.tensor([[0.0, 0.0, 9.0]], requires_grad=True)
    old = torch.zeros(1, 3)  # ratio 1: the surrogate is -A = -0.0 here
    ref = torch.tensor([[LN2, -LN2, -99.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = policy_loss(logp, old, ref, torch.tensor([0.0]), mask, clip_ratio=0.2, kl_coef=0.1)
    # d = ln 2: 2 - ln 2 - 1 = 0.306853; d = -ln 2: 0.5 + ln 2 - 1 = 0.193147; mean = 0.25 exactly
    assert m["losses/kl_ref"] == pytest.approx(0.25, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * 0.25, abs=1e-7)
    loss.backward()
    # d/dlogp of exp(ref - logp) - (ref - logp) - 1 is 1 - exp(ref - logp): 1 - 2 = -1 and 1 - 0.5 = 0.5;
    # times kl_coef 0.1 and / 2 tokens.
    assert torch.allclose(logp.grad, torch.tensor([[-0.05, 0.025, 0.0]]), atol=1e-6)


def test_policy_loss_kl_off_when_coef_zero():
    logp, old, adv, mask = _four_cases()
    ref = torch.full_like(old, LN2)
    loss, m = policy_loss(logp, old, ref, adv, mask, clip_ratio=0.2, kl_coef=0.0)
    assert loss.item() == pytest.approx(0.15, abs=1e-6)  # KL reported but not added
    assert m["losses/kl_ref"] > 0


def test_policy_loss_token_mean_across_micro_batches():
    # Two sequences of different lengths: 3 and 1 sampled tokens. The mini-batch token mean weights
    # all 4 tokens equally; micro-batches of one sequence each, normalised by the mini-batch total,
    # must add up to it, in value and in gradient.
    torch.manual_seed(0)
    logp = torch.randn(2, 3)
    old = logp + 0.1 * torch.randn(2, 3)
    ref = logp + 0.1 * torch.randn(2, 3)
    adv = torch.tensor([0.7, -1.3])
    mask = torch.tensor([[1, 1, 1], [0, 1, 0]])

    full_lp = logp.clone().requires_grad_(True)
    full, full_m = policy_loss(full_lp, old, ref, adv, mask, 0.2, 0.05)
    full.backward()

    micro_lp = logp.clone().requires_grad_(True)
    total = 0.0
    summed = {}
    for i in range(2):
        part, part_m = policy_loss(
            micro_lp[i : i + 1],
            old[i : i + 1],
            ref[i : i + 1],
            adv[i : i + 1],
            mask[i : i + 1],
            0.2,
            0.05,
            num_tokens=4,
        )
        part.backward()
        total += part.item()
        for k, v in part_m.items():
            summed[k] = summed.get(k, 0.0) + v
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(micro_lp.grad, full_lp.grad, atol=1e-6)
    for k in ("losses/pg_loss", "losses/kl_ref", "losses/approx_kl", "losses/clipfrac", "losses/tokens"):
        assert summed[k] == pytest.approx(full_m[k], abs=1e-6), k

    # The naive alternative (each micro-batch divided by its own count, then averaged) differs here,
    # which is why the normaliser exists.
    naive = 0.0
    for i in range(2):
        part, _ = policy_loss(
            logp[i : i + 1], old[i : i + 1], ref[i : i + 1], adv[i : i + 1], mask[i : i + 1], 0.2, 0.05
        )
        naive += part.item() / 2
    assert abs(naive - full.item()) > 1e-3


def test_policy_loss_empty_mask_is_finite():
    logp = torch.full((1, 3), float("-inf"), requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([1.0]), torch.zeros(1, 3), 0.2, 0.1)
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in m.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_policy_loss_checks_shapes():
    logp, old, adv, mask = _four_cases()
    with pytest.raises(AssertionError, match="advantages"):
        policy_loss(logp, old, None, adv[:2], mask, 0.2, 0.0)
    with pytest.raises(AssertionError, match="ref_logprobs"):
        policy_loss(logp, old, None, adv, mask, 0.2, 0.01)


def test_ema_rho_takes_the_diagnosers_profile_with_absent_labels():
    from seal_mini.core.diagnose import failure_profile

    profile = failure_profile([["pass", "state_mismatch"], ["pass", "pass"]], [0.0, 1.0])
    assert profile["spurious_tool_call"]["success_rate"] is None  # absent labels carry no success rate
    rho, _ = ema_rho(None, profile, DiagnosisConfig())
    assert rho["spurious_tool_call"] == DEFAULT_RHO["spurious_tool_call"]
    # state_mismatch: 1 of 4 turns, success 0, count 1 -> target 1.0 * (1 + 0.25 * 1 * 1/32)
    assert rho["state_mismatch"] == pytest.approx(0.75 * 1.0 + 0.25 * (1 + 0.25 / 32))


# --- the other advantage estimators (train.adv_estimator) -----------------------------------------


def test_dr_grpo_advantages_by_hand():
    # r - mean, no std: [1, 0, 0, 0] has mean 0.25 -> 0.75, -0.25 x3; [1, 1, 0, 0] mean 0.5 -> +-0.5.
    adv, m = group_advantages([1, 0, 0, 0, 1, 1, 0, 0], 4, estimator="dr_grpo")
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5], abs=1e-7)
    assert m["adv/abs_mean"] == pytest.approx((0.75 + 3 * 0.25 + 4 * 0.5) / 8)
    # Rewards [0.5, 1, 0]: mean 0.5 -> 0, 0.5, -0.5 (GRPO divides these by std 0.5: 0, 1, -1).
    adv, _ = group_advantages([0.5, 1.0, 0.0], 3, eps=0.0, estimator="dr_grpo")
    assert adv.tolist() == pytest.approx([0.0, 0.5, -0.5], abs=1e-7)
    adv, _ = group_advantages([0.5, 1.0, 0.0], 3, eps=0.0, estimator="grpo")
    assert adv.tolist() == pytest.approx([0.0, 1.0, -1.0], abs=1e-6)


def test_rloo_advantages_by_hand():
    # Leave-one-out: r_j - mean of the other G-1. [1, 0, 0, 0]: 1 - 0/3 = 1; 0 - 1/3 = -1/3 (x3).
    # [1, 1, 0, 0]: 1 - (1 + 0 + 0)/3 = 2/3; 0 - (1 + 1 + 0)/3 = -2/3.
    adv, _ = group_advantages([1, 0, 0, 0, 1, 1, 0, 0], 4, estimator="rloo")
    expected = [1.0, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # [0.5, 1, 0]: 0.5 - (1 + 0)/2 = 0; 1 - (0.5 + 0)/2 = 0.75; 0 - (0.5 + 1)/2 = -0.75.
    adv, _ = group_advantages([0.5, 1.0, 0.0], 3, estimator="rloo")
    assert adv.tolist() == pytest.approx([0.0, 0.75, -0.75], abs=1e-7)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_every_estimator_gives_flat_groups_exactly_zero_and_keeps_weight_signs(estimator):
    adv, m = group_advantages([1, 1, 0, 0, 0.3, 0.3, 1, 0], 2, estimator=estimator)
    assert adv[:6].tolist() == [0.0] * 6 and m["adv/flat_group_frac"] == 3 / 4
    assert float(adv[6]) > 0 > float(adv[7])
    # the diagnostic weight multiplies afterwards and never flips a sign
    weighted = weighted_advantages(adv, torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 0.5]))
    assert float(weighted[6]) == pytest.approx(2 * float(adv[6])) and float(weighted[7]) < 0


def test_unknown_estimator_is_refused_and_the_config_offers_what_the_registry_declares():
    with pytest.raises(AssertionError, match="unknown estimator 'ppo'"):
        group_advantages([1, 0], 2, estimator="ppo")
    # one declaration per choice (seal_mini/estimators.py): the config accepts exactly those names
    for key, table in (("adv_estimator", ADVANTAGE_ESTIMATORS), ("loss_agg", LOSS_AGGREGATIONS)):
        for name in table:
            load_config(overrides=[f"train.{key}={name}"])
        with pytest.raises(ConfigError, match=f"train.{key}: must be .* not 'ppo'"):
            load_config(overrides=[f"train.{key}=ppo"])


# --- loss aggregation (train.loss_agg) ------------------------------------------------------------


def _two_sequences():
    """Sequence 0: 3 sampled tokens, A = +1; sequence 1: 1 sampled token, A = -2; ratio 1 everywhere, so
    each token's surrogate is -A: -1 on sequence 0's tokens, +2 on sequence 1's."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [0.0, -1.5, 0.0, 0.0]], requires_grad=True)
    old = logp.detach().clone()
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0]])
    return logp, old, torch.tensor([1.0, -2.0]), mask


@pytest.mark.parametrize(
    "loss_agg, norm, value, grad_0, grad_1",
    [
        # (-1 * 3 + 2 * 1) / 4 tokens = -0.25; d/dlogp = -A / 4: -0.25 and +0.5
        ("token_mean", 1.0, -0.25, -1 / 4, 2 / 4),
        # ((-3) / 3 + 2 / 1) / 2 sequences = 0.5; d/dlogp = -A / (2 * n_i): -1/6 and +1
        ("seq_mean_token_mean", 1.0, 0.5, -1 / 6, 1.0),
        # ((-3) + 2) / 2 sequences = -0.5; d/dlogp = -A / 2: -0.5 and +1
        ("seq_mean_token_sum", 1.0, -0.5, -1 / 2, 1.0),
        # the same with every token sum divided by the constant 4: -0.125; -1/8 and +1/4
        ("seq_mean_token_sum", 4.0, -0.125, -1 / 8, 1 / 4),
    ],
)
def test_loss_aggregations_by_hand(loss_agg, norm, value, grad_0, grad_1):
    logp, old, adv, mask = _two_sequences()
    divisors = loss_divisors(mask, loss_agg, n_tokens=4, n_sequences=2, token_sum_norm=norm)
    loss, m = policy_loss(logp, old, None, adv, mask, 0.2, 0.0, num_tokens=4, divisors=divisors)
    assert loss.item() == pytest.approx(value, abs=1e-7)
    assert m["losses/pg_loss"] == pytest.approx(value, abs=1e-7)
    assert m["losses/ratio_mean"] == 1.0 and m["losses/tokens"] == 4.0  # diagnostics: token means
    loss.backward()
    expected = torch.tensor([[grad_0, grad_0, grad_0, 0.0], [0.0, grad_1, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_token_mean_divisors_are_the_default():
    logp, old, adv, mask = _two_sequences()
    plain, _ = policy_loss(logp, old, None, adv, mask, 0.2, 0.0, num_tokens=4)
    divided, _ = policy_loss(logp, old, None, adv, mask, 0.2, 0.0, 4, loss_divisors(mask, "token_mean", 4, 2))
    assert plain.item() == divided.item() == pytest.approx(-0.25)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_every_aggregation_is_exact_under_gradient_accumulation(loss_agg):
    # Three sequences of 3, 1 and 2 sampled tokens, one micro-batch each, divided by the mini-batch's
    # counts (6 tokens, 3 sequences): the parts add up to the whole, in value, gradient and metrics.
    torch.manual_seed(0)
    logp = torch.randn(3, 4)
    old = logp + 0.1 * torch.randn(3, 4)
    ref = logp + 0.1 * torch.randn(3, 4)
    adv = torch.tensor([0.7, -1.3, 0.4])
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0], [0, 1, 0, 1]])

    full_lp = logp.clone().requires_grad_(True)
    full, full_m = policy_loss(full_lp, old, ref, adv, mask, 0.2, 0.05, 6, loss_divisors(mask, loss_agg, 6, 3, 5.0))
    full.backward()
    micro_lp = logp.clone().requires_grad_(True)
    total, summed = 0.0, {}
    for i in range(3):
        rows = slice(i, i + 1)
        divisors = loss_divisors(mask[rows], loss_agg, 6, 3, 5.0)
        part, part_m = policy_loss(micro_lp[rows], old[rows], ref[rows], adv[rows], mask[rows], 0.2, 0.05, 6, divisors)
        part.backward()
        total += part.item()
        for k, v in part_m.items():
            summed[k] = summed.get(k, 0.0) + v
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(micro_lp.grad, full_lp.grad, atol=1e-6)
    for k, v in full_m.items():
        assert summed[k] == pytest.approx(v, abs=1e-6), k


def test_loss_divisors_refuse_unknown_names():
    with pytest.raises(AssertionError, match="unknown loss_agg 'sum'"):
        loss_divisors(torch.ones(1, 2), "sum", 2, 1)


# --- clamps (as verl's) ---------------------------------------------------------------------------


def test_log_ratio_is_clamped_before_exp():
    # log pi - log pi_old = 30 is clamped to 20: ratio e^20 = 485165195.41 instead of e^30 = 1.07e13.
    # A = -1: max(-A * e^20, -A * 1.2) = e^20 over 1 token; beyond the clamp there is no gradient.
    assert LOG_RATIO_CLAMP == 20.0
    logp = torch.tensor([[30.0]], requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.0)
    assert loss.item() == pytest.approx(485165195.41, rel=1e-6)
    assert m["losses/ratio_mean"] == pytest.approx(485165195.41, rel=1e-6)
    assert m["losses/approx_kl"] == pytest.approx(485165195.41 - 1 - 20, rel=1e-6)  # (ratio - 1) - log ratio
    loss.backward()
    assert logp.grad.item() == 0.0
    # inside the clamp nothing changes: log ratio 2, A = -1 -> e^2 = 7.389056, gradient e^2
    logp = torch.tensor([[2.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.0)
    loss.backward()
    assert loss.item() == pytest.approx(7.389056, abs=1e-5) and logp.grad.item() == pytest.approx(7.389056, abs=1e-5)


def test_k3_kl_is_clamped():
    # d = log pi_ref - log pi per token: 3 -> e^3 - 3 - 1 = 16.0855 -> 10; 2 -> e^2 - 2 - 1 = 4.389056 (kept);
    # 30 -> clamped to 20 before exp, then 10. Mean over 3 tokens: (10 + 4.389056 + 10) / 3 = 8.129685.
    assert KL_CLAMP == 10.0
    logp = torch.zeros(1, 3, requires_grad=True)
    ref = torch.tensor([[3.0, 2.0, 30.0]])
    loss, m = policy_loss(logp, torch.zeros(1, 3), ref, torch.tensor([0.0]), torch.ones(1, 3), 0.2, 0.1)
    assert m["losses/kl_ref"] == pytest.approx(8.129685, abs=1e-5)
    assert loss.item() == pytest.approx(0.1 * 8.129685, abs=1e-6)
    loss.backward()
    # only the unclamped token has a gradient: d/dlogp (e^d - d - 1) = 1 - e^d = -6.389056, x 0.1 / 3 tokens
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.2129685, 0.0]]), atol=1e-6)


# --- the turn-level variant and the shuffled control (diagnosis.weight_level, diagnosis.shuffle_weights) ---


def test_turn_level_weights_by_hand():
    # three task turns, the second failed (missing_tool_call, rho 1.5), the others passed (rho 1.0)
    labels = ["pass", "missing_tool_call", "pass"]
    starts = [2, 5, 8]  # turn 0's tokens from 2, turn 1's from 5, turn 2's from 8
    mask = [0, 0, 1, 1, 0, 1, 1, 0, 1, 0]  # sampled: 2, 3 (turn 0), 5, 6 (turn 1), 8 (turn 2)
    rho = dict(DEFAULT_RHO)
    scale = turn_scales("turn", labels, starts, mask, rho, 0.5, 2.0)
    # per sampled token rho 1, 1, 1.5, 1.5, 1: mean 6 / 5 = 1.2, so scales 1 / 1.2 and 1.5 / 1.2
    expected = [1 / 1.2] * 5 + [1.5 / 1.2] * 3 + [1 / 1.2] * 2
    assert scale.tolist() == pytest.approx(expected)
    w = diagnostic_weights([{"pass": 2 / 3, "missing_tool_call": 1 / 3}], rho, 0.5, 2.0)[0]  # 7/6, the paper's
    token_weights = w * scale
    sampled = torch.tensor(mask, dtype=torch.bool)
    assert float(token_weights[sampled].mean()) == pytest.approx(7 / 6)  # the trajectory's mean is still w_j
    assert turn_scales("trajectory", labels, starts, mask, rho, 0.5, 2.0).tolist() == [1.0] * 10
    # rho is clipped to [w_min, w_max] per turn before the spread: spurious_tool_call's 2.0 counts as 1.6
    clipped = turn_scales("turn", ["spurious_tool_call", "pass", "pass"], starts, mask, rho, 0.5, 1.6)
    assert clipped[2].item() == pytest.approx(1.6 / (2 * 1.6 + 3 * 1.0) * 5)
    # a turn never played (not_reached, no start) and a trajectory without sampled tokens
    assert turn_scales("turn", [*labels, "not_reached"], starts, mask, rho, 0.5, 2.0).tolist() == pytest.approx(
        expected
    )
    assert turn_scales("turn", labels, [], [0] * 4, rho, 0.5, 2.0).tolist() == [1.0] * 4


def test_per_token_advantages_give_the_hand_gradient():
    logp = torch.zeros(1, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([[-0.5, -1.0, -2.0, 7.0]])  # the last token is not sampled: its value never counts
    loss, _ = policy_loss(logp, torch.zeros(1, 4), None, adv, mask, clip_ratio=0.2, kl_coef=0.0)
    loss.backward()
    # ratio 1 everywhere: d/dlogp of -A_t * ratio / 3 is -A_t / 3 on sampled tokens
    assert logp.grad[0].tolist() == pytest.approx([0.5 / 3, 1.0 / 3, 2.0 / 3, 0.0])
    same = torch.zeros(1, 4, requires_grad=True)
    flat, _ = policy_loss(same, torch.zeros(1, 4), None, torch.tensor([-1.0]), mask, 0.2, 0.0)
    broadcast, _ = policy_loss(same, torch.zeros(1, 4), None, torch.full((1, 4), -1.0), mask, 0.2, 0.0)
    assert flat.item() == broadcast.item()  # one advantage per sequence is one per token, all equal


def test_shuffled_weights_trade_labels_among_a_groups_failures_only():
    a, b, c, ok = ["missing_tool_call"], ["state_mismatch"], ["spurious_tool_call"], ["pass"]
    labels = [ok, a, b, c, a, b, ok, ok]  # group 0: one success, three different failures; group 1: one failure
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    seen = set()
    for seed in range(20):
        out = shuffled_among_failures(labels, rewards, 4, torch.Generator().manual_seed(seed))
        assert out[0] == ok and out[4:] == labels[4:]  # a success, and a group's only failure, keep theirs
        assert sorted(map(tuple, out[1:4])) == sorted(map(tuple, labels[1:4]))  # the same labels, traded
        seen.add(tuple(map(tuple, out[1:4])))
    assert len(seen) == 6  # every order of the three failures occurs: the information is gone
    flat = [b, a, b, a]  # a group whose rewards are all equal has no failure to trade (its advantages are 0)
    assert shuffled_among_failures(flat, [0.0] * 4, 4, torch.Generator().manual_seed(0)) == flat
