"""`python -m seal_mini probe RECIPE [key=value ...]`: what RL will start from, measured on the recipe's warm start.

Before a run (or a sweep) is worth its minutes, its starting point must give SEAL something to work with:
groups with mixed rewards (else every advantage is 0), failures the diagnoser names in several labels with
different rho (else the weights only rescale each group), successes without failure labels (else a weight
above 1 reinforces what a label names), and cues that change what the backbone does (else the interface
cannot act). The probe plays the first training step's sampling on the first `--tasks` training tasks of
epoch 0 (same streams as step 0 of a run of that seed, the bare environment a closed loop starts with),
one greedy episode per task, and then the same sampled episodes with each cue forced on alone. It prints
the figures beside the targets a practice recipe is calibrated to, with 95% bootstrap intervals over the
tasks (at 64 tasks the share of mixed groups is known to about +-11 points; --tasks 256 halves that), and writes
<run_dir>/probe.json. --skip K plays epoch 0's tasks from the K-th on. Two builds of one world differ as much as
two worlds do, so --select N is the calibration after the build: it builds with sft.seed, sft.seed + 1, ... and
keeps the first warm start whose four figures lie inside the targets (N builds at most).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time

import torch

from seal_mini.config import Config, load_config
from seal_mini.core.diagnose import diagnose, failure_profile, trajectory_profile
from seal_mini.core.grpo import diagnostic_weights, group_advantages, turn_scales
from seal_mini.core.interface import ERROR_TRIGGERS, GUIDELINES, SCHEMA_TRIGGERS, InterfaceState
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import run_rollouts
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.verifier import check_episode
from seal_mini.estimators import WEIGHT_LEVELS
from seal_mini.labels import FAILURE_LABELS
from seal_mini.runio import run_lock, write_json
from seal_mini.training.sft import ensure_warm_start, warm_start_config
from seal_mini.training.train import make_env, tasks_for_step

TARGETS = {
    "sampled_success": (0.10, 0.25),
    "greedy_success": (0.0, 0.10),
    "mixed_groups": (0.60, 1.0),
    "successes_with_a_failure_label": (0.0, 0.02),
}
"""What a practice recipe's warm start is calibrated to (closed intervals): sampled success leaves room to
learn and gives signal, greedy (what held-in evaluation sees) starts low, most groups carry a gradient, and a
success rarely carries a failure label."""


def cue_states() -> dict[str, InterfaceState]:
    """Each cue alone: the schema cues, error feedback (with its retry), each guideline."""
    states = {
        "schema_cues": InterfaceState(schema_cues=True),
        "error_feedback": InterfaceState(error_feedback=True, parse_retry=True),
    }
    return states | {f"guidelines:{g}": InterfaceState(guidelines=[g]) for g in GUIDELINES}


def cue_targets(name: str) -> tuple[str, ...]:
    """The labels a cue is meant to lower (the ones whose failures switch it on)."""
    if name == "schema_cues":
        return SCHEMA_TRIGGERS
    if name == "error_feedback":
        return ERROR_TRIGGERS
    return (GUIDELINES[name.split(":", 1)[1]][0],)


def play(policy, cfg: Config, tasks: list, temperature: float, group: int, state: InterfaceState | None) -> dict:
    """`group` episodes per task (seeded as step 0 of the run), scored and diagnosed: rewards and labels."""
    envs = [make_env(task, cfg, state) for task in tasks for _ in range(group)]
    trajs = run_rollouts(policy, envs, cfg.rollout, temperature, (cfg.seed, 0))
    verdicts = [check_episode(env) for env in envs]
    return {
        "rewards": [v.reward for v in verdicts],
        "labels": [diagnose(env, v) for env, v in zip(envs, verdicts, strict=True)],
        "turn_starts": [t.turn_starts for t in trajs],  # where the update puts a turn-level weight
        "loss_masks": [t.loss_mask for t in trajs],
    }


def label_rates(labels: list[list[str]]) -> dict[str, float]:
    """Share of all turns per label."""
    profile = failure_profile(labels, [0.0] * len(labels))
    return {z: round(p["prevalence"], 4) for z, p in profile.items() if p["count"]}


def target_figures(sampled: dict, greedy: dict, G: int) -> dict:
    """The four calibrated figures from (rewards, labels) of G sampled and 1 greedy episode per task, in
    task order. None where there is no success to look at."""
    rewards, labels = sampled["rewards"], sampled["labels"]
    groups = [rewards[k : k + G] for k in range(0, len(rewards), G)]
    successes = [z for r, z in zip(rewards, labels, strict=True) if r > 0]
    return {
        "sampled_success": sum(rewards) / len(rewards),
        "greedy_success": sum(greedy["rewards"]) / len(greedy["rewards"]),
        "mixed_groups": sum(len(set(g)) > 1 for g in groups) / len(groups),
        "successes_with_a_failure_label": sum(any(z in FAILURE_LABELS for z in s) for s in successes) / len(successes)
        if successes
        else None,
    }


def task_intervals(sampled: dict, greedy: dict, G: int, draws: int = 1000, seed: int = 0) -> dict:
    """95% bootstrap intervals of target_figures over tasks (tasks drawn with replacement, a task's episodes
    kept together, since episodes of one task are alike): how far the figures of --tasks tasks can be from
    those of all training tasks."""
    n = len(greedy["rewards"])
    rng = random.Random(seed)
    values: dict[str, list[float]] = {name: [] for name in TARGETS}
    for _ in range(draws):
        picked = [rng.randrange(n) for _ in range(n)]
        resampled = {
            "rewards": [r for t in picked for r in sampled["rewards"][t * G : (t + 1) * G]],
            "labels": [z for t in picked for z in sampled["labels"][t * G : (t + 1) * G]],
        }
        figures = target_figures(resampled, {"rewards": [greedy["rewards"][t] for t in picked]}, G)
        for name, value in figures.items():
            if value is not None:
                values[name].append(value)
    out = {}
    for name, xs in values.items():
        xs.sort()
        out[name] = [round(xs[int(0.025 * len(xs))], 4), round(xs[int(0.975 * len(xs)) - 1], 4)] if xs else None
    return out


def start_figures(sampled: dict, greedy: dict, cfg: Config) -> dict:
    """Sampled and greedy success, mixed groups, the label mix, and what the diagnostic weights do."""
    G, rewards, labels = cfg.rollout.group_size, sampled["rewards"], sampled["labels"]
    groups = [rewards[k : k + G] for k in range(0, len(rewards), G)]
    targets = target_figures(sampled, greedy, G)
    p = targets["sampled_success"]
    adv, _ = group_advantages(rewards, G, cfg.train.adv_eps, cfg.train.adv_estimator)
    weights, _ = diagnostic_weights(
        [trajectory_profile(z) for z in labels], cfg.diagnosis.rho, cfg.diagnosis.w_min, cfg.diagnosis.w_max
    )
    weighted = adv * weights
    cosine = float(torch.nn.functional.cosine_similarity(weighted, adv, dim=0)) if adv.abs().sum() > 0 else None
    # the spread of the failed episodes' weights inside each group (what reweighting changes within a group)
    spreads = []
    for k in range(0, len(rewards), G):
        failed = [float(weights[j]) for j in range(k, k + G) if rewards[j] == 0]
        if len(failed) >= 2:
            spreads.append(statistics.pstdev(failed))
    token_level = token_figures(sampled, cfg, adv, weights) if "loss_masks" in sampled else {}
    return {
        "episodes": len(rewards),
        **{name: None if value is None else round(value, 4) for name, value in targets.items()},
        "intervals": task_intervals(sampled, greedy, G),
        # why groups are not mixed: all failed or all solved, against the share that would mix if the same
        # success rate were spread evenly over the tasks (1 - (1 - p)^G - p^G)
        "groups_all_failed": round(sum(max(g) == 0 for g in groups) / len(groups), 4),
        "groups_all_solved": round(sum(min(g) > 0 for g in groups) / len(groups), 4),
        "mixed_if_success_were_even": round(1 - (1 - p) ** G - p**G, 4),
        "labels": label_rates(labels),
        "greedy_labels": label_rates(greedy["labels"]),
        "failed_weight_sd_within_group": round(statistics.fmean(spreads), 4) if spreads else None,
        "weights_mean": round(float(weights.mean()), 4),
        "weighted_vs_plain_advantage_cosine": round(cosine, 4) if cosine is not None else None,
        "token_level": token_level,
    }


def token_figures(sampled: dict, cfg: Config, adv: torch.Tensor, weights: torch.Tensor) -> dict:
    """What the weights do at the tokens the update scales, per diagnosis.weight_level: the cosine of the
    weighted and the plain per-token advantages over every sampled token, and the spread (sd) of a group's
    failed episodes' token weights (mean over groups with two failures or more)."""
    G, d, rewards = cfg.rollout.group_size, cfg.diagnosis, sampled["rewards"]
    out = {}
    for level in WEIGHT_LEVELS:
        plain, weighted, spreads = [], [], []
        for k in range(0, len(rewards), G):
            failed = []
            for j in range(k, k + G):
                mask, starts, labels = sampled["loss_masks"][j], sampled["turn_starts"][j], sampled["labels"][j]
                scale = turn_scales(level, labels, starts, mask, d.rho, d.w_min, d.w_max)
                w = weights[j] * scale[torch.tensor(mask, dtype=torch.bool)]  # (sampled tokens,)
                plain.append(adv[j].expand(len(w)))
                weighted.append(adv[j] * w)
                if rewards[j] == 0 and len(w):
                    failed.append(w)
            if len(failed) >= 2:
                spreads.append(float(torch.cat(failed).std(correction=0)))
        a, b = torch.cat(plain), torch.cat(weighted)
        out[level] = {
            "token_cosine": round(float(torch.nn.functional.cosine_similarity(b, a, dim=0)), 4)
            if a.abs().sum() > 0
            else None,
            "failed_token_weight_sd_within_group": round(statistics.fmean(spreads), 4) if spreads else None,
        }
    return out


