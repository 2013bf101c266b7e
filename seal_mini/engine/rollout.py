"""Batched multi-turn rollouts: the model work of many episodes at once, on one KV cache.

What an episode's tokens, loss_mask and old log-probs are is seal_mini.engine.sequences' business (no model
there), spelled out for one episode, one full forward per token, in tests/reference.py, which
tests/test_reference.py checks this engine against. Here `_Batch` does the batched model work (slots,
prefill, decode, sampling across rows) and `_Engine.run` joins it to the bookkeeping.

How the work is scheduled:
  - Slots. The KV cache is one block allocated once per call, (layers, K/V, slots, KV heads,
    max_total_tokens, head dim): each live episode owns a slot with room for the longest sequence it
    may grow to, written in place. So the cache holds its budget and nothing more whatever the mix of
    lengths, and no batch is ever rebuilt by copying caches. The number of slots comes from
    rollout.kv_budget_gb (or rollout.max_concurrent); when an episode ends, the next one takes its slot.
  - Cache reuse. A live episode keeps its cache across its model calls, so every token of its sequence
    goes through the model once; the G samples of a task share one prefill of their prompt.
  - Batching. All live episodes decode together, one token each per forward, over slots 0..n-1 (when
    one ends, the one in the last slot moves into its place). One that finishes a message steps its
    environment, its new tokens are prefilled (batched with others of similar length) and it decodes
    again, so no episode waits for the slowest message of the batch.
  - Sampling. Each episode draws from its own random stream, seeded by (seed, task, sample), so what it
    samples depends neither on the episodes beside it nor on the rank that runs it.
  - Out of GPU memory. The finished episodes are kept, the slots halve and the rest run again from
    their start (same streams, so the same samples), saying what shrank.
  - Hybrid models (Qwen3.5: three of every four layers gated delta-net linear attention). A slot also
    holds each linear layer's recurrent state and the last inputs of its causal convolution, a fixed
    size whatever the length. A recurrent state sums everything it was given, padding too, so these
    models prefill one episode per forward, and a prompt's state is shared with the next sample only
    where it stands exactly at the shared prefix.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, LinearAttentionCacheLayerMixin

from seal_mini.config import ConfigError, RolloutConfig
from seal_mini.engine import device as devices
from seal_mini.engine.logprobs import causal_lm
from seal_mini.engine.sequences import (
    EnvLike,
    LiveEpisode,
    LogitsHook,
    Sequences,
    Trajectory,
    episode_seed,
    sample_numbers,
    sample_tokens,
    scored_temperature,
    task_id,
)


@dataclass
class RolloutStats:
    """What one run_rollouts call did (for benchmarks, logs and preflight)."""

    episodes: int = 0
    concurrency: int = 0
    """Slots: episodes that held a cache at once (after any out-of-memory retry)."""
    kv_cache_bytes: int = 0
    """Memory of the slots' KV cache (the largest one allocated)."""
    out_of_memory: int = 0
    """Out-of-memory errors survived by running again with fewer slots or smaller prefill pieces."""
    sampled_tokens: int = 0
    sequence_tokens: int = 0
    """Tokens in all final sequences: the distinct tokens of the run."""
    model_tokens: int = 0
    """Real (not padding) tokens fed through the model, prefill and decode."""
    prefilled_tokens: int = 0
    """The part of model_tokens fed by prefill forwards (prompts, tool results, user turns)."""
    pad_tokens: int = 0
    """Padding positions fed through the model in prefill batches."""
    forwards: int = 0
    decode_steps: int = 0
    kv_columns: int = 0
    """Sum over decode steps of rows x cache width (attention keys read, padding included)."""
    kv_used: int = 0
    """The same sum counting real tokens only."""
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    def summary(self) -> dict:
        """Numbers for a log line: rates and the recompute ratio (1.0 = every token computed once)."""
        decoded = self.model_tokens - self.prefilled_tokens
        return {
            "episodes": self.episodes,
            "concurrency": self.concurrency,
            "kv_cache_mb": round(self.kv_cache_bytes / 2**20, 1),
            "out_of_memory": self.out_of_memory,
            "sampled_tokens": self.sampled_tokens,
            "sequence_tokens": self.sequence_tokens,
            "model_tokens_per_sequence_token": round(self.model_tokens / max(self.sequence_tokens, 1), 3),
            "prefill_pad_fraction": round(self.pad_tokens / max(self.pad_tokens + self.prefilled_tokens, 1), 3),
            "kv_pad_fraction": round(1 - self.kv_used / max(self.kv_columns, 1), 3),
            "forwards": self.forwards,
            "decode_steps": self.decode_steps,
            "seconds": round(self.seconds, 3),
            "prefill_seconds": round(self.prefill_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "prefill_tokens_per_s": round(self.prefilled_tokens / max(self.prefill_seconds, 1e-9), 1),
            "decode_tokens_per_s": round(decoded / max(self.decode_seconds, 1e-9), 1),
            "sampled_tokens_per_s": round(self.sampled_tokens / max(self.seconds, 1e-9), 1),
        }


# --- how many episodes at once ----------------------------------------------------------------------

CPU_KV_BUDGET_GB = 2.0
"""The KV budget on CPU when rollout.kv_budget_gb is 0."""
GPU_KV_SHARE = 0.7
"""Share of the GPU memory free after loading that rollouts give to the KV cache when
rollout.kv_budget_gb is 0; the rest holds prefill activations, logits and allocator slack."""


def _text_config(model_config):
    return model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config


def _kv_shape(model_config) -> tuple[int, int, int]:
    """(layers with keys and values, KV heads, head dim) of a decoder config: every layer, or a hybrid
    model's full-attention layers."""
    c = _text_config(model_config)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    return types.count("full_attention"), kv_heads, head_dim


def _state_shapes(model_config) -> tuple[int, tuple[int, int], tuple[int, int, int]]:
    """(linear-attention layers, their conv state (channels, kernel), their recurrent state (heads, key dim,
    value dim)) of a hybrid config; 0 layers for a plain transformer."""
    c = _text_config(model_config)
    layers = (getattr(c, "layer_types", None) or []).count("linear_attention")
    if not layers:
        return 0, (0, 0), (0, 0, 0)
    keys, values = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
    conv = (2 * keys + values, c.linear_conv_kernel_dim)
    return layers, conv, (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)


def kv_bytes_per_token(model_config, dtype: torch.dtype) -> int:
    """Bytes of KV cache one token takes: layers x KV heads x head dim x 2 (K and V) x dtype bytes."""
    layers, kv_heads, head_dim = _kv_shape(model_config)
    return layers * kv_heads * head_dim * 2 * torch.empty(0, dtype=dtype).element_size()


def state_bytes_per_slot(model_config, dtype: torch.dtype) -> int:
    """Bytes a hybrid model's linear layers hold per episode whatever its length: the conv state in `dtype`,
    the recurrent state in float32 (what the gated delta rule returns); 0 for a plain transformer."""
    layers, (channels, kernel), (heads, dk, dv) = _state_shapes(model_config)
    return layers * (channels * kernel * torch.empty(0, dtype=dtype).element_size() + heads * dk * dv * 4)


def slot_bytes(model_config, dtype: torch.dtype, capacity: int) -> int:
    """Bytes one slot of `capacity` tokens takes: its keys and values, and a hybrid's linear-layer states."""
    return kv_bytes_per_token(model_config, dtype) * capacity + state_bytes_per_slot(model_config, dtype)


def kv_budget(policy, cfg: RolloutConfig) -> tuple[int, str]:
    """(bytes, where the number comes from) of the KV cache one wave of rollouts may hold."""
    if cfg.kv_budget_gb:
        return int(cfg.kv_budget_gb * 2**30), "rollout.kv_budget_gb"
    if policy.device.type == "cuda":
        return int(GPU_KV_SHARE * devices.free_bytes(policy.device)), f"{GPU_KV_SHARE:.0%} of free GPU memory"
    return int(CPU_KV_BUDGET_GB * 2**30), f"{CPU_KV_BUDGET_GB:g} GB on CPU"


def concurrency(policy, cfg: RolloutConfig, n_episodes: int) -> int:
    """Episodes that generate at once: rollout.max_concurrent, or as many slots of max_total_tokens as the
    KV budget holds; never more than an out-of-memory error left (policy.limits)."""
    if cfg.max_concurrent:
        slots = cfg.max_concurrent
    else:
        per_slot = slot_bytes(causal_lm(policy.model).config, policy.dtype, cfg.max_total_tokens)
        slots = kv_budget(policy, cfg)[0] // per_slot
    if policy.limits.max_concurrent:
        slots = min(slots, policy.limits.max_concurrent)
    return int(max(1, min(n_episodes, slots)))


# --- the KV cache: one slot per live episode, written in place ---------------------------------------


@dataclass
class _Plan:
    """Where one forward reads and writes the slots. The new tokens are (R, N), right-padded."""

    rows: slice | torch.Tensor
    """The slots of the R rows: a slice when they are adjacent (a view, no copy), else their indices."""
    width: int
    """Cache columns the attention reads: [0, width) of every row."""
    writes: list[tuple[int, int, int]]
    """(slot, first column, real tokens) per row: where its new keys and values go (column = position)."""
    decode: tuple[torch.Tensor, torch.Tensor] | None = None
    """For one new token per row: (slots, columns), (R,) each, written by one indexed copy per layer."""
    seen: int = 0
    """Tokens already cached in the row (single-row forwards without a mask only)."""
    fresh: bool = False
    """Nothing is cached in any row yet (a prompt's first piece): linear layers start from a zero state."""


class KVSlots:
    """The cache of a wave, allocated once: keys and values (layers, K/V, slots, KV heads, capacity, head dim)
    and, for a hybrid model, each linear layer's states (slots, ...).

    Slot s holds the keys and values of one episode at columns 0.. (column = token position), and the
    states its linear layers reached after its cached tokens. A forward writes its new tokens' keys and
    values (and the new states) into their slots and attends over the slots it names."""

    def __init__(self, model_config, slots: int, capacity: int, dtype: torch.dtype, device: torch.device):
        layers, kv_heads, head_dim = _kv_shape(model_config)
        # zeros, not empty: attention gives masked columns weight 0, and 0 x NaN garbage would still be NaN
        self.tensor = torch.zeros(layers, 2, slots, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        linear, conv, recurrent = _state_shapes(model_config)
        self.conv = torch.zeros(linear, slots, *conv, dtype=dtype, device=device)
        self.recurrent = torch.zeros(linear, slots, *recurrent, dtype=torch.float32, device=device)
        self.plan: _Plan | None = None
        """Set before each forward: which slots it reads and where its new tokens go."""
        self.transformers = DynamicCache()  # what the model is given as past_key_values
        types = getattr(_text_config(model_config), "layer_types", None) or ["full_attention"] * layers
        made = {"full_attention": 0, "linear_attention": 0}  # each kind's layers numbered in its own store
        for kind in types:
            layer = _SlotLayer if kind == "full_attention" else _SlotStates
            self.transformers.layers.append(layer(self, made[kind]))
            made[kind] += 1

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tensor, self.conv, self.recurrent))

    @property
    def slots(self) -> int:
        return self.tensor.shape[2]

    @property
    def recurrent_layers(self) -> bool:
        return self.conv.shape[0] > 0

    def copy(self, source: int, target: int, columns: int) -> None:
        """Copy columns [0, columns) of one slot into another (all layers, keys and values), and its states."""
        self.tensor[:, :, target, :, :columns] = self.tensor[:, :, source, :, :columns]
        self.conv[:, target], self.recurrent[:, target] = self.conv[:, source], self.recurrent[:, source]


