"""Backbones beyond the recipes' Qwen2.5 and Llama through the same engine, as tiny random models built from
their configs (tests/conftest.py: TINY_SHAPES): Qwen3 (query / key norms, a head_dim wider than hidden /
heads) and Qwen3.5's hybrid text model (three gated delta-net layers with recurrent and conv states, then one
full-attention layer). For each, the rollout engine must give the tokens `model.generate` gives and the plain
loop's (seal_mini.engine.reference) at 1, 3 and 8 episodes at once and when sampled groups share their
prompt, hold its cache within its budget, and the update's log-probs must be a plain forward's. Training
takes steps and resumes bit-exact on both (tests/test_train.py: test_resume_is_exact)."""

import dataclasses

import pytest
import torch
from conftest import TINY_SHAPES
from reference import reference_rollout

from seal_mini.config import load_config
from seal_mini.engine.logprobs import right_pad, token_logprobs
from seal_mini.engine.policy import load_policy
from seal_mini.engine.rollout import RolloutStats, kv_bytes_per_token, run_rollouts, slot_bytes, state_bytes_per_slot
from seal_mini.engine.sequences import sample_numbers, task_id
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode

TASKS = list(tasks_by_id(["base"]).values())[:8]
CLASSES = {"qwen3": "Qwen3ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM"}


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def backbone(request, tiny_backbone):
    """(kind, policy, config, the first three tasks' episodes through the plain loop, greedy: one full forward
    per token of a BFCL prompt is slow, so the rest are held against `model.generate` only)."""
    kind = request.param
    cfg = load_config(None, [f"model.name={tiny_backbone(kind)}", "device=cpu", "model.tool_format=bfcl"])
    cfg.rollout = dataclasses.replace(cfg.rollout, max_new_tokens=12, max_response_tokens=30)
    policy = load_policy(cfg, banner=False)
    plain = [reference_rollout(policy, Episode(task), cfg.rollout, 0.0, 0) for task in TASKS[:3]]
    return kind, policy, cfg, plain


def assert_plain_forward(policy, trajs, temperature: float = 1.0):
    """Every sampled token's old log-prob is what one plain forward over the finished sequence gives it: the
    cache each token was sampled from held exactly the tokens before it (random tiny models repeat a few
    tokens when greedy, so equal tokens alone would say little)."""
    for t in trajs:
        for a, b in t.spans():  # each segment a sequence of its own
            ids = torch.tensor([t.input_ids[a:b]])
            mask = torch.tensor([t.loss_mask[a:b]], dtype=torch.float32)
            with torch.no_grad():
                plain = token_logprobs(policy.model, ids, torch.ones_like(ids), mask, 256, temperature)[0]
            sampled = mask[0].bool()
            gap = float((plain[sampled] - torch.tensor(t.old_logprobs[a:b])[sampled]).abs().max())
            assert gap < 1e-5, f"{t.task_id}: old log-probs differ from a plain forward's by {gap:.1e}"


def assert_generates_first_message(policy, traj):
    """`model.generate`, greedy from the episode's prompt, writes the engine's first message."""
    first = traj.input_ids[traj.prompt_len :][: traj.loss_mask[traj.prompt_len :].index(0)]
    prompt = torch.tensor([traj.input_ids[: traj.prompt_len]])
    with torch.no_grad():
        out = policy.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=len(first),
            do_sample=False,
            eos_token_id=list(policy.renderer.stop_ids),
        )
    assert out[0, traj.prompt_len :].tolist() == first, traj.task_id


def assert_same(trajs, plain):
    for traj, ref in zip(trajs, plain, strict=True):
        assert traj.input_ids == ref.input_ids and traj.turn_starts == ref.turn_starts, traj.task_id
        assert traj.segments == ref.segments and traj.exact and ref.exact, traj.task_id
        gap = max(abs(a - b) for a, b in zip(traj.old_logprobs, ref.old_logprobs, strict=True))
        assert gap < 1e-5, f"{traj.task_id}: old log-probs differ by {gap:.1e}"


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_engine_gives_generates_tokens_and_the_plain_loops(backbone, n):
    kind, policy, cfg, plain = backbone
    assert type(policy.model.get_base_model()).__name__ == CLASSES[kind]
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS[:n]], cfg.rollout, 0.0, 0)
    assert_same(trajs[:3], plain[:n])
    assert_plain_forward(policy, trajs)
    for traj in trajs:
        assert_generates_first_message(policy, traj)
    assert sum(t.n_messages for t in trajs) > n  # episodes went on past their first message


