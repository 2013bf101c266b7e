"""One episode, played the plain way: the spec of what an episode's tokens, loss_mask and old log-probs are.

No batch, no KV cache, no padding: every sampled token comes from one forward over the whole sequence so
far. The batched engine (seal_mini.engine.rollout, with its bookkeeping in seal_mini.engine.sequences)
must give exactly this Trajectory: the same tokens, loss_mask and messages, the same old log-probs up to
float rounding (tests/test_reference.py, tests/test_backbones.py). The rules are written out again here on purpose, so that test
checks the engine's bookkeeping as well as its model work. Only what must be shared is shared: the chat
renderer, the sampler and the episode's random stream. It is slow (one full forward per token): read
it, test against it, never train with it.
"""

from __future__ import annotations

import torch

from seal_mini.config import RolloutConfig
from seal_mini.engine.sequences import (
    EnvLike,
    LogitsHook,
    Trajectory,
    episode_seed,
    mark_turn,
    sample_tokens,
    scored_temperature,
    task_id,
)


@torch.no_grad()
def reference_rollout(
    policy,
    env: EnvLike,
    cfg: RolloutConfig,
    temperature: float,
    seed: int | tuple[int, ...] = 0,
    sample: int = 0,
    index: int = 0,
    logits_hook: LogitsHook | None = None,
) -> Trajectory:
    """Play one episode to its end, one full forward per sampled token. `seed` and `sample` pick its random
    stream as in run_rollouts; `index` is its place in run_rollouts' list (its hook row and default id)."""
    r, model = policy.renderer, policy.model
    messages, tools = env.reset()
    t = Trajectory(task_id(env, index), env, [], [], [], 0, False, [dict(m) for m in messages], list(tools))
    stream = torch.Generator().manual_seed(episode_seed(seed, t.task_id, sample))
    closing = len(r.close_ids)  # the template's tokens after the last message: room is always kept for them

    def lay(ids: list[int], sampled: bool = False, logprob: float = 0.0) -> None:
        t.input_ids += ids
        t.loss_mask += [int(sampled)] * len(ids)  # 1 only on what the model sampled
        t.old_logprobs += [logprob] * len(ids)

    def follow(new: list[dict], generation_prompt: bool, room: int) -> bool:
        """Lay down the template's tokens for new messages if they fit with `room` tokens to spare; a new
        segment with BFCL's prompt where its history writes the conversation otherwise than it is spelled."""
        ids, exact = r.continuation(t.input_ids[t.base :], t.messages, new, t.tools, generation_prompt)
        if not exact and generation_prompt and r.bfcl:
            ids, exact = r.prompt_ids(t.messages + new, t.tools), True
            if len(ids) + room > cfg.max_total_tokens:
                return False
            t.segments.append(len(t.input_ids))
        elif len(t.input_ids) - t.base + len(ids) + room > cfg.max_total_tokens:
            return False
        lay(ids)
        t.messages += [dict(m) for m in new]
        t.exact = t.exact and (exact or (r.bfcl and not generation_prompt))  # BFCL writes nothing after the end
        return True

    def finish(observation: list[dict], truncated: bool) -> Trajectory:
        if truncated:  # a length limit ended it: the env is told
            env.truncate()
            t.truncated = True
        # the final tool results if they fit, else only the template's closing tokens
        if not (observation and follow(observation, False, 0)) and not follow([], False, 0):
            t.exact = False
        return t

    prompt = r.prompt_ids(messages, tools)
    if len(prompt) > min(cfg.max_prompt_tokens, cfg.max_total_tokens - 1 - closing):  # not one token would fit
        env.truncate()
        t.truncated, t.exact = True, False
        return t
    lay(prompt)
    t.prompt_len = len(prompt)
    was_training = model.training
    model.eval()
    try:
        while True:  # one assistant message per pass
            response_left = cfg.max_response_tokens - t.n_sampled
            total_left = cfg.max_total_tokens - (len(t.input_ids) - t.base) - closing
            budget = min(cfg.max_new_tokens, response_left, total_left)
            message: list[int] = []
            start = len(t.input_ids)
            mark_turn(t, env, start)
            while True:
                ids = torch.tensor([t.input_ids[t.base :]], device=policy.device)  # (1, T): the segment so far
                logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].float()  # (1, V)
                # old log-probs: the distribution the sampler draws from (logits / T, before the hook and top-p)
                logprobs = torch.log_softmax(logits / scored_temperature(temperature), dim=-1)
                if logits_hook is not None:  # steers sampling only
                    logits = logits_hook([index], [list(message)], logits)
                uniforms = torch.rand(1, generator=stream) if temperature > 0 else None  # one draw per token
                token = int(sample_tokens(logits, temperature, cfg.top_p, uniforms=uniforms)[0])
                lay([token], sampled=True, logprob=logprobs[0, token].item())
                message.append(token)
                t.n_sampled += 1
                if token in r.stop_ids or len(message) >= budget:
                    break
            t.n_messages += 1
            stopped = message[-1] in r.stop_ids
            ended_turn = message[-1] == r.end_of_turn_id  # the template's own end of turn, sampled
            if not ended_turn:  # cut, or stopped by another end token: the end of turn closes it, not sampled
                lay([r.end_of_turn_id])
            t.messages.append({"role": "assistant", "content": r.decode(message[:-1] if ended_turn else message)})
            if not stopped and min(response_left, total_left) <= cfg.max_new_tokens:  # a length limit cut it
                return finish([], truncated=True)
            t.n_cut += not stopped  # cut at max_new_tokens: the env still gets the text
            result = env.step(r.decode(message[:-1] if stopped else message))  # the env never sees an end token
            if getattr(result, "retried", False):  # an unreadable message the interface forgave: out of the loss
                end = start + len(message)
                t.loss_mask[start:end] = [0] * (end - start)
                t.old_logprobs[start:end] = [0.0] * (end - start)
            if result.done:
                return finish(result.observation, truncated=False)
            if t.n_sampled >= cfg.max_response_tokens or not follow(result.observation, True, 1 + closing):
                return finish([], truncated=True)
    finally:
        model.train(was_training)