class _SlotLayer(DynamicLayer):
    """One layer of a transformers Cache whose keys and values live in preallocated slots."""

    def __init__(self, kv: KVSlots, layer: int):
        super().__init__()
        self.is_initialized = True
        self.kv, self.keys_all, self.values_all = kv, kv.tensor[layer, 0], kv.tensor[layer, 1]  # (S, H, C, d)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the (R, H, N, d) new keys and values into their slots; return the rows' (R, H, W, d) cache."""
        plan = self.kv.plan
        for store, states in ((self.keys_all, key_states), (self.values_all, value_states)):
            if plan.decode is not None:
                store[plan.decode[0], :, plan.decode[1]] = states[:, :, 0]  # (R, H, d), in place
            else:
                for row, (slot, column, n) in enumerate(plan.writes):
                    store[slot, :, column : column + n] = states[row, :, :n]  # (H, n, d), in place
        if isinstance(plan.rows, slice):
            return self.keys_all[plan.rows, :, : plan.width], self.values_all[plan.rows, :, : plan.width]
        # rows that are not adjacent: a copy of their cache for this layer only, freed after its attention
        return (
            self.keys_all[:, :, : plan.width].index_select(0, plan.rows),
            self.values_all[:, :, : plan.width].index_select(0, plan.rows),
        )

    # transformers asks these only to build its own causal mask: for a single row, nothing cached, no mask
    def get_seq_length(self, *args) -> int:
        return self.kv.plan.seen

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        return self.kv.plan.seen + query_length, 0