def test_sampled_groups_share_their_prompt_and_still_draw_the_plain_loops_tokens(backbone):
    """Samples of one task share their prompt's prefill (for Qwen3.5 its linear layers' states too); three
    slots for four episodes, so an episode also moves into a freed slot."""
    kind, policy, cfg, _ = backbone
    envs = lambda: [Episode(TASKS[k]) for k in (0, 0, 1, 1)]  # noqa: E731
    stats = RolloutStats()
    batched = run_rollouts(policy, envs(), dataclasses.replace(cfg.rollout, max_concurrent=3), 1.0, 5, stats=stats)
    fresh = envs()
    samples = sample_numbers([task_id(env, i) for i, env in enumerate(fresh)])
    plain = [reference_rollout(policy, env, cfg.rollout, 1.0, 5, samples[i], i) for i, env in enumerate(fresh)]
    assert_same(batched, plain)
    assert_plain_forward(policy, batched)
    saved = stats.summary()["sequence_tokens"] - stats.model_tokens
    assert saved > min(t.prompt_len for t in batched) // 2  # a prompt was shared, not run again


class Thinking:
    """Logits hook: every message begins with a reasoning block, then the model samples freely (its text
    decodes to no call, so each message ends its user turn)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def __call__(self, rows, sampled_so_far, logits):
        logits = logits.clone()
        for row, so_far in enumerate(sampled_so_far):
            if len(so_far) < len(self.ids):
                logits[row] = float("-inf")
                logits[row, self.ids[len(so_far)]] = 0.0
        return logits


def assert_prompts_are_bfcls(policy, t):
    """Each segment begins with the prompt BFCL's handler writes for the conversation up to its first message."""
    assistant = [i for i, m in enumerate(t.messages) if m["role"] == "assistant"]
    mask = t.loss_mask
    for a, b in t.spans():
        first = a + mask[a:b].index(1)
        before = sum(1 for p in range(first) if mask[p] and not (p and mask[p - 1]))  # messages sampled before it
        assert t.input_ids[a:first] == policy.renderer.prompt_ids(t.messages[: assistant[before]], t.tools), t.task_id


def test_a_thinking_models_next_user_turn_starts_from_bfcls_prompt(backbone, n=2):
    """A thinking model's reasoning stays in BFCL's prompts until the next user turn; then BFCL writes the
    earlier messages without it. The engine goes on in a new segment from that prompt (Qwen3 keeping the keys
    and values of the prefix the segments share, Qwen3.5 prefilling it whole), as the plain loop does."""
    kind, policy, cfg, _ = backbone
    think = Thinking(policy.renderer.encode("<think>\nPlan the call.\n</think>\n\n"))
    rollout = dataclasses.replace(cfg.rollout, max_new_tokens=len(think.ids) + 4, max_response_tokens=200)
    stats = RolloutStats()
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS[:n]], rollout, 1.0, 2, logits_hook=think, stats=stats)
    plain = [
        reference_rollout(policy, Episode(t), rollout, 1.0, 2, 0, i, logits_hook=think) for i, t in enumerate(TASKS[:n])
    ]
    assert_same(trajs, plain)
    assert_plain_forward(policy, trajs)
    for t in trajs:
        assert len(t.segments) == len(t.turn_starts) - 1 >= 2, t.task_id  # one a user turn after the first
        assert_prompts_are_bfcls(policy, t)
    saved = stats.summary()["sequence_tokens"] - stats.model_tokens  # tokens laid down but not run again
    assert (saved > sum(len(t.segments) for t in trajs) * trajs[0].prompt_len // 2) == (kind == "qwen3")


def test_results_longer_than_a_prefill_piece_are_prefilled_whole(backbone):
    """rollout.prefill_tokens below a tool result's length (an out-of-memory retry halves it down to 256):
    the result runs in pieces and the next message is sampled after all of it, as in the plain loop."""
    kind, policy, cfg, plain = backbone
    rollout = dataclasses.replace(cfg.rollout, prefill_tokens=16)
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS[:2]], rollout, 0.0, 0)
    assert_same(trajs, plain[:2])
    sampled = run_rollouts(policy, [Episode(t) for t in TASKS[:2]], rollout, 1.0, 3)
    assert_plain_forward(policy, sampled)
    assert all(t.n_messages > 1 for t in sampled)  # results came back and were prefilled


