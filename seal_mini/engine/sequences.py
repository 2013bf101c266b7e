"""One episode's token sequence: what the model saw and sampled, with its loss_mask and old log-probs.

Each episode is one growing token sequence:
  prompt (system, tools, first user turn, start of the assistant turn)   loss_mask 0
  the assistant's tokens, verbatim as sampled (never decoded and re-encoded),
    with their sampling-time log-probs                                   loss_mask 1
  whatever the chat template puts next: the end of the turn if the message was cut, tool results,
    the next user turn, the start of the next assistant turn             loss_mask 0
What follows a message is the template's rendering of the longer conversation beyond the text the sequence
already spells (ChatRenderer.continuation), so a finished sequence decodes to the episode's rendering.

BFCL's handlers write every prompt anew from their chat history, which keeps a message as the handler read
it (a thinking model's reasoning only until the next user turn, calls re-written from their JSON). Where
that history no longer spells the tokens sampled, the episode goes on in a new segment (Trajectory.segments)
that starts from the prompt BFCL writes, so every prompt the model answers is BFCL's. Each segment is a
sequence of its own for the model (positions from 0) and a row of its own in the update.

The length limits (rollout.*). A prompt over max_prompt_tokens, or without room for one token under
max_total_tokens (which bounds each segment), gives an empty, truncated trajectory. A message cut at
max_new_tokens gets the template's end-of-turn token (loss_mask 0) and goes to the environment as it is
(n_cut). A message cut sooner by max_response_tokens (the episode's sampled tokens) or max_total_tokens
ends the episode (truncated), as do reaching max_response_tokens at the end of a message and an answer
that leaves no room for one more token. Room for the template's closing tokens is always kept. An
environment that raises on a message (a defect) ends that episode truncated, with a warning, so one
message never ends a training run.

No model runs here: seal_mini.engine.rollout runs it for many episodes at once and calls `Sequences`, and
tests/reference.py spells the same rules out for one episode. Each episode samples from its own random
stream (`episode_seed`), so both sample the same tokens.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from seal_mini.config import RolloutConfig


class EnvLike(Protocol):
    """What the engine needs from an episode (seal_mini.envs.episode.Episode and interface wrappers fit)."""

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
    """Log-prob of each sampled token, when it was sampled, under the distribution the sampler drew from:
    softmax(logits / temperature), before top-p (`scored_temperature`); 0.0 where loss_mask is 0."""
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
    """decode(the last segment) == render(messages); under BFCL's handlers, which write prompts only: every
    prompt laid down is BFCL's (the closing tokens after the last message need not be its text). False only
    when the template rewrites an assistant message (e.g. strips whitespace) or the first prompt alone was
    over the limit (no tokens at all)."""
    turn_starts: list[int] = field(default_factory=list)
    """Where the first assistant message of each task turn played begins: turn k's sampled tokens lie
    from turn_starts[k] to the next start (the env's `turn_index`; all turn 0 for an env without one)."""
    segments: list[int] = field(default_factory=list)
    """Where each segment after the first begins in input_ids: a prompt BFCL wrote anew (module docstring)."""

    @property
    def base(self) -> int:
        """Where the current (last) segment begins."""
        return self.segments[-1] if self.segments else 0

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) of each segment: the sequences the model saw, each a row of the update."""
        starts = [0, *self.segments]
        return list(zip(starts, [*self.segments, len(self.input_ids)], strict=True))


LogitsHook = Callable[[list[int], list[list[int]], torch.Tensor], torch.Tensor]
"""(env index of each row, ids sampled so far in each row's message, logits (R, V)) -> logits to sample
from. Only sampling sees the result; old_logprobs always come from the model's own logits."""


def scored_temperature(temperature: float) -> float:
    """The temperature whose distribution old and new log-probs score: the sampler's, as TRL and verl do
    (logits / T), so the clipped ratio is that of the policy that drew the tokens; greedy decoding (0)
    scores the model's own distribution (1). Top-p is not part of it (neither library counts it)."""
    return temperature if temperature > 0 else 1.0


# --- sampling (pure) --------------------------------------------------------------------------------


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """(R, V) logits -> (R,) token ids. Temperature 0 is greedy; top_p < 1 keeps the smallest set of
    tokens whose probability reaches top_p. Row r uses uniforms[r] if given, else a draw from `generator`."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (R, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # Inverse-CDF sampling: one uniform per row (a CPU generator gives the same draws on any device) moves
    # to the logits' device, so the (R, V) probabilities never leave the GPU.
    if uniforms is None:
        uniforms = torch.rand(
            probs.shape[0], generator=generator, device=generator.device if generator else probs.device
        )
    assert uniforms.shape == (probs.shape[0],), f"need one uniform per row, got {tuple(uniforms.shape)}"
    cdf = probs.double().cumsum(dim=-1)  # (R, V), float64 so the tail of a large vocabulary keeps its mass
    target = uniforms.to(probs.device, torch.float64)[:, None] * cdf[:, -1:]  # (R, 1)
    # right=True: the first token whose cumulative mass exceeds the target, which has mass > 0
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # (R,)
    return tokens.clamp(max=probs.shape[-1] - 1)


def sample_numbers(task_ids: list[str]) -> list[int]:
    """For each episode, how many episodes of the same task come before it: the `sample` of its stream."""
    seen: dict[str, int] = {}
    out = []
    for task in task_ids:
        seen[task] = seen.get(task, -1) + 1
        out.append(seen[task])
    return out


def episode_seed(seed: int | tuple[int, ...], task_id: str, sample: int) -> int:
    """The seed of one episode's random stream: a hash of (seed..., task id, sample number), so the
    stream is the same whichever episodes run beside it, in whatever order."""
    key = "/".join(str(s) for s in (*(seed if isinstance(seed, tuple) else (seed,)), task_id, sample))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def mark_turn(t: Trajectory, env: EnvLike, start: int) -> None:
    """A message begins at `start`: if it is the first of a task turn, record where (Trajectory.turn_starts)."""
    while len(t.turn_starts) <= getattr(env, "turn_index", 0):
        t.turn_starts.append(start)


def task_id(env, index: int) -> str:
    """The id of an episode's task (`#index` for an environment without one)."""
    task = getattr(env, "task", None)
    return str(getattr(task, "id", None) or f"#{index}")


# --- one episode's sequence ---------------------------------------------------------------------------


@dataclass
class LiveEpisode:
    """One episode while it runs: its trajectory so far and the message being sampled."""

    index: int
    """Its place in the list of episodes of the call."""
    env: EnvLike
    traj: Trajectory
    generator: torch.Generator
    """The episode's own random stream."""
    message: list[int] = field(default_factory=list)
    start: int = 0
    """Where the current message's first token lies in the sequence."""
    kept: int | None = None
    """After a new segment began: how many of its first tokens the last segment had too (their keys and
    values stay valid; the engine resets this once it has read it)."""
    budget: int = 0
    """Tokens the current message may sample."""
    limited: bool = False
    """The budget comes from a length limit of the episode, not from max_new_tokens."""

    def add(self, ids: list[int], sampled: bool = False, logprob: float = 0.0) -> None:
        """Append tokens with their loss_mask (1 if sampled) and old log-prob (0.0 unless sampled)."""
        t = self.traj
        t.input_ids += ids
        t.loss_mask += [int(sampled)] * len(ids)
        t.old_logprobs += [logprob] * len(ids)


class Sequences:
    """Lays down an episode's tokens: the prompt, what the model samples, what the environment answers,
    within the length limits. Knows the renderer and the environment, never the model."""

    def __init__(self, renderer, cfg: RolloutConfig):
        self.renderer, self.cfg = renderer, cfg

    def start(self, index: int, env: EnvLike, seed: int, kind: type[LiveEpisode] = LiveEpisode) -> LiveEpisode:
        """Reset the environment and lay down the prompt; a prompt over the limits ends it at once.
        `kind` is the class of the returned state (the batched engine adds its cache slot to it)."""
        messages, tools = env.reset()
        traj = Trajectory(task_id(env, index), env, [], [], [], 0, False, [dict(m) for m in messages], list(tools))
        live = kind(index, env, traj, torch.Generator().manual_seed(seed))
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

    def begin_message(self, live: LiveEpisode) -> None:
        """Start a new message: it may sample up to max_new_tokens, fewer if a length limit is nearer."""
        cfg, t = self.cfg, live.traj
        response_left = cfg.max_response_tokens - t.n_sampled
        total_left = cfg.max_total_tokens - (len(t.input_ids) - t.base) - len(self.renderer.close_ids)
        live.budget = min(cfg.max_new_tokens, response_left, total_left)
        live.limited = min(response_left, total_left) <= cfg.max_new_tokens
        live.message, live.start = [], len(t.input_ids)
        mark_turn(t, live.env, live.start)
        assert live.budget >= 1, "a message begins only where at least one token fits"

    def sampled(self, live: LiveEpisode, token: int, logprob: float) -> bool:
        """Add one sampled token; True if it ends the message."""
        live.add([token], sampled=True, logprob=logprob)
        live.message.append(token)
        live.traj.n_sampled += 1
        return token in self.renderer.stop_ids or len(live.message) >= live.budget

    def end_message(self, live: LiveEpisode) -> bool:
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
        try:
            result = live.env.step(env_text)
        except Exception as e:  # noqa: BLE001 - a defect an episode's message exposed ends that episode, not the run
            print(
                f"[rollout] warning: {t.task_id}: the environment raised {type(e).__name__} ({str(e)[:200]}) on a "
                "message; the episode ends there, truncated",
                file=sys.stderr,
                flush=True,
            )
            return self.truncate(live)
        if getattr(result, "retried", False):
            self.forgive(live)
        if result.done:
            self.close(live, result.observation)
            return False
        if t.n_sampled >= self.cfg.max_response_tokens:
            return self.truncate(live)
        if not self.append(live, result.observation, generation_prompt=True, room=1 + len(r.close_ids)):
            return self.truncate(live)
        self.begin_message(live)
        return True

    @staticmethod
    def forgive(live: LiveEpisode) -> None:
        """The training interface let the model retry an unreadable message (interface.parse_retry): the
        message stays in the sequence (the model saw it) but out of the loss. Its episode's reward says
        nothing about it: the bare benchmark would have ended the turn there, so a success must not
        reinforce it; the retry is the interface's gift, not the policy's doing."""
        t, end = live.traj, live.start + len(live.message)
        t.loss_mask[live.start : end] = [0] * (end - live.start)
        t.old_logprobs[live.start : end] = [0.0] * (end - live.start)

    def append(self, live: LiveEpisode, new: list[dict], generation_prompt: bool, room: int) -> bool:
        """Lay down the tokens of new messages (and the next generation prompt) if they fit; where BFCL
        would write the next prompt otherwise than the sequence spells it, a new segment with its prompt."""
        t, r = live.traj, self.renderer
        anew = r.bfcl and generation_prompt  # the text may go into a new segment, which starts empty
        left = self.cfg.max_total_tokens - (0 if anew else len(t.input_ids) - t.base) - room
        if sum(len(str(m.get("content") or "")) for m in new) > left * r.max_token_chars:
            return False  # too long to fit, whatever its tokens: a tool's 10 MB output is not tokenized (20 s)
        ids, exact = r.continuation(t.input_ids[t.base :], t.messages, new, t.tools, generation_prompt)
        if not exact and anew:
            ids = r.prompt_ids(t.messages + new, t.tools)
            if len(ids) + room > self.cfg.max_total_tokens:
                return False
            live.kept = len(os.path.commonprefix([t.input_ids[t.base :], ids]))
            t.segments.append(len(t.input_ids))
            exact = True
        elif len(t.input_ids) - t.base + len(ids) + room > self.cfg.max_total_tokens:
            return False
        live.add(ids)
        t.messages += [dict(m) for m in new]
        t.exact = t.exact and (exact or (r.bfcl and not generation_prompt))  # BFCL writes nothing after the end
        return True

    def close(self, live: LiveEpisode, observation: list[dict]) -> None:
        """End the sequence after the last assistant message (with the final tool results if they fit)."""
        if not (observation and self.append(live, observation, generation_prompt=False, room=0)):
            if not self.append(live, [], generation_prompt=False, room=0):
                live.traj.exact = False

    def truncate(self, live: LiveEpisode) -> bool:
        """A length limit ends the episode: the env is told, the sequence closed. Returns False (it ends)."""
        live.env.truncate()
        live.traj.truncated = True
        self.close(live, [])
        return False