class _SlotStates(LinearAttentionCacheLayerMixin):
    """One linear-attention layer of a transformers Cache whose states live in preallocated slots, as the
    Qwen3.5 gated delta-net reads and writes them: `conv_states[0]` and `recurrent_states[0]` are the rows'
    (the decode kernel updates the conv state in place), `update_*` write the new ones into the slots.
    Every forward of a hybrid model runs adjacent slots (decode over 0..n-1, prefill one slot), so the rows
    are a view of the slots, never a copy."""

    def __init__(self, kv: KVSlots, layer: int):  # the mixin's __init__ would bind plain dicts to the names
        self.kv, self.conv_all, self.recurrent_all = kv, kv.conv[layer], kv.recurrent[layer]
        self.number_of_states, self.record_past = 1, False
        self.conv_kernel_size = {0: self.conv_all.shape[-1]}

    def _rows(self, store: torch.Tensor) -> torch.Tensor:
        rows = self.kv.plan.rows
        assert isinstance(rows, slice), "a hybrid model's forward runs adjacent slots"
        return store[rows]

    @property
    def has_previous_state(self) -> dict[int, bool]:
        return {0: not self.kv.plan.fresh}

    @property
    def conv_states(self) -> dict[int, torch.Tensor]:
        return {0: self._rows(self.conv_all)}

    @property
    def recurrent_states(self) -> dict[int, torch.Tensor]:
        return {0: self._rows(self.recurrent_all)}

    def lazy_initialization(self, *args, **kwargs) -> None:  # allocated with the slots
        pass

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """The rows' new conv inputs (R, C, N) after their cached ones; the last `kernel` are kept."""
        rows, kernel = self._rows(self.conv_all), self.conv_all.shape[-1]
        full = conv_states if self.kv.plan.fresh else torch.cat([rows, conv_states], dim=-1)
        if full.shape[-1] < kernel:
            full = torch.nn.functional.pad(full, (kernel - full.shape[-1], 0))
        rows.copy_(full[..., -kernel:])
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        rows = self._rows(self.recurrent_all)
        rows.copy_(recurrent_states)
        return rows