def test_the_cache_holds_keys_and_values_of_full_attention_layers_and_states_of_linear_ones(backbone):
    kind, policy, cfg, _ = backbone
    shape = TINY_SHAPES[kind]
    config = policy.model.get_base_model().config
    full = (shape.get("layer_types") or ["full_attention"] * shape["num_hidden_layers"]).count("full_attention")
    assert kv_bytes_per_token(config, policy.dtype) == full * shape["num_key_value_heads"] * shape["head_dim"] * 2 * 4
    if kind == "qwen3_5":  # 3 layers x (conv: (2 x 2 x 16 + 4 x 16) channels x 4, fp32; recurrent 4 x 16 x 16, fp32)
        assert state_bytes_per_slot(config, policy.dtype) == 3 * (128 * 4 * 4 + 4 * 16 * 16 * 4)
    else:
        assert state_bytes_per_slot(config, policy.dtype) == 0
    budget = 3 * slot_bytes(config, policy.dtype, cfg.rollout.max_total_tokens)  # three slots
    rollout = dataclasses.replace(cfg.rollout, kv_budget_gb=budget / 2**30)
    stats = RolloutStats()
    trajs = run_rollouts(policy, [Episode(t) for t in TASKS], rollout, 1.0, 0, stats=stats)
    assert stats.concurrency == 3 and stats.kv_cache_bytes <= budget and all(t.env.done for t in trajs)


def test_the_updates_log_probs_are_a_plain_forwards(backbone):
    """A right-padded batch of episodes of different lengths, as the update runs it, against each alone."""
    kind, policy, cfg, plain = backbone
    trajs = sorted(plain[:3], key=lambda t: len(t.input_ids))
    assert len({len(t.input_ids) for t in trajs}) > 1  # padding is there to get wrong
    ids = right_pad([t.input_ids for t in trajs], torch.long)
    attention = right_pad([[1] * len(t.input_ids) for t in trajs], torch.long)
    mask = right_pad([t.loss_mask for t in trajs], torch.float32)
    with torch.no_grad():
        batched = token_logprobs(policy.model, ids, attention, mask, 64, 1.0)
        gap = 0.0
        for row, t in enumerate(trajs):
            n = len(t.input_ids)
            one = ids[row : row + 1, :n]
            alone = token_logprobs(policy.model, one, torch.ones_like(one), mask[row : row + 1, :n], 64, 1.0)
            gap = max(gap, float((batched[row, :n] - alone[0]).abs().max()))
            sampled = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert torch.allclose(alone[0][sampled], torch.tensor(t.old_logprobs)[sampled], atol=1e-5)
    print(f"{kind}: largest |batched - alone| log-prob gap {gap:.1e}")
    assert gap < 1e-5


def test_qwen3_5_in_4_bit_with_lora_on_its_linear_layers(tiny_backbone):
    """As recipes/qwen3_5_4b.yaml loads it (bitsandbytes' 4-bit, here its CPU backend): every projection of
    the linear layers is 4-bit with an adapter, the conv and the decay parameters stay as they are, and the
    engine still gives `model.generate`'s greedy tokens."""
    targets = load_config("recipes/qwen3_5_4b.yaml").lora.target_modules
    cfg = load_config(
        None,
        [f"model.name={tiny_backbone('qwen3_5')}", "device=cpu", "model.tool_format=bfcl", "model.cpu_4bit=true"]
        + [f"lora.target_modules={targets}", "rollout.max_new_tokens=8", "rollout.max_response_tokens=8"],
    )
    policy = load_policy(cfg, banner=False)
    linear = policy.model.get_base_model().model.layers[0].linear_attn
    for name in ("in_proj_qkv", "in_proj_z", "out_proj"):
        layer = getattr(linear, name)
        assert type(layer.base_layer).__name__ == "Linear4bit" and "default" in layer.lora_A, name
    assert type(linear.conv1d).__name__ == "Conv1d" and not linear.A_log.requires_grad
    traj = run_rollouts(policy, [Episode(TASKS[0])], cfg.rollout, 0.0, 0)[0]
    assert_generates_first_message(policy, traj)
    assert_plain_forward(policy, [traj])


def test_layers_the_engine_cannot_hold_are_refused_in_one_line(tmp_path):
    """Sliding-window attention, or another kind of linear layer than Qwen3.5's, is a ConfigError naming it."""
    from seal_mini.checks.preflight import write_random_model
    from seal_mini.config import ConfigError
    from seal_mini.engine.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    shape = {**TINY_SHAPES["qwen3"], "vocab_size": len(tokenizer), "use_sliding_window": True, "sliding_window": 64}
    shape["layer_types"] = ["sliding_attention", "full_attention"]
    write_random_model(shape, tmp_path, tokenizer, torch.device("cpu"))
    policy = load_policy(load_config(None, [f"model.name={tmp_path}", "device=cpu"]), banner=False)
    with pytest.raises(ConfigError, match=r"layer types \['full_attention', 'sliding_attention'\] .* not supported"):
        run_rollouts(policy, [Episode(TASKS[0])], load_config(None, []).rollout, 0.0, 0)