def cue_figures(policy, cfg: Config, tasks: list, bare: dict) -> dict:
    """Per cue, forced on alone on the same streams as the bare episodes: success and its targeted labels."""
    out = {}
    for name, state in cue_states().items():
        on = play(policy, cfg, tasks, cfg.rollout.temperature, cfg.rollout.group_size, state)
        targets = cue_targets(name)
        diffs = [a - b for a, b in zip(on["rewards"], bare["rewards"], strict=True)]
        out[name] = {
            "success_off": round(statistics.fmean(bare["rewards"]), 4),
            "success_on": round(statistics.fmean(on["rewards"]), 4),
            "success_change_ci95": _mean_ci(diffs),
            "targets": list(targets),
            "target_rate_off": round(_share(bare["labels"], targets), 4),
            "target_rate_on": round(_share(on["labels"], targets), 4),
            "labels_on": label_rates(on["labels"]),
        }
        print(
            f"[probe] {name:<40} success {out[name]['success_off']:.3f} -> {out[name]['success_on']:.3f}; "
            f"{'/'.join(targets)} {out[name]['target_rate_off']:.3f} -> {out[name]['target_rate_on']:.3f} of turns",
            flush=True,
        )
    return out


def _share(labels: list[list[str]], targets: tuple[str, ...]) -> float:
    """Share of all turns whose label is one of `targets`."""
    return sum(z in targets for zs in labels for z in zs) / sum(len(zs) for zs in labels)