# --- batched model work ------------------------------------------------------------------------------


@dataclass
class _Live(LiveEpisode):
    """A live episode with its place in the KV cache."""

    slot: int = -1
    """Its slot in the KV cache (-1 before it gets one; the last one it had after it ended)."""
    cached: int = 0
    """Tokens of the current segment whose keys and values are in its slot (all but the newest while live)."""

    @property
    def pending(self) -> int:
        """Tokens of the current segment to prefill before the next decode (all but the newest are cached then)."""
        return len(self.traj.input_ids) - self.traj.base - 1 - self.cached


GATHER_SHARE = 0.1
"""A prefill of episodes in slots that are not adjacent copies their caches for one layer at a time;
chunks are kept small enough that this copy stays under this share of the slots' memory."""


class _Batch:
    """The live episodes in their slots, and the forwards that run them: prefill and decode."""

    def __init__(self, policy, cfg: RolloutConfig, slots: int, prefill_tokens: int, temperature: float, stats):
        self.model, self.device, self.cfg, self.pad_id = policy.model, policy.device, cfg, policy.renderer.pad_id
        self.temperature, self.prefill_tokens, self.stats = temperature, prefill_tokens, stats
        config = causal_lm(policy.model).config
        self.kv = KVSlots(config, slots, cfg.max_total_tokens, policy.dtype, policy.device)
        stats.kv_cache_bytes = max(stats.kv_cache_bytes, self.kv.nbytes)
        self.eager = config._attn_implementation == "eager"  # additive float masks instead of boolean ones
        layers = _kv_shape(config)[0]
        self.gather_columns = int(GATHER_SHARE * layers * slots * cfg.max_total_tokens)
        self.owner: list[_Live | None] = [None] * slots
        """The episode whose keys and values each slot holds (live, or ended and not yet overwritten)."""
        self.live: list[_Live] = []
        self.last_prompt: _Live | None = None  # the last prompt prefilled: the next one may share its prefix

    def has_room(self) -> bool:
        return len(self.live) < self.kv.slots

    def admit(self, live: _Live) -> None:
        """Give an episode a free slot (the lowest, so live slots stay packed at the front)."""
        used = {x.slot for x in self.live}
        live.slot = next(s for s in range(self.kv.slots) if s not in used)
        self.live.append(live)

    def release(self, live: _Live) -> None:
        """An episode ended: its slot is free (its data stays until overwritten)."""
        self.live.remove(live)

    def pack(self) -> list[_Live]:
        """Move episodes from the back into free slots so the live ones hold slots 0..n-1; returns them
        in slot order (the rows of a decode forward, read as one view of the cache)."""
        by_slot = sorted(self.live, key=lambda x: x.slot)
        for target in range(len(by_slot)):
            if by_slot[target].slot != target:  # a hole: the episode in the last slot moves into it
                moved = by_slot.pop()
                self.kv.copy(moved.slot, target, moved.cached)
                moved.slot, self.owner[target] = target, moved
                by_slot.insert(target, moved)
        return by_slot

    def rewind(self, live: _Live) -> None:
        """A new segment began: the slot keeps the keys and values of the tokens it shares with the last
        one; a linear layer's state holds all of the last segment's, so a hybrid model prefills it whole."""
        if live.kept is not None:
            segment = len(live.traj.input_ids) - live.traj.base
            live.cached = 0 if self.kv.recurrent_layers else min(live.cached, live.kept, segment - 1)
            live.kept = None

    # -- prefill ---------------------------------------------------------------------------------------

    def prefill(self, lives: list[_Live]) -> None:
        """Bring each episode's cache up to all but its newest token.

        A new prompt first takes the cache of the previous prompt for their common prefix: episodes are
        admitted in sorted order of their prompt ids, so the G samples of a task share all of it and
        tasks with the same tools share the system prompt (thousands of tokens); only the rest is run.
        Keys and values of a prefix do not depend on what follows it, so nothing changes but the work."""
        prompts = [x for x in lives if x.cached == 0]
        results = sorted((x for x in lives if x.cached > 0), key=lambda x: x.pending)
        for live in prompts:
            ids = live.traj.input_ids[live.traj.base : -1]
            source = self.last_prompt
            if source is not None and self.owner[source.slot] is source:  # its cache is still in its slot
                cached = source.traj.input_ids[source.traj.base :][: source.cached]
                shared = len(os.path.commonprefix([cached, ids]))
                # A short common prefix saves little, and a long prefill after a cache cannot use the fused
                # causal kernel (measured 2x slower on CPU), so only reuse one that covers half the prompt.
                # A linear layer's state is the one after all the source's cached tokens: usable only there.
                if shared >= len(ids) // 2 and not (self.kv.recurrent_layers and shared != source.cached):
                    if source.slot != live.slot:
                        self.kv.copy(source.slot, live.slot, shared)
                    live.cached = shared
            self.owner[live.slot] = live
            self._prefill_rows([live])  # a prompt of thousands of tokens keeps the device busy by itself
            self.last_prompt = live
        # Tool results and next user turns: batched with others of similar length (at most twice as
        # long, plus a little), so padding stays small.
        chunk: list[_Live] = []
        for live in results:
            n = live.pending
            if n == 0:
                continue
            if chunk:
                shortest = chunk[0].pending
                width = max(len(x.traj.input_ids) - x.traj.base for x in (*chunk, live))
                if (
                    n * (len(chunk) + 1) > self.prefill_tokens
                    or n > 2 * shortest + 32
                    or width * (len(chunk) + 1) > self.gather_columns
                    or self.kv.recurrent_layers  # padding would run through the recurrent states
                ):
                    self._prefill_rows(chunk)
                    chunk = []
            chunk.append(live)
        if chunk:
            self._prefill_rows(chunk)

    def _prefill_rows(self, lives: list[_Live]) -> None:
        """Episodes' new tokens in one forward (prefill() sized the chunk), or one episode's in pieces of at
        most prefill_tokens (bounds the activations; a prompt, or tokens after an out-of-memory halving)."""
        while any(live.pending for live in lives):
            self._prefill_chunk(lives)

    def _prefill_chunk(self, lives: list[_Live]) -> None:
        limit = self.prefill_tokens if len(lives) == 1 else None  # a chunk of several is sized by prefill()
        new = [live.traj.input_ids[live.traj.base + live.cached : -1][:limit] for live in lives]
        width = max(len(n) for n in new)
        input_ids = torch.tensor([n + [self.pad_id] * (width - len(n)) for n in new], device=self.device)  # (R, N)
        started = time.perf_counter()
        # A prompt with nothing cached needs no mask: attention can use its fused causal kernel.
        fresh = len(lives) == 1 and lives[0].cached == 0
        self._forward(lives, input_ids, [len(n) for n in new], mask=not fresh)
        for live, n in zip(lives, new, strict=True):
            live.cached += len(n)
            self.owner[live.slot] = live
        self.stats.forwards += 1
        real = sum(len(n) for n in new)
        self.stats.model_tokens += real
        self.stats.prefilled_tokens += real
        self.stats.pad_tokens += len(new) * width - real
        self.stats.prefill_seconds += time.perf_counter() - started

    # -- decode ------------------------------------------------------------------------------------------

    def decode(self, sequences: Sequences, hook: LogitsHook | None) -> list[_Live]:
        """One token per live episode per forward until at least one message ends; returns those episodes."""
        rows = self.pack()
        assert not any(x.pending for x in rows), "decode needs every earlier token cached"
        started = time.perf_counter()
        while True:
            input_ids = torch.tensor([[live.traj.input_ids[-1]] for live in rows], device=self.device)  # (R, 1)
            self.stats.kv_columns += len(rows) * (max(live.cached for live in rows) + 1)
            self.stats.kv_used += sum(live.cached + 1 for live in rows)
            logits = self._forward(rows, input_ids, [1] * len(rows), mask=True).float()  # (R, V)
            for live in rows:
                live.cached += 1
            logprobs = torch.log_softmax(logits / scored_temperature(self.temperature), dim=-1)  # (R, V)
            if hook is not None:
                logits = hook([x.index for x in rows], [list(x.message) for x in rows], logits)
            uniforms = None
            if self.temperature > 0:  # each episode's own stream, whatever the rows beside it
                uniforms = torch.cat([torch.rand(1, generator=live.generator) for live in rows])  # (R,)
            tokens = sample_tokens(logits, self.temperature, self.cfg.top_p, uniforms=uniforms)  # (R,)
            token_logprobs = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (R,)
            self.stats.forwards += 1
            self.stats.decode_steps += 1
            self.stats.model_tokens += len(rows)
            ended = [
                live
                for live, token, logprob in zip(rows, tokens.tolist(), token_logprobs.tolist(), strict=True)
                if sequences.sampled(live, token, logprob)
            ]
            if ended:
                self.stats.decode_seconds += time.perf_counter() - started
                return ended

    def _forward(self, lives: list[_Live], input_ids: torch.Tensor, lengths: list[int], mask: bool) -> torch.Tensor:
        """Run (R, N) new tokens (row r's first lengths[r] real) after each row's cached tokens; their keys
        and values go into the rows' slots. Returns the (R, V) logits of the last column."""
        rows, new = input_ids.shape
        dev = self.device
        cached = [live.cached for live in lives]
        slots = [live.slot for live in lives]
        positions = torch.tensor(cached, device=dev)[:, None] + torch.arange(new, device=dev)[None, :]  # (R, N)
        width = max(c + n for c, n in zip(cached, lengths, strict=True))
        adjacent = slots == list(range(slots[0], slots[0] + rows))
        self.kv.plan = _Plan(
            rows=slice(slots[0], slots[0] + rows) if adjacent else torch.tensor(slots, device=dev),
            width=width,
            writes=list(zip(slots, cached, lengths, strict=True)),
            decode=(torch.tensor(slots, device=dev), positions[:, 0]) if new == 1 else None,
            seen=cached[0] if not mask else 0,
            fresh=not any(cached),
        )
        attention = None
        if mask:
            # query (r, j) at position cached_r + j sees the columns up to its own
            visible = torch.arange(width, device=dev)[None, None, :] <= positions[:, :, None]  # (R, N, W)
            attention = visible[:, None]  # (R, 1, N, W), as transformers' 4-D masks
            if self.eager:
                attention = torch.zeros(attention.shape, dtype=self.kv.tensor.dtype, device=dev).masked_fill(
                    ~attention, torch.finfo(self.kv.tensor.dtype).min
                )
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=self.kv.transformers,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]  # (R, V)


