"""Benchmarks that print numbers: `python -m seal_mini bench rollout [options] [key.sub=value ...]`.

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
import resource
import time

from seal_mini.config import CATEGORIES, ConfigError, load_config


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def bench_rollout(episodes: int, concurrent: int, max_new_tokens: int, overrides: list[str]) -> dict:
    """Time the same greedy rollouts batched (`concurrent` at once) and one at a time."""
    import torch

    if episodes < 1 or concurrent < 1:
        raise ConfigError("bench rollout: --episodes and --concurrent must be at least 1")

    from seal_mini.bfcl import load_tasks
    from seal_mini.env import Episode
    from seal_mini.policy import load_policy
    from seal_mini.rollout import RolloutStats, run_rollouts

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
        start = time.perf_counter()
        trajectories = run_rollouts(policy, envs(), cfg.rollout, 0.0, stats=stats)
        seconds = time.perf_counter() - start
        results[name] = {"trajectories": trajectories, "stats": stats, "seconds": seconds}
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
    rate_one = one["stats"].sampled_tokens / one["seconds"]
    rate_many = many["stats"].sampled_tokens / many["seconds"]
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
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "torch_threads": torch.get_num_threads(),
        **(
            {"peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)} if policy.device.type == "cuda" else {}
        ),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini bench", description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["rollout"])
    parser.add_argument("--episodes", type=int, default=32, help="episodes, one per distinct BFCL task")
    parser.add_argument("--concurrent", type=int, default=16, help="episodes generating at once when batched")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per model call")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    args = parser.parse_args(argv)
    result = bench_rollout(args.episodes, args.concurrent, args.max_new_tokens, args.overrides)
    print(json.dumps(result))
    return 0
