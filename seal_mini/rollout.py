"""Batched multi-turn rollouts whose token sequences are exactly what the model saw and sampled.

Each episode is one growing token sequence:
  prompt (system, tools, first user turn, start of the assistant turn)   loss_mask 0
  the assistant's tokens, verbatim as sampled (never decoded and re-encoded),
    with their sampling-time log-probs                                   loss_mask 1
  whatever the chat template puts next: the end of the turn if the message was cut, tool results,
    the next user turn, the start of the next assistant turn             loss_mask 0
Observation tokens come from rendering the whole conversation with the chat template and tokenizing
only the text beyond what the sequence already spells (seal_mini.chat.ChatRenderer.continuation), so
decoding a finished sequence gives the template's rendering of the episode's messages.

How the work is scheduled:
  - Slots. At most `concurrency()` episodes hold a KV cache at once, sized from the KV budget
    (layers x KV heads x head dim x 2 x dtype bytes per token, times max_total_tokens per episode)
    or set by rollout.max_concurrent. When an episode ends, the next waiting one takes its slot.
  - Cache reuse. A live episode keeps its KV cache across its model calls, so every token of its
    sequence goes through the model once; the G samples of a task share one prefill of their prompt.
  - Batching. All live episodes that are generating decode together, one token each per forward,
    their caches left-padded into one batch. When one finishes its message it leaves the batch, its
    environment steps, its new tokens are prefilled (batched with any other such episode) and it joins
    again, so no episode waits for the slowest message of the batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from seal_mini.config import ConfigError, RolloutConfig


class EnvLike(Protocol):
    """What the engine needs from an episode (seal_mini.env.Episode and interface wrappers fit)."""

    done: bool

    def reset(self) -> tuple[list[dict], list[dict]]: ...

    def step(self, text: str) -> Any: ...

    def truncate(self) -> None: ...


@dataclass
class Trajectory:
    """One finished episode: its token sequence with masks and log-probs, and its conversation."""

    task_id: str
    env: Any
    """The episode object after it ended (its records feed the verifier and the diagnoser)."""
    input_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the model sampled, 0 on everything else."""
    old_logprobs: list[float]
    """Log-prob of each sampled token under the model's own distribution (temperature 1, no top-p)
    when it was sampled; 0.0 where loss_mask is 0."""
    prompt_len: int
    truncated: bool
    """A length limit (prompt, response or total tokens) ended the episode."""
    messages: list[dict]
    """The conversation (env roles: system, user, assistant, tool) whose rendering the tokens spell."""
    tools: list[dict]
    n_sampled: int = 0
    n_messages: int = 0
    """Model calls (assistant messages)."""
    n_cut: int = 0
    """Messages cut at rollout.max_new_tokens (their end-of-turn token was appended, loss_mask 0)."""
    exact: bool = True
    """decode(input_ids) == render(messages). False only when the template rewrites an assistant
    message (e.g. strips whitespace) or the first prompt alone was over the limit (no tokens at all)."""