# --- the loop ----------------------------------------------------------------------------------------


class _Engine:
    """Runs episodes to their end: admits them into slots as slots free up, prefills, decodes, steps."""

    def __init__(self, policy, cfg: RolloutConfig, temperature: float, logits_hook, stats, finished: dict):
        self.policy, self.cfg, self.temperature, self.stats = policy, cfg, temperature, stats
        self.logits_hook = logits_hook
        self.sequences = Sequences(policy.renderer, cfg)
        self.finished: dict[int, Trajectory] = finished
        """Episodes that ended, by env index (kept when a later forward runs out of memory)."""
        self.started, self.sampled_before = time.perf_counter(), stats.model_tokens - stats.prefilled_tokens

    def run(self, envs: dict[int, EnvLike], seeds: dict[int, int], slots: int, prefill: int, progress) -> None:
        """Run the episodes with this many slots. An out-of-memory error leaves the episodes that ended
        in self.finished; the caller runs the others again, smaller."""
        batch = _Batch(self.policy, self.cfg, slots, prefill, self.temperature, self.stats)
        lives = [self.sequences.start(i, env, seeds[i], _Live) for i, env in envs.items()]
        for live in lives:
            if live.traj.truncated:  # its prompt alone was over the limits
                self._finish(live, progress)
        # Sorted by prompt ids, so prompts with long common prefixes follow each other (see prefill).
        queue = sorted((x for x in lives if not x.traj.truncated), key=lambda x: x.traj.input_ids, reverse=True)
        ready: list[_Live] = []
        while queue or batch.live:
            while queue and batch.has_room():
                live = queue.pop()
                batch.admit(live)
                ready.append(live)
            batch.prefill(ready)  # new prompts, and the tokens that followed the last messages
            ready = []
            for live in batch.decode(self.sequences, self.logits_hook):
                if self.sequences.end_message(live):
                    batch.rewind(live)
                    ready.append(live)  # its new tokens are prefilled before it decodes again
                else:
                    batch.release(live)
                    self._finish(live, progress)

    def _finish(self, live: _Live, progress) -> None:
        self.finished[live.index] = live.traj
        if progress is not None:
            sampled = self.stats.model_tokens - self.stats.prefilled_tokens - self.sampled_before  # one per decode row
            rate = sampled / max(time.perf_counter() - self.started, 1e-9)
            progress.set_postfix_str(f"{rate:.0f} sampled tok/s", refresh=False)
            progress.update(1)


