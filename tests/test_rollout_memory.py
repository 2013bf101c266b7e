"""The rollout engine's KV cache stays within its budget whatever the mix of episode lengths (CPU).

The measurement does not ask the engine: it watches every tensor torch creates while real BFCL
episodes are replayed through run_rollouts (ground-truth calls forced by a logits hook, so sequences
grow as in training), and counts the bytes of those laid out as keys or values (KV heads third from
last, head dim last) that are cache: kept beyond the forward that made them, made outside any forward,
or handed to attention by the transformers Cache. Activations that only compute new keys (rotary
temporaries, the new keys themselves) are not cache and are left out.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from test_rollout import Script, oracle_script, rollout_cfg
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from seal_mini.config import load_config
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import RolloutStats, kv_bytes_per_token, run_rollouts
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.verifier import check


class CacheBytes(TorchDispatchMode):
    """Peak bytes of live KV cache tensors while active (see the module docstring for what counts)."""

    def __init__(self, model, kv_heads: int, head_dim: int):
        super().__init__()
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.records: dict[int, dict] = {}  # storage id -> birth, death, bytes, forward it was born in, is cache
        self.live: dict[int, StorageWeakRef] = {}
        self.clock, self.forward = 0, 0
        self.hooks = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._leave),
        ]
        from transformers.cache_utils import Cache

        self.cache_class, self.real_update = Cache, Cache.update
        tracker = self

        def update(cache, *args, **kwargs):  # whatever the Cache hands to attention is cache
            keys, values = tracker.real_update(cache, *args, **kwargs)
            for t in (keys, values):
                tracker._record(t)["cache"] = True
            return keys, values

        Cache.update = update

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        self.cache_class.update = self.real_update
        return super().__exit__(*exc)

    def _enter(self, module, args):
        self.forward = self.clock + 1

    def _leave(self, module, args, output):
        self._prune()
        for key in self.live:  # made in this forward and still alive after it: kept for later forwards
            if self.records[key]["born_in"] == self.forward:
                self.records[key]["cache"] = True
        self.forward = 0

    def _record(self, t: torch.Tensor) -> dict:
        ref = StorageWeakRef(t.untyped_storage())
        if ref.cdata not in self.live:
            self.live[ref.cdata] = ref
            self.records[ref.cdata] = {
                "birth": self.clock,
                "death": None,
                "bytes": t.untyped_storage().nbytes(),
                "born_in": self.forward,
                "cache": self.forward == 0,
            }
        return self.records[ref.cdata]

    def _prune(self) -> None:
        for key in [k for k, ref in self.live.items() if ref.expired()]:
            self.records[key]["death"] = self.clock
            del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.clock += 1
        self._prune()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dim() >= 3:
                if t.shape[-3] == self.kv_heads and t.shape[-1] == self.head_dim:
                    self._record(t)
        return out

    def peak(self) -> int:
        """The largest total of cache bytes alive at one time."""
        events = []
        for r in self.records.values():
            if r["cache"]:
                events.append((r["birth"], r["bytes"]))
                events.append((r["death"] if r["death"] is not None else self.clock + 1, -r["bytes"]))
        total = best = 0
        for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # frees before allocations at a tie
            total += change
            best = max(best, total)
        return best


LONG = ["multi_turn_long_context_110", "multi_turn_long_context_113", "multi_turn_long_context_135"]
SHORT = ["multi_turn_base_3", "multi_turn_base_6", "multi_turn_base_9"]


def test_kv_cache_peak_stays_within_the_budget_at_any_mix_of_lengths():
    """Long_context replays (tool outputs of 30-70k characters) next to short base ones, three slots:
    rows of 3k and 33k tokens share the cache, episodes leave and join it."""
    policy = load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))
    lm = policy.model.get_base_model()
    tasks = tasks_by_id(["long_context", "base"])
    ids = [i for pair in zip(LONG, SHORT, strict=True) for i in pair]
    total = 32768
    budget = 3 * total * kv_bytes_per_token(lm.config, policy.dtype)  # three slots of max_total_tokens
    cfg = rollout_cfg(max_total_tokens=total, max_prompt_tokens=8192, max_response_tokens=4096)
    cfg.kv_budget_gb = budget / 2**30
    script = Script({k: oracle_script(policy, tasks[i]) for k, i in enumerate(ids)})
    stats = RolloutStats()
    head_dim = lm.config.hidden_size // lm.config.num_attention_heads
    with CacheBytes(policy.model, lm.config.num_key_value_heads, head_dim) as cache:
        trajs = run_rollouts(policy, [Episode(tasks[i]) for i in ids], cfg, 0.0, logits_hook=script, stats=stats)
    peak = cache.peak()
    lengths = sorted(len(t.input_ids) for t in trajs)
    print(
        f"KV cache peak {peak / 2**20:.2f} MiB = {peak / budget:.3f} x the budget ({budget / 2**20:.2f} MiB); "
        f"{stats.concurrency} slots; sequence lengths {lengths}"
    )
    assert stats.concurrency == 3 and lengths[0] < 3500 and lengths[-1] > 30000  # a real mix of lengths
    assert peak <= 1.15 * budget
    for task_id, traj in zip(ids, trajs, strict=True):  # the replays are still exact
        assert traj.truncated or check(tasks[task_id], traj.env.checker_input()).reward == 1.0