@dataclass
class RolloutStats:
    """What one run_rollouts call did (for benchmarks and logs)."""

    episodes: int = 0
    concurrency: int = 0
    sampled_tokens: int = 0
    sequence_tokens: int = 0
    """Tokens in all final sequences: the distinct tokens of the run."""
    model_tokens: int = 0
    """Real (not padding) tokens fed through the model, prefill and decode."""
    pad_tokens: int = 0
    """Padding positions fed through the model in prefill batches."""
    forwards: int = 0
    decode_steps: int = 0
    kv_slots: int = 0
    """Sum over decode steps of rows x cache width (attention keys read, padding included)."""
    kv_used: int = 0
    """The same sum counting real tokens only."""
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    def summary(self) -> dict:
        """Numbers for a log line: rates and the recompute ratio (1.0 = every token computed once)."""
        return {
            "episodes": self.episodes,
            "concurrency": self.concurrency,
            "sampled_tokens": self.sampled_tokens,
            "sequence_tokens": self.sequence_tokens,
            "model_tokens_per_sequence_token": round(self.model_tokens / max(self.sequence_tokens, 1), 3),
            "prefill_pad_fraction": round(self.pad_tokens / max(self.pad_tokens + self.model_tokens, 1), 3),
            "kv_pad_fraction": round(1 - self.kv_used / max(self.kv_slots, 1), 3),
            "forwards": self.forwards,
            "decode_steps": self.decode_steps,
            "seconds": round(self.seconds, 3),
            "prefill_seconds": round(self.prefill_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "sampled_tokens_per_s": round(self.sampled_tokens / max(self.seconds, 1e-9), 1),
        }


LogitsHook = Callable[[list[int], list[list[int]], torch.Tensor], torch.Tensor]
"""(env index of each row, ids sampled so far in each row's message, logits (R, V)) -> logits to sample
from. Only sampling sees the result; old_logprobs always come from the model's own logits."""


# --- sampling (pure) --------------------------------------------------------------------------------


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(R, V) logits -> (R,) token ids. Temperature 0 is greedy; top_p < 1 keeps the smallest set of
    tokens whose probability reaches top_p."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (R, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # Inverse-CDF sampling: R uniforms from the generator (a CPU one gives the same draws on any device)
    # move to the logits' device, so the (R, V) probabilities never leave the GPU.
    u = torch.rand(probs.shape[0], generator=generator, device=generator.device if generator else probs.device)
    cdf = probs.double().cumsum(dim=-1)  # (R, V), float64 so the tail of a large vocabulary keeps its mass
    target = u.to(probs.device, torch.float64)[:, None] * cdf[:, -1:]  # (R, 1)
    # right=True: the first token whose cumulative mass exceeds the target, which has mass > 0
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # (R,)
    return tokens.clamp(max=probs.shape[-1] - 1)


# --- how many episodes at once ----------------------------------------------------------------------


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def kv_bytes_per_token(model_config, dtype: torch.dtype) -> int:
    """Bytes of KV cache one token takes: layers x KV heads x head dim x 2 (K and V) x dtype bytes."""
    c = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return c.num_hidden_layers * kv_heads * head_dim * 2 * torch.empty(0, dtype=dtype).element_size()


def concurrency(policy, cfg: RolloutConfig, n_episodes: int) -> int:
    """Episodes that generate at once: rollout.max_concurrent, or as many worst-case (max_total_tokens)
    KV caches as fit in rollout.kv_budget_gb (0: half the free GPU memory, because re-batching briefly
    holds a second copy of the caches; 2 GB on CPU)."""
    if cfg.max_concurrent:
        return max(1, min(cfg.max_concurrent, n_episodes))
    if cfg.kv_budget_gb:
        budget = cfg.kv_budget_gb * 2**30
    elif policy.device.type == "cuda":
        torch.cuda.empty_cache()  # memory the allocator still holds from the last update counts as free
        budget = torch.cuda.mem_get_info(policy.device)[0] / 2
    else:
        budget = 2 * 2**30
    per_episode = kv_bytes_per_token(_causal_lm(policy.model).config, policy.dtype) * cfg.max_total_tokens
    return max(1, min(n_episodes, int(budget // per_episode)))


# --- KV caches of many episodes in one batch -------------------------------------------------------

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""One episode's cache: per layer (keys, values), each (kv_heads, tokens, head_dim)."""


def _growing_cache(keys: list[torch.Tensor], values: list[torch.Tensor]):
    """A transformers DynamicCache over (R, H, W, d) tensors, one pair per layer, with spare columns.

    transformers' DynamicLayer concatenates on every update, copying the whole cache once per decode
    step; this layer writes new columns into spare capacity (grown by a quarter when full) instead."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, k: torch.Tensor, v: torch.Tensor):
            super().__init__()
            self.lazy_initialization(k, v)
            self.length = 0
            self._k, self._v = k[:, :, :0], v[:, :, :0]
            self.update(k, v)

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self.length + n > self._k.shape[-2]:
                capacity = (self.length + n) * 5 // 4 + 64
                grown_k = key_states.new_empty(*key_states.shape[:2], capacity, key_states.shape[-1])
                grown_v = value_states.new_empty(*value_states.shape[:2], capacity, value_states.shape[-1])
                grown_k[:, :, : self.length] = self._k[:, :, : self.length]
                grown_v[:, :, : self.length] = self._v[:, :, : self.length]
                self._k, self._v = grown_k, grown_v
            self._k[:, :, self.length : self.length + n] = key_states
            self._v[:, :, self.length : self.length + n] = value_states
            self.length += n
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
            return self.keys, self.values

    cache = DynamicCache()
    cache.layers.extend(GrowingLayer(k, v) for k, v in zip(keys, values, strict=True))
    return cache


class _KVBatch:
    """Rows that run through the model together, sharing one KV cache. Row r's tokens are the cache
    columns [start, end); the rest of its row is padding that the attention mask hides."""

    def __init__(self):
        self.cache = None  # a transformers Cache whose layers hold (R, H, W, d) keys and values
        self.start: list[int] = []
        self.end: list[int] = []
        self.width = 0

    def __len__(self) -> int:
        return len(self.start)

    def _tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        layers = self.cache.layers if self.cache is not None else []
        return [layer.keys for layer in layers], [layer.values for layer in layers]

    def mask(self, device: torch.device) -> torch.Tensor:
        """(R, W) attention mask of the cached columns: 1 on each row's tokens."""
        cols = torch.arange(self.width, device=device)
        start = torch.tensor(self.start, device=device)[:, None]
        end = torch.tensor(self.end, device=device)[:, None]
        return ((cols >= start) & (cols < end)).long()

    def put(self, kvs: list[KV | None]) -> None:
        """Append episodes as new rows, right-aligned at the batch width (widened if one is longer)."""
        lengths = [kv[0][0].shape[1] if kv else 0 for kv in kvs]
        ref = next((kv for kv in kvs if kv), None)
        keys, values = self._tensors()
        if ref is None and not keys:  # nothing cached anywhere yet
            self.start += [0] * len(kvs)
            self.end += [0] * len(kvs)
            return
        if not keys:  # the rows already here cached nothing: give them empty tensors of the right shape
            keys = [k.new_zeros(len(self), k.shape[0], 0, k.shape[2]) for k, _ in ref]
            values = [v.new_zeros(len(self), v.shape[0], 0, v.shape[2]) for _, v in ref]
        width = max([self.width, *lengths])
        pad = width - self.width  # widen the rows already here on the left
        self.start = [s + pad for s in self.start] + [width - n for n in lengths]
        self.end = [e + pad for e in self.end] + [width] * len(kvs)
        new_keys, new_values = [], []
        for layer, (k_old, v_old) in enumerate(zip(keys, values, strict=True)):
            rows, heads, _, dim = k_old.shape
            k = k_old.new_zeros(rows + len(kvs), heads, width, dim)  # (R, H, W, d)
            v = v_old.new_zeros(rows + len(kvs), heads, width, dim)
            k[:rows, :, pad:] = k_old
            v[:rows, :, pad:] = v_old
            for row, (kv, n) in enumerate(zip(kvs, lengths, strict=True), start=rows):
                if n:
                    k[row, :, width - n :] = kv[layer][0]
                    v[row, :, width - n :] = kv[layer][1]
            new_keys.append(k)
            new_values.append(v)
        self.width = width
        self.cache = _growing_cache(new_keys, new_values)

    def take(self, rows: list[int]) -> list[KV | None]:
        """Remove rows from the batch and return their caches (views: copy before keeping them long)."""
        keys, values = self._tensors()
        out: list[KV | None] = []
        for r in rows:
            s, e = self.start[r], self.end[r]
            out.append([(k[r, :, s:e], v[r, :, s:e]) for k, v in zip(keys, values, strict=True)] if e > s else None)
        gone = set(rows)
        keep = [r for r in range(len(self)) if r not in gone]
        if not keep:
            self.__init__()
            return out
        left = min(self.start[r] for r in keep)  # leading columns that are padding in every row left
        self.start = [self.start[r] - left for r in keep]
        self.end = [self.end[r] - left for r in keep]
        self.width -= left
        if keys:
            index = torch.tensor(keep, device=keys[0].device)
            self.cache = _growing_cache([k[index, :, left:] for k in keys], [v[index, :, left:] for v in values])
        return out

    def forward(self, model, input_ids: torch.Tensor, new_mask: torch.Tensor, positions: torch.Tensor):
        """Run (R, N) new tokens after the cached columns; returns the (R, V) logits of the last column.
        The new columns join the cache; the caller moves `end` for the rows whose tokens were real."""
        from transformers.cache_utils import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        attention = torch.cat([self.mask(input_ids.device), new_mask], dim=1)  # (R, W + N)
        if bool(attention.all()):
            attention = None  # no padding anywhere: lets attention use its fused causal kernel
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.width += input_ids.shape[1]
        return out.logits[:, -1]  # (R, V)


# --- the engine -------------------------------------------------------------------------------------


@dataclass
class _Live:
    """Engine-side state of one episode."""

    index: int
    env: EnvLike
    traj: Trajectory
    kv: KV | None = None
    cached: int = 0
    """Tokens of traj.input_ids whose keys and values are in kv (all but the newest while live)."""
    message: list[int] = field(default_factory=list)
    budget: int = 0
    """Tokens the current message may sample."""
    limited: bool = False
    """The budget comes from a length limit of the episode, not from max_new_tokens."""

    def add(self, ids: list[int], sampled: bool = False, logprob: float = 0.0) -> None:
        t = self.traj
        t.input_ids += ids
        t.loss_mask += [int(sampled)] * len(ids)
        t.old_logprobs += [logprob] * len(ids)


class _Engine:
    def __init__(self, policy, cfg: RolloutConfig, temperature: float, generator, logits_hook, stats):
        self.model = policy.model
        self.renderer = policy.renderer
        self.device = policy.device
        self.cfg = cfg
        self.temperature = temperature
        self.generator = generator
        self.logits_hook = logits_hook
        self.stats = stats
        self.last_prompt: list[int] = []  # ids (all but the newest) of the last prompt prefilled...
        self.last_prompt_kv: KV = []  # ...and their cache, for the next prompt's common prefix

    # -- episode bookkeeping -----------------------------------------------------------------------

    def start(self, index: int, env: EnvLike) -> _Live:
        """Reset the environment and lay down the prompt; a prompt over the limits ends it at once."""
        messages, tools = env.reset()
        task_id = str(getattr(getattr(env, "task", None), "id", index))
        traj = Trajectory(task_id, env, [], [], [], 0, False, [dict(m) for m in messages], list(tools))
        live = _Live(index, env, traj)
        ids = self.renderer.prompt_ids(messages, tools)
        room = self.cfg.max_total_tokens - 1 - len(self.renderer.close_ids)
        if len(ids) > self.cfg.max_prompt_tokens or len(ids) > room:
            env.truncate()
            traj.truncated, traj.exact = True, False
            return live
        live.add(ids)
        traj.prompt_len = len(ids)
        self.begin_message(live)
        return live

    def begin_message(self, live: _Live) -> None:
        cfg, t = self.cfg, live.traj
        response_left = cfg.max_response_tokens - t.n_sampled
        total_left = cfg.max_total_tokens - len(t.input_ids) - len(self.renderer.close_ids)
        live.budget = min(cfg.max_new_tokens, response_left, total_left)
        live.limited = min(response_left, total_left) <= cfg.max_new_tokens
        live.message = []
        assert live.budget >= 1, "a message begins only where at least one token fits"

    def end_message(self, live: _Live) -> bool:
        """The model finished (or was cut off in) a message: step the env, lay down what follows.
        Returns True if the episode goes on."""
        r, t, msg = self.renderer, live.traj, live.message
        t.n_messages += 1
        stopped = msg[-1] in r.stop_ids
        if stopped and msg[-1] == r.end_of_turn_id:
            content_ids = env_ids = msg[:-1]
        else:
            # Cut off, or stopped by another end token (kept in the content, so the text still matches):
            # the template's end-of-turn token closes the turn, not sampled.
            content_ids, env_ids = msg, (msg[:-1] if stopped else msg)
            live.add([r.end_of_turn_id])
        content = r.decode(content_ids)
        env_text = content if env_ids is content_ids else r.decode(env_ids)
        t.messages.append({"role": "assistant", "content": content})
        if not stopped and live.limited:  # out of tokens in mid-message
            return self.truncate(live)
        t.n_cut += not stopped
        result = live.env.step(env_text)
        if result.done:
            self.close(live, result.observation)
            return False
        if t.n_sampled >= self.cfg.max_response_tokens:
            return self.truncate(live)
        if not self.append(live, result.observation, generation_prompt=True, room=1 + len(r.close_ids)):
            return self.truncate(live)
        self.begin_message(live)
        return True

    def append(self, live: _Live, new: list[dict], generation_prompt: bool, room: int) -> bool:
        """Lay down the tokens of new messages (and the next generation prompt) if they fit."""
        t = live.traj
        ids, exact = self.renderer.continuation(t.input_ids, t.messages, new, t.tools, generation_prompt)
        if len(t.input_ids) + len(ids) + room > self.cfg.max_total_tokens:
            return False
        live.add(ids)
        t.messages += [dict(m) for m in new]
        t.exact = t.exact and exact
        return True

    def close(self, live: _Live, observation: list[dict]) -> None:
        """End the sequence after the last assistant message (with the final tool results if they fit)."""
        if not (observation and self.append(live, observation, generation_prompt=False, room=0)):
            if not self.append(live, [], generation_prompt=False, room=0):
                live.traj.exact = False
        live.kv = None

    def truncate(self, live: _Live) -> bool:
        live.env.truncate()
        live.traj.truncated = True
        self.close(live, [])
        return False

    # -- model work --------------------------------------------------------------------------------

    def prefill(self, lives: list[_Live]) -> None:
        """Bring each episode's cache up to all but its newest token.

        A new prompt first takes the cache of the previous prompt for their common prefix: episodes are
        admitted in sorted order of their prompt ids, so the G samples of a task share all of it and
        tasks with the same tools share the system prompt (thousands of tokens); only the rest is run.
        Keys and values of a prefix do not depend on what follows it, so nothing changes but the work."""
        prompts = [x for x in lives if x.cached == 0]
        results = sorted((x for x in lives if x.cached > 0), key=lambda x: len(x.traj.input_ids) - x.cached)
        for live in prompts:
            ids = live.traj.input_ids[:-1]
            shared = len(os.path.commonprefix([self.last_prompt, ids]))
            # A short common prefix saves little, and a long prefill after a cache cannot use the fused
            # causal kernel (measured 2x slower on CPU), so only reuse one that covers half the prompt.
            if shared >= len(ids) // 2:
                live.kv = [(k[:, :shared], v[:, :shared]) for k, v in self.last_prompt_kv]
                live.cached = shared
            if live.cached < len(ids):
                # Alone: without padding, attention can use its fused kernel, and a prompt of thousands
                # of tokens keeps the device busy by itself.
                self._prefill_chunk([live])
            self.last_prompt, self.last_prompt_kv = ids, live.kv
        # Tool results and next user turns: batched with others of similar length (at most twice as
        # long, plus a little), so padding stays small.
        chunk: list[_Live] = []
        for live in results:
            n = len(live.traj.input_ids) - 1 - live.cached
            if n == 0:
                continue
            if chunk:
                shortest = len(chunk[0].traj.input_ids) - 1 - chunk[0].cached
                if n * (len(chunk) + 1) > self.cfg.prefill_tokens or n > 2 * shortest + 32:
                    self._prefill_chunk(chunk)
                    chunk = []
            chunk.append(live)
        if chunk:
            self._prefill_chunk(chunk)

    def _prefill_chunk(self, lives: list[_Live]) -> None:
        new = [live.traj.input_ids[live.cached : -1] for live in lives]
        width = max(len(n) for n in new)
        pad = self.renderer.pad_id
        input_ids = torch.tensor([n + [pad] * (width - len(n)) for n in new], device=self.device)  # (R, N)
        new_mask = torch.tensor([[1] * len(n) + [0] * (width - len(n)) for n in new], device=self.device)
        positions = torch.tensor([[live.cached + j for j in range(width)] for live in lives], device=self.device)
        started = time.perf_counter()
        batch = _KVBatch()
        batch.put([live.kv for live in lives])
        before = batch.width
        batch.forward(self.model, input_ids, new_mask, positions)
        # Right padding: each row's new tokens follow its cache directly; the padding after them is dropped.
        batch.end = [before + len(n) for n in new]
        for live, kv, n in zip(lives, batch.take(list(range(len(lives)))), new, strict=True):
            live.kv = [(k.clone(), v.clone()) for k, v in kv]  # own copies, so the batch can be freed
            live.cached += len(n)
        self.stats.forwards += 1
        self.stats.model_tokens += sum(len(n) for n in new)
        self.stats.pad_tokens += sum(width - len(n) for n in new)
        self.stats.prefill_seconds += time.perf_counter() - started

    def decode(self, batch: _KVBatch, rows: list[_Live]) -> list[int]:
        """One token per row per forward until at least one row's message ends; returns those rows."""
        stop_ids = self.renderer.stop_ids
        started = time.perf_counter()
        while True:
            input_ids = torch.tensor([[live.traj.input_ids[-1]] for live in rows], device=self.device)  # (R, 1)
            positions = torch.tensor([[live.cached] for live in rows], device=self.device)
            self.stats.kv_slots += len(rows) * (batch.width + 1)
            self.stats.kv_used += sum(live.cached + 1 for live in rows)
            logits = batch.forward(self.model, input_ids, torch.ones_like(input_ids), positions).float()  # (R, V)
            batch.end = [e + 1 for e in batch.end]
            for live in rows:
                live.cached += 1
            logprobs = torch.log_softmax(logits, dim=-1)  # (R, V)
            if self.logits_hook is not None:
                logits = self.logits_hook([x.index for x in rows], [list(x.message) for x in rows], logits)
            tokens = sample_tokens(logits, self.temperature, self.cfg.top_p, self.generator)  # (R,)
            token_logprobs = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (R,)
            self.stats.forwards += 1
            self.stats.decode_steps += 1
            self.stats.model_tokens += len(rows)
            ended = []
            for row, (live, token, logprob) in enumerate(
                zip(rows, tokens.tolist(), token_logprobs.tolist(), strict=True)
            ):
                live.add([token], sampled=True, logprob=logprob)
                live.message.append(token)
                live.traj.n_sampled += 1
                if token in stop_ids or len(live.message) >= live.budget:
                    ended.append(row)
            if ended:
                self.stats.decode_seconds += time.perf_counter() - started
                return ended

    def run(self, envs: list, progress: bool) -> list[Trajectory]:
        lives = [self.start(i, env) for i, env in enumerate(envs)]
        waiting = [live for live in lives if not live.traj.truncated]
        slots = self.stats.concurrency
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(envs), desc="rollouts", unit="episode")
            bar.update(len(envs) - len(waiting))
        batch, rows, ready = _KVBatch(), [], []
        # Sorted by prompt ids, so prompts with long common prefixes follow each other (see prefill).
        queue = sorted(waiting, key=lambda live: live.traj.input_ids, reverse=True)
        while queue or rows or ready:
            while queue and len(rows) + len(ready) < slots:
                ready.append(queue.pop())
            if ready:
                self.prefill(ready)
                batch.put([live.kv for live in ready])
                for live in ready:
                    live.kv = None  # the batch holds it now
                rows += ready
                ready = []
            ended = self.decode(batch, rows)
            for live, kv in zip([rows[r] for r in ended], batch.take(ended), strict=True):
                live.kv = kv
                if self.end_message(live):
                    ready.append(live)  # its new tokens are prefilled before it decodes again
                elif bar is not None:
                    bar.update(1)
            gone = set(ended)
            rows = [live for r, live in enumerate(rows) if r not in gone]
        if bar is not None:
            bar.close()
        return [live.traj for live in lives]


def _check_cache_layout(model) -> None:
    lm = _causal_lm(model)
    forwards = [type(m).forward for m in (lm, getattr(lm, "model", None)) if m is not None]
    if any("unsloth" in (getattr(f, "__module__", "") or "") for f in forwards):
        raise ConfigError(
            "model.backend: unsloth's patched forward returns a new KV cache instead of growing the one the "
            "rollout engine passes; use model.backend=hf (bitsandbytes 4-bit + peft) for now"
        )
    config = lm.config
    types = getattr(config.get_text_config(), "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        raise ConfigError(
            f"model.name: layer types {sorted(set(types))} are not supported by the rollout engine, which "
            "keeps one full-attention KV cache per layer (Llama / Qwen2 / SmolLM style models)"
        )


@torch.no_grad()
def run_rollouts(
    policy,
    envs: list,
    cfg_rollout: RolloutConfig,
    temperature: float,
    generator: torch.Generator | None = None,
    progress: bool = False,
    stats: RolloutStats | None = None,
    logits_hook: LogitsHook | None = None,
) -> list[Trajectory]:
    """Run every episode to its end with the policy; trajectories come back in the order of envs.

    Sampling follows temperature (0 = greedy) and cfg_rollout.top_p, drawing from `generator` (or the
    global torch generator), so the same seed and settings give the same rollouts."""
    _check_cache_layout(policy.model)
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("an episode object appears more than once in envs; make one per rollout")
    stats = stats if stats is not None else RolloutStats()
    stats.concurrency = concurrency(policy, cfg_rollout, len(envs))
    was_training = policy.model.training
    policy.model.eval()  # no dropout while sampling; gradient checkpointing is off outside training
    started = time.perf_counter()
    try:
        trajectories = _Engine(policy, cfg_rollout, temperature, generator, logits_hook, stats).run(envs, progress)
    finally:
        policy.model.train(was_training)
    stats.seconds += time.perf_counter() - started
    stats.episodes += len(trajectories)
    stats.sampled_tokens += sum(t.n_sampled for t in trajectories)
    stats.sequence_tokens += sum(len(t.input_ids) for t in trajectories)
    return trajectories


def rendered_text(policy, trajectory: Trajectory) -> str:
    """The chat template's rendering of a trajectory's messages: what decode(input_ids) must equal."""
    return policy.render(trajectory.messages, trajectory.tools)