def _check_cache_layout(model) -> None:
    lm = causal_lm(model)
    forwards = [type(m).forward for m in (lm, getattr(lm, "model", None)) if m is not None]
    if any("unsloth" in (getattr(f, "__module__", "") or "") for f in forwards):
        raise ConfigError(
            "model.backend: unsloth's patched forward returns a new KV cache instead of growing the one the "
            "rollout engine passes; use model.backend=hf (bitsandbytes 4-bit + peft) for now"
        )
    config = lm.config
    types = set(getattr(config.get_text_config(), "layer_types", None) or [])
    linear = {type(m).__name__ for m in lm.modules() if hasattr(m, "A_log") and hasattr(m, "conv1d")}
    if types - {"full_attention", "linear_attention"} or linear - {"Qwen3_5GatedDeltaNet"}:
        raise ConfigError(
            f"model.name: layer types {sorted(types)} ({', '.join(sorted(linear)) or 'no linear layers'}) are not "
            "supported by the rollout engine, which keeps a KV cache per full-attention layer and the states of "
            "Qwen3.5's gated delta-net layers (Llama / Qwen2 / Qwen3 / SmolLM / Qwen3.5 style models)"
        )
    if config._attn_implementation not in ("sdpa", "eager", "seal_mini_sdpa"):
        raise ConfigError(
            f"model.attn_implementation: {config._attn_implementation} cannot take the per-episode attention masks "
            "the rollout engine builds (its episodes sit at different positions of one cache); use sdpa or eager"
        )


