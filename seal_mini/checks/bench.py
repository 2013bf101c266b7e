"""Benchmarks that print numbers: `python -m seal_mini bench {rollout,ranks} [options] [key.sub=value ...]`.

ranks: the same training steps (RANKS_WORKLOAD) run by `python -m seal_mini train` in one process and
under torchrun on --ranks processes (gloo on the CPU), alternating, --repeats times each. The time per
step is metrics.jsonl's time/step_s (rank 0's wall time from the rollouts to the update's end), first step
left out. One process runs twice, on every CPU core and on one rank's share of them (threads fight over
cores when the machine is busy, which can slow a multi-threaded process far more than the split gains);
each rank gets its share. The load average is printed next to every run: other work takes cores from all.

rollout: the batched engine against one episode at a time, on the same tiny random model and the same
BFCL tasks (the first episodes/4 of each category, one episode each), greedy, in one process. Both
runs are the same `run_rollouts` call; the only difference is rollout.max_concurrent (16 vs 1), so the
ratio is what batching buys. More episodes than slots, as in a training round: a slot freed by a
finished episode goes to the next one. Greedy decoding makes both runs produce the same tokens (the
script reports how many sequences agree exactly), so both rates count the same work.

Printed per run: sampled tokens per second, where the time went, and "model tokens / sequence tokens":
tokens fed through the model (prefill and decode) per token of the final sequences. 1.0 means every
token was computed exactly once; below 1, prompt prefixes were shared; re-prefilling each model call
from scratch would put it well above 1. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from seal_mini.config import CATEGORIES, ConfigError, load_config
from seal_mini.programs.placement import launch_command
from seal_mini.runio import read_metrics


def bench_rollout(episodes: int, concurrent: int, max_new_tokens: int, overrides: list[str]) -> dict:
    """Time the same greedy rollouts batched (`concurrent` at once) and one at a time."""
    import torch

    if episodes < 1 or concurrent < 1:
        raise ConfigError("bench rollout: --episodes and --concurrent must be at least 1")

    from seal_mini.engine.device import peak_memory
    from seal_mini.engine.policy import load_policy
    from seal_mini.engine.rollout import RolloutStats, run_rollouts
    from seal_mini.envs.bfcl import load_tasks
    from seal_mini.envs.episode import Episode

    cfg = load_config(
        None, ["model.name=tiny-random", "device=cpu", f"rollout.max_new_tokens={max_new_tokens}", *overrides]
    )
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg)
    per_category = -(-episodes // len(CATEGORIES))
    tasks = [t for t in load_tasks() if t.index < per_category][:episodes]
    if len(tasks) < episodes:
        raise ConfigError(f"--episodes {episodes}: only {len(tasks)} tasks available")

    def envs():
        return [Episode(t, cfg.env.max_calls_per_turn, cfg.env.max_calls_per_episode) for t in tasks]

    run_rollouts(policy, envs()[:1], cfg.rollout, 0.0)  # warm-up: first-call costs stay out of both timings
    results = {}
    for name, slots in (("one_at_a_time", 1), ("batched", concurrent)):
        cfg.rollout.max_concurrent = slots
        stats = RolloutStats()
        trajectories = run_rollouts(policy, envs(), cfg.rollout, 0.0, stats=stats)
        results[name] = {"trajectories": trajectories, "stats": stats}
        seconds = stats.seconds  # run_rollouts' own clock
        s = stats.summary()
        print(
            f"{name:>14}: {slots:>3} at once  {stats.sampled_tokens} sampled tokens in {seconds:.2f} s = "
            f"{stats.sampled_tokens / seconds:.1f} tok/s  ({stats.sequence_tokens / seconds:.0f} sequence tok/s)  "
            f"[prefill {stats.prefill_seconds:.1f} s, decode {stats.decode_seconds:.1f} s, "
            f"env and templates {seconds - stats.prefill_seconds - stats.decode_seconds:.1f} s]  "
            f"forwards {stats.forwards}  model tokens / sequence tokens {s['model_tokens_per_sequence_token']}  "
            f"kv padding {s['kv_pad_fraction']:.0%}",
            flush=True,
        )
    one, many = results["one_at_a_time"], results["batched"]
    same = sum(a.input_ids == b.input_ids for a, b in zip(one["trajectories"], many["trajectories"], strict=True))
    rate_one = one["stats"].sampled_tokens / one["stats"].seconds
    rate_many = many["stats"].sampled_tokens / many["stats"].seconds
    return {
        "bench": "rollout",
        "model": cfg.model.name,
        "device": str(policy.device),
        "episodes": len(tasks),
        "concurrent": concurrent,
        "max_new_tokens": max_new_tokens,
        "sampled_tokens": {"one_at_a_time": one["stats"].sampled_tokens, "batched": many["stats"].sampled_tokens},
        "identical_sequences": f"{same}/{len(tasks)}",
        "one_at_a_time_tok_per_s": round(rate_one, 1),
        "batched_tok_per_s": round(rate_many, 1),
        "speedup": round(rate_many / rate_one, 2),
        "model_tokens_per_sequence_token": many["stats"].summary()["model_tokens_per_sequence_token"],
        "torch_threads": torch.get_num_threads(),
        **peak_memory(policy.device),
    }


RANKS_WORKLOAD = {
    "name": "bench",
    "device": "cpu",
    "model": {"name": "tiny-random", "gradient_checkpointing": False},
    "data": {"max_train_tasks": 16},
    "rollout": {"group_size": 4, "max_new_tokens": 32, "max_response_tokens": 256},
    "train": {"steps": 3, "tasks_per_step": 8, "mini_batch_tasks": 4, "micro_batch": 4, "eval_every": 0},
}
"""The fixed workload of `bench ranks`: three steps of 8 tasks x 4 episodes, tiny random model, on the CPU."""


def bench_ranks(ranks: int, repeats: int, overrides: list[str]) -> dict:
    """The same training steps in one process and on `ranks` processes (torchrun, gloo), alternating."""
    if ranks < 2 or repeats < 1:
        raise ConfigError("bench ranks: --ranks must be at least 2 and --repeats at least 1")
    load_config(None, overrides)  # a bad override is named now, not inside a child process
    cores = os.cpu_count() or 1
    share = max(cores // ranks, 1)
    variants = [  # (label, processes, threads each): one process on every core, then on one rank's share
        (f"1 process x {cores} threads", 1, cores),
        (f"1 process x {share} threads", 1, share),
        (f"{ranks} ranks x {share} threads", ranks, share),
    ]
    times: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    walls: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "bench.yaml"
        recipe.write_text(yaml.safe_dump(RANKS_WORKLOAD))
        for repeat in range(repeats):
            for number, (label, processes, threads) in enumerate(variants):
                out = Path(folder) / f"{number}_{repeat}"
                command = launch_command(["train", str(recipe), f"out_dir={out}", *overrides], processes)
                env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
                load = os.getloadavg()[0]
                started = time.perf_counter()
                proc = subprocess.run(command, env=env, capture_output=True, text=True)
                wall = time.perf_counter() - started
                if proc.returncode != 0:
                    raise ConfigError(f"bench ranks: {label} failed:\n{proc.stderr[-2000:]}")
                steps = [r["time/step_s"] for r in read_metrics(out / "bench")][1:]  # the first step warms up
                times[label].append(sum(steps) / len(steps))
                walls[label].append(wall)
                print(
                    f"{label:>26}: {times[label][-1]:.2f} s per step (steps 1-{len(steps)}), {wall:.1f} s in all "
                    f"(start-up included); load average before {load:.2f}",
                    flush=True,
                )
    all_cores, one_share, many = (sum(times[label]) / repeats for label, _, _ in variants)
    return {
        "bench": "ranks",
        "workload": "3 steps x 8 tasks x 4 episodes, tiny-random, 32 new tokens per message",
        "ranks": ranks,
        "cpu_cores": cores,
        "step_s": {label: [round(t, 2) for t in ts] for label, ts in times.items()},
        "wall_s": {label: [round(t, 1) for t in ts] for label, ts in walls.items()},
        "speedup_over_1_process_all_cores": round(all_cores / many, 2),
        "speedup_over_1_process_same_threads": round(one_share / many, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini bench", description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["rollout", "ranks"])
    parser.add_argument("--episodes", type=int, default=32, help="rollout: episodes, one per distinct BFCL task")
    parser.add_argument("--concurrent", type=int, default=16, help="rollout: episodes generating at once when batched")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="rollout: tokens per model call")
    parser.add_argument("--ranks", type=int, default=2, help="ranks: processes of the data-parallel run")
    parser.add_argument("--repeats", type=int, default=2, help="ranks: runs of each, alternating")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.which == "ranks":
        result = bench_ranks(args.ranks, args.repeats, args.overrides)
    else:
        result = bench_rollout(args.episodes, args.concurrent, args.max_new_tokens, args.overrides)
    print(json.dumps(result))
    return 0