def _mean_ci(diffs: list[float]) -> list[float]:
    """Mean and a normal 95% interval of paired differences (one per episode; many episodes)."""
    m = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return [round(m, 4), round(m - half, 4), round(m + half, 4)]


def _verdict(name: str, interval) -> str:
    """Whether the figure's 95% interval lies inside the target, outside it, or across its edge."""
    low, high = TARGETS[name]
    if interval is None:
        return "-"
    if low <= interval[0] and interval[1] <= high:
        return "ok"
    if interval[1] < low or interval[0] > high:
        return f"outside [{low}, {high}]"
    return f"undecided: the interval crosses [{low}, {high}] (more --tasks narrow it)"


def probe(cfg: Config, n_tasks: int, cues: bool, skip: int = 0) -> dict:
    """The figures of the recipe's warm start (built first if it is not there)."""
    if cfg.sft.enabled:
        ensure_warm_start(cfg)
    started = time.perf_counter()
    train_tasks = pick(load_split(cfg)["train"], cfg.data.max_train_tasks)
    tasks = tasks_for_step(train_tasks, 0, len(train_tasks), cfg.seed)[skip : skip + n_tasks]  # epoch 0's order
    if not tasks:
        raise SystemExit(f"probe: --skip {skip} leaves none of the {len(train_tasks)} training tasks to play")
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg)
    sampled = play(policy, cfg, tasks, cfg.rollout.temperature, cfg.rollout.group_size, None)
    greedy = play(policy, cfg, tasks, 0.0, 1, None)
    result = {"tasks": len(tasks), "skip": skip} | {k: getattr(cfg.rollout, k) for k in ("group_size", "temperature")}
    result |= start_figures(sampled, greedy, cfg)
    for name in TARGETS:
        interval = result["intervals"][name]
        print(f"[probe] {name:<32} {result[name]} {interval}  ({_verdict(name, interval)})")
    print(
        f"[probe] groups all failed {result['groups_all_failed']}, all solved {result['groups_all_solved']}; "
        f"mixed if the same success were spread evenly over the tasks {result['mixed_if_success_were_even']}"
    )
    print(f"[probe] labels (share of turns): {result['labels']}")
    print(
        f"[probe] failed episodes' weight sd within a group {result['failed_weight_sd_within_group']}; "
        f"cosine(weighted, plain advantages) {result['weighted_vs_plain_advantage_cosine']}"
    )
    for level, figures in result["token_level"].items():
        print(
            f"[probe] per token, {level}-level weights: failed tokens' weight sd within a group "
            f"{figures['failed_token_weight_sd_within_group']}; cosine(weighted, plain) {figures['token_cosine']}"
        )
    if cues:
        result["cues"] = cue_figures(policy, cfg, tasks, sampled)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def select(cfg: Config, n_tasks: int, skip: int, tries: int) -> dict:
    """Build with sft.seed, sft.seed + 1, ... (at most `tries`) until the four figures lie inside TARGETS: the
    figures of the first build inside them (else of the last), each try's under "select"."""
    first, tried = warm_start_config(cfg).seed, []  # sft.seed, or the run's seed where it is -1
    for seed in range(first, first + tries):
        result = probe(dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, seed=seed)), n_tasks, False, skip)
        tried.append({"sft.seed": seed} | {name: result[name] for name in TARGETS})
        if all(result[n] is not None and low <= result[n] <= high for n, (low, high) in TARGETS.items()):
            print(f"[probe] the build of sft.seed={seed} lies inside the targets: set it in the recipe", flush=True)
            return result | {"select": tried, "selected": seed}
    print(f"[probe] none of the {tries} builds lies inside the targets (the last is kept)", flush=True)
    return result | {"select": tried, "selected": None}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini probe", description=__doc__.split("\n")[0])
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument("--tasks", type=int, default=64, help="training tasks to play (epoch 0's first N)")
    parser.add_argument("--skip", type=int, default=0, help="play epoch 0's tasks from the K-th on (default 0)")
    parser.add_argument("--no-cues", action="store_true", help="skip forcing each cue on (the slow part)")
    parser.add_argument("--select", type=int, default=0, help="keep the first of N builds inside the targets")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.tasks < 1 or args.skip < 0 or args.select < 0:
        parser.error("--tasks must be >= 1, --skip and --select >= 0")
    cfg = load_config(args.recipe, args.overrides)
    if args.select and not cfg.sft.enabled:
        parser.error("--select chooses among warm-start builds; this recipe has sft.enabled: false")
    with run_lock(cfg.run_dir, " ".join([parser.prog, *argv])):  # it may build the warm start there
        if args.select:  # cues are not forced on while builds are chosen
            result = select(cfg, args.tasks, args.skip, args.select)
        else:
            result = probe(cfg, args.tasks, not args.no_cues, args.skip)
        write_json(cfg.run_dir / "probe.json", result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