MIN_PREFILL_TOKENS = 256
"""Out of memory with one episode at a time: prefill pieces halve down to this many tokens."""


@torch.no_grad()
def run_rollouts(
    policy,
    envs: list,
    cfg_rollout: RolloutConfig,
    temperature: float,
    seed: int | tuple[int, ...] = 0,
    progress=None,
    stats: RolloutStats | None = None,
    logits_hook: LogitsHook | None = None,
    samples: list[int] | None = None,
) -> list[Trajectory]:
    """Run every episode to its end with the policy; trajectories come back in the order of envs.

    Sampling follows temperature (0 = greedy) and cfg_rollout.top_p. Episode i draws from its own stream,
    seeded by (seed, its task id, samples[i]); samples defaults to how many episodes of that task came
    before it in envs (a rank that plays part of a round passes the numbers its episodes have in the whole
    round). So the same seed gives the same rollouts at any concurrency, on any number of ranks.
    `progress` (a tqdm bar) advances once per finished episode.

    On a CUDA out-of-memory error the finished episodes are kept and the others run again from their
    start with half the slots (then smaller prefill pieces); policy.limits remembers the smaller setting."""
    _check_cache_layout(policy.model)
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("an episode object appears more than once in envs; make one per rollout")
    stats = stats if stats is not None else RolloutStats()
    task_ids = [task_id(env, i) for i, env in enumerate(envs)]
    samples = sample_numbers(task_ids) if samples is None else samples
    assert len(samples) == len(envs), f"{len(samples)} sample numbers for {len(envs)} episodes"
    seeds = {
        i: episode_seed(seed, task, sample) for i, (task, sample) in enumerate(zip(task_ids, samples, strict=True))
    }
    limits = policy.limits
    slots = concurrency(policy, cfg_rollout, len(envs))
    prefill = min(cfg_rollout.prefill_tokens, limits.prefill_tokens or cfg_rollout.prefill_tokens)
    was_training = policy.model.training
    policy.model.eval()  # no dropout while sampling; gradient checkpointing is off outside training
    started = time.perf_counter()
    finished: dict[int, Trajectory] = {}
    used = slots

    def wave() -> None:  # the episodes not finished yet, to their end
        nonlocal used
        todo = {i: env for i, env in enumerate(envs) if i not in finished}
        used = min(slots, len(todo))
        _Engine(policy, cfg_rollout, temperature, logits_hook, stats, finished).run(
            todo, seeds, used, prefill, progress
        )

    def smaller() -> None:  # out of memory: the finished episodes stay, the others run again, smaller
        nonlocal slots, prefill
        stats.out_of_memory += 1
        slots, prefill = _shrink_rollouts(used, prefill, len(envs) - len(finished), limits)

    try:
        devices.until_it_fits(wave, smaller, policy.device)
    finally:
        policy.model.train(was_training)
    trajectories = [finished[i] for i in range(len(envs))]
    stats.concurrency = min(slots, len(envs))
    stats.seconds += time.perf_counter() - started
    stats.episodes += len(trajectories)
    stats.sampled_tokens += sum(t.n_sampled for t in trajectories)
    stats.sequence_tokens += sum(len(t.input_ids) for t in trajectories)
    return trajectories


def _shrink_rollouts(slots: int, prefill: int, unfinished: int, limits: devices.MemoryLimits) -> tuple[int, int]:
    """The next, smaller setting after an out-of-memory error, remembered in limits; says what shrank."""
    if slots > 1:
        smaller = slots // 2
        limits.max_concurrent = smaller
        what = f"{slots} -> {smaller} episodes at once (rollout.max_concurrent={smaller} sets this from the start)"
        slots = smaller
    elif prefill > MIN_PREFILL_TOKENS:
        smaller = max(MIN_PREFILL_TOKENS, prefill // 2)
        limits.prefill_tokens = smaller
        what = f"prefill pieces of {prefill} -> {smaller} tokens (rollout.prefill_tokens={smaller})"
        prefill = smaller
    else:
        raise ConfigError(
            "out of GPU memory with one episode at a time and prefill pieces of "
            f"{MIN_PREFILL_TOKENS} tokens: a slot holds rollout.max_total_tokens tokens of KV cache; lower "
            "rollout.max_total_tokens, or use a smaller model (python -m seal_mini preflight RECIPE measures it)"
        )
    print(
        f"[memory] out of GPU memory in a rollout wave: {what}; {unfinished} unfinished episodes start again "
        "(finished ones are kept)",
        file=sys.stderr,
        flush=True,
    )
    return slots, prefill
