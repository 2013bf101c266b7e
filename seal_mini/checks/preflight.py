"""`python -m seal_mini preflight RECIPE [k=v ...] [--gpu-mem-gb N]`: will a recipe fit, and how long will it take?

No download. The recipe's architecture (the shapes of the models the recipes name, model.name's own
config.json when it is a local folder, or the sizes of the kit's own tiny-random and scratch models) is
built with random weights, saved to a temporary folder and loaded by `load_policy`, so it is quantized and
wrapped with LoRA exactly as training loads it: the same memory and the same speed, with meaningless
outputs. Then it runs the kit's own code:
  1. rollouts: one wave of synthetic episodes through `run_rollouts` at the recipe's lengths: prompts of
     3.7-4.9k tokens (BFCL's median to longest with the Qwen2.5 tokenizer; for the kit's own models, the
     lengths of the recipe's own tasks), messages of max_new_tokens (sampling is kept off the stop tokens),
     typical tool results; one group of G episodes is answered with long tool results until it reaches
     max_total_tokens, as long_context tasks do;
  2. update: one micro-batch through the real `update` (reference pass, forward, backward, optimizer
     step) at a typical length and at max_total_tokens.
It prints, per phase, peak allocated and reserved GPU memory, slots, prefill and decode tokens/s and
update tokens/s, then the projected time of a step, of the run and of the held-in evaluation. The last
line is one JSON object. Exit code 1, naming the setting to lower, when the recipe does not fit: an
out-of-memory error at the recipe's own settings (training would survive it by shrinking, more slowly),
or one even at the smallest settings.

`--gpu-mem-gb N` caps the process at N GB (a per-process memory fraction; the automatic KV budget counts
within it), so a larger card stands in for a 16 or 24 GB one. On CPU a pretrained model's recipe runs at a
shrunk scale (2 layers, lengths / 16): a check of the plumbing, not of the recipe; the kit's own CPU models
(tiny-random, scratch) run at the recipe's own scale, so their projection is the recipe's.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import torch

from seal_mini.config import Config, ConfigError, load_config
from seal_mini.engine.device import cap_memory, peak_memory, reset_peak, resolve_device
from seal_mini.engine.logprobs import causal_lm
from seal_mini.engine.policy import SCRATCH, TINY
from seal_mini.engine.render import SPECIAL_TOKENS
from seal_mini.engine.scratch import CHAT_TEMPLATE, random_model
from seal_mini.engine.tiny import tiny_model, tiny_tokenizer
from seal_mini.envs.bfcl import load_tasks, tool_docs
from seal_mini.envs.episode import Episode
from seal_mini.envs.harness import PROTOCOLS
from seal_mini.envs.scripted import POLICIES, play
from seal_mini.envs.splits import load_split, tasks_for
from seal_mini.runio import read_json

# The shapes of the backbones the recipes name (their config.json, weights left out): a family's settings,
# then each model's sizes. ToolACE-2-8B is a fine-tune of Llama-3.1-8B-Instruct and keeps its shapes.
SIZE_KEYS = "hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads vocab_size".split()


def _shape(family: dict, *sizes: int, **more) -> dict:
    """A backbone's config.json: its family's settings, its sizes (in SIZE_KEYS' order), then `more`."""
    return {**family, **dict(zip(SIZE_KEYS, sizes, strict=True)), **more}


_QWEN = {"model_type": "qwen2", "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 32768}
# Qwen3: 36 layers, 32 query and 8 KV heads of 128 (wider than hidden / heads), q and k normed
_QWEN3 = {**_QWEN, "model_type": "qwen3", "head_dim": 128, "max_position_embeddings": 40960}
# Qwen3.5-4B's text model (the vision tower is never loaded). 32 layers of width 2,560 as its model card
# says; heads, widths and the linear layers' sizes are transformers' Qwen3.5 defaults, which the hub's
# config.json was not at hand to confirm (model.name=FOLDER with that config.json gives exact figures).
_QWEN3_5 = {
    "model_type": "qwen3_5_text",
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
}
_LLAMA31 = {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072}
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA31_8B = _shape(_LLAMA31, 4096, 14336, 32, 32, 8, 128256, tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE)
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-3B-Instruct": _shape(_QWEN, 2048, 11008, 36, 16, 2, 151936, tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": _shape(_QWEN, 3584, 18944, 28, 28, 4, 152064, tie_word_embeddings=False),
    "Qwen/Qwen3-4B-Instruct-2507": _shape(
        _QWEN3, 2560, 9728, 36, 32, 8, 151936, tie_word_embeddings=True, rope_theta=5e6, max_position_embeddings=262144
    ),
    "Qwen/Qwen3-8B": _shape(_QWEN3, 4096, 12288, 36, 32, 8, 151936, tie_word_embeddings=False),
    "Qwen/Qwen3.5-4B": _shape(_QWEN3_5, 2560, 9216, 32, 16, 4, 248320, tie_word_embeddings=True),
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
    "Team-ACE/ToolACE-2-Llama-3.1-8B": _LLAMA31_8B,
}

# Token counts of a BFCL V3 episode with the Qwen2.5 tokenizer (see GPU budget notes in the README).
PROMPT_TOKENS = (3700, 4900)
"""Median and longest first prompt (system, ~28 tools, first user turn)."""
RESULT_TOKENS = 150
"""A typical tool result (base / miss_* categories: a few hundred characters)."""
LONG_RESULT_TOKENS = 2000
"""A long_context tool result (up to 70k characters)."""
TYPICAL_CALLS = 3
"""Model calls of a typical synthetic episode."""
MEASURED_TASKS = 64
"""Training tasks whose lengths stand for the recipe's, for the kit's own models (episode_lengths)."""
CPU_SHRINK = 16
"""On CPU every length is divided by this, and the model keeps 2 layers of a small width."""


# --- the model: the recipe's architecture with random weights ----------------------------------------


def architecture(cfg: Config, shrink: bool) -> dict:
    """config.json contents for the recipe's model: known shapes, or the local folder's own config."""
    name = cfg.model.name
    folder = Path(name) / "config.json"
    if name in (TINY, SCRATCH):
        shape = built_here(cfg)
    elif folder.is_file():
        shape = read_json(folder, "restore it, or name another model folder")
    elif name in KNOWN_SHAPES:
        shape = dict(KNOWN_SHAPES[name])
    else:
        raise ConfigError(
            f"model.name: preflight knows the shapes of {sorted(KNOWN_SHAPES)}, {TINY} and {SCRATCH}; for {name!r} "
            "set model.name to a local folder holding its config.json (weights are not needed)"
        )
    shape.pop("quantization_config", None)  # the recipe decides the quantization, as in training
    if shrink:
        heads = 4
        kv_heads = 2 if shape.get("num_key_value_heads", heads) < shape.get("num_attention_heads", heads) else heads
        kinds = list(dict.fromkeys(shape.get("layer_types") or []))  # a folder saved by transformers 5 lists them
        layers = max(2, len(kinds))
        if kinds:  # one layer of each kind at least (a hybrid model keeps its linear and its full attention)
            shape["layer_types"] = (kinds * layers)[:layers]
        shape.update(
            num_hidden_layers=layers,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=32,
        )
        if "linear_num_value_heads" in shape:  # a hybrid's linear layers, as small
            shape.update(
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32
            )
    return shape


def built_here(cfg: Config) -> dict:
    """config.json of a model the kit builds itself: tiny-random (engine/tiny.py) or scratch (engine/scratch.py,
    sized by model.scratch). Both get the tiny tokenizer's ids, the tokenizer preflight runs with (a scratch
    model's own, trained on its tasks, has at most model.scratch.vocab)."""
    if cfg.model.name == TINY:
        return tiny_model(tiny_tokenizer()).config.to_dict()
    s = cfg.model.scratch
    return random_model(tiny_tokenizer(), cfg.seed, s.hidden, s.layers, s.heads, s.kv_heads, s.mlp).config.to_dict()


def write_random_model(shape: dict, folder: Path, tokenizer, device: torch.device) -> int:
    """Save a model of this shape with random weights (normal(0, 0.02), norms 1, biases 0) and the
    tokenizer into folder, in shards; returns the parameter count."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    shape = {
        k: v for k, v in shape.items() if k not in ("architectures", "torch_dtype", "dtype", "transformers_version")
    }
    config = AutoConfig.for_model(**shape)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = None
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # names and shapes only, no memory
    config.architectures = [type(skeleton).__name__]
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    names = [(n, p.shape) for n, p in skeleton.state_dict().items() if n not in tied]
    generator = torch.Generator(device=device).manual_seed(0)
    shards, shard, shard_bytes, index, count = [], {}, 0, {}, 0
    for name, size in names:
        if name.endswith("norm.weight"):
            tensor = torch.ones(size, dtype=torch.bfloat16)
        elif name.endswith(".bias"):
            tensor = torch.zeros(size, dtype=torch.bfloat16)
        else:  # drawn on the GPU when there is one: an 8B model's 16 GB come in seconds
            tensor = (torch.randn(size, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()
        count += tensor.numel()
        shard[name], shard_bytes = tensor, shard_bytes + tensor.numel() * 2
        if shard_bytes > 2 * 2**30:
            shards.append(shard)
            shard, shard_bytes = {}, 0
    shards.append(shard)
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        index.update(dict.fromkeys(tensors, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    config.save_pretrained(folder)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return count


# --- synthetic episodes -----------------------------------------------------------------------------


class SyntheticEpisode:
    """An episode of set lengths: a prompt, then every model message answered by the same tool result,
    `calls` times. What the model writes is ignored."""

    def __init__(self, task_id: str, prompt: str, result: str, calls: int):
        self.task = SimpleNamespace(id=task_id)
        self.prompt, self.result, self.calls = prompt, result, calls
        self.done, self.made = False, 0

    def reset(self) -> tuple[list[dict], list[dict]]:
        self.done, self.made = False, 0
        return [{"role": "system", "content": self.prompt}, {"role": "user", "content": "Please help."}], []

    def step(self, text: str):
        self.made += 1
        self.done = self.made >= self.calls
        observation = [] if self.done else [{"role": "tool", "content": self.result}]
        return SimpleNamespace(observation=observation, turn_done=self.done, done=self.done)

    def truncate(self) -> None:
        self.done = True


class _Filler:
    """Texts of a given number of tokens, cut from BFCL's tool documentation."""

    def __init__(self, renderer):
        classes = sorted({c for t in load_tasks() for c in t.involved_classes})
        text = "\n".join(json.dumps(doc) for c in classes for doc in tool_docs(c))
        self.renderer, self.ids = renderer, renderer.encode(text)

    def text(self, tokens: int, offset: int = 0) -> str:
        ids = (self.ids * (1 + (offset + tokens) // len(self.ids)))[offset : offset + tokens]
        return self.renderer.decode(ids)


def _plain_tokens(policy) -> torch.Tensor:
    """(V,) True for ids that decode to plain text (letters, digits, spaces), the only ones the synthetic
    episodes sample: no stop token (messages run to max_new_tokens), nothing a template could trip on."""
    vocab = causal_lm(policy.model).config.vocab_size
    plain = torch.zeros(vocab, dtype=torch.bool)
    for i in range(min(vocab, len(policy.tokenizer))):
        text = policy.renderer.decode([i])
        plain[i] = bool(text.strip()) and all(c.isascii() and (c.isalnum() or c == " ") for c in text)
    return plain.to(policy.device)


def episode_lengths(cfg: Config, renderer, shrink: int) -> dict:
    """Token lengths of the synthetic episodes: (median, longest) first prompt, a typical and a long tool
    result. A pretrained model's are BFCL's with the Qwen2.5 tokenizer (divided by `shrink`); the kit's own
    models' are measured on the recipe's own training tasks (their first prompts, and what the back ends
    answer to their reference calls), in the tokenizer and template preflight runs with."""
    if cfg.model.name not in (TINY, SCRATCH):
        low, high = (n // shrink for n in PROMPT_TOKENS)
        return {"prompt": (low, high), "result": RESULT_TOKENS // shrink, "long_result": LONG_RESULT_TOKENS // shrink}
    prompts, results = [], []
    for task in tasks_for(load_split(cfg)["train"][:MEASURED_TASKS], "data"):
        env = Episode(task, protocol=PROTOCOLS[cfg.model.protocol])
        prompts.append(len(renderer.prompt_ids(*env.reset())))
        played = play(env, POLICIES["ground_truth"](task))
        results += [len(renderer.encode(m["content"])) for m in played if m["role"] == "tool"]
    prompts, results = sorted(prompts), sorted(results) or [1]
    return {
        "prompt": (prompts[len(prompts) // 2], prompts[-1]),
        "result": results[len(results) // 2],
        "long_result": results[-1],
    }


def synthetic_wave(cfg: Config, filler: _Filler, episodes: int, lengths: dict) -> list[SyntheticEpisode]:
    """`episodes` episodes in groups of G (a shared prompt per group), of `lengths` (episode_lengths); the
    first group grows to max_total_tokens with long tool results, the others end after a few calls with
    typical ones."""
    r, G = cfg.rollout, cfg.rollout.group_size
    low, high = lengths["prompt"]
    groups = max(1, math.ceil(episodes / G))
    envs = []
    for g in range(groups):
        prompt_tokens = min(low + (high - low) * g // max(groups - 1, 1), r.max_prompt_tokens - 64)
        prompt = filler.text(prompt_tokens, offset=997 * g)
        long = g == 0
        result = filler.text(lengths["long_result" if long else "result"], offset=31 * g)
        calls = 10**6 if long else TYPICAL_CALLS
        envs += [SyntheticEpisode(f"synthetic_{g}", prompt, result, calls) for _ in range(G)]
    return envs


# --- measuring ----------------------------------------------------------------------------------------


def _memory_text(m: dict) -> str:
    if "peak_allocated_gb" in m:
        return f"peak allocated {m['peak_allocated_gb']:.2f} GB, reserved {m['peak_reserved_gb']:.2f} GB"
    return f"peak resident {m['peak_rss_gb']:.2f} GB (CPU: no GPU memory)"


def rollout_phase(policy, cfg: Config, filler: _Filler, shrink: int) -> tuple[dict, list]:
    """One wave of synthetic episodes: as many as the slots hold, in whole groups (at least two: one long,
    one typical; just those two at a shrunk scale)."""
    from seal_mini.engine.rollout import RolloutStats, concurrency, run_rollouts

    G = cfg.rollout.group_size
    slots = concurrency(policy, cfg.rollout, cfg.train.tasks_per_step * G)
    episodes = 2 * G if shrink > 1 else max(2 * G, math.ceil(slots / G) * G)
    envs = synthetic_wave(cfg, filler, episodes, episode_lengths(cfg, policy.renderer, shrink))
    plain = _plain_tokens(policy)
    hook = lambda rows, so_far, logits: logits.masked_fill(~plain, float("-inf"))  # noqa: E731
    stats = RolloutStats()
    reset_peak(policy.device)
    trajs = run_rollouts(policy, envs, cfg.rollout, cfg.rollout.temperature, cfg.seed, stats=stats, logits_hook=hook)
    s = stats.summary()
    return {
        "episodes": len(envs),
        "groups": len(envs) // G,
        "slots": stats.concurrency,
        "kv_cache_gb": round(stats.kv_cache_bytes / 2**30, 2),
        "out_of_memory": stats.out_of_memory,
        "seconds": round(stats.seconds, 1),
        "prefill_tok_per_s": s["prefill_tokens_per_s"],
        "decode_tok_per_s": s["decode_tokens_per_s"],
        "longest_tokens": max(map(row_tokens, trajs)),
        "typical_tokens": round(sum(map(row_tokens, trajs[G:])) / len(trajs[G:])),
        **peak_memory(policy.device),
    }, trajs


def row_tokens(t) -> int:
    """The longest sequence the update runs for a trajectory (its longest segment)."""
    return max(b - a for a, b in t.spans())


def update_phase(policy, cfg: Config, trajectory) -> dict:
    """One micro-batch of copies of `trajectory` through the real update (one optimizer step)."""
    from seal_mini.training.update import update

    micro = cfg.train.micro_batch
    one = copy.deepcopy(cfg)
    one.train.mini_batch_tasks, one.rollout.group_size = 1, micro  # one mini-batch = one micro-batch
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    advantages = torch.tensor([1.0, -1.0] * micro)[:micro]  # non-zero, so gradients flow
    reset_peak(policy.device)
    started = time.perf_counter()
    update(policy, optimizer, scheduler, [trajectory] * micro, advantages, one)
    peak = peak_memory(policy.device)  # waits for the GPU, so the time below is the update's
    seconds = time.perf_counter() - started
    tokens = micro * len(trajectory.input_ids)
    return {"sequences": micro, "tokens": tokens, "tok_per_s": round(tokens / seconds, 1), **peak}


def projection(cfg: Config, rollout: dict, typical: dict) -> dict:
    """Hours for a step, the run and the held-in evaluation, from the measured rates. Synthetic messages
    run to max_new_tokens, so the rollout part leans long."""
    G, B = cfg.rollout.group_size, cfg.train.tasks_per_step
    per_episode = rollout["seconds"] / rollout["episodes"]  # seconds of a wave per episode in it
    rollout_s = B * G * per_episode
    update_s = B * G * rollout["typical_tokens"] / typical["tok_per_s"]
    held_in = len(load_split(cfg)["eval"])
    eval_tasks = min(held_in, cfg.data.max_eval_tasks or held_in)
    steps, every = cfg.train.steps, cfg.train.eval_every
    during = len([s for s in range(1, steps) if every and s % every == 0])
    eval_episodes = eval_tasks * (during + 1 + int(cfg.eval.base_model))  # during training, adapter, backbone
    eval_s = eval_episodes * per_episode
    return {
        "step_min": round((rollout_s + update_s) / 60, 2),
        "step_rollout_min": round(rollout_s / 60, 2),
        "step_update_min": round(update_s / 60, 2),
        "eval_episodes": eval_episodes,
        "eval_h": round(eval_s / 3600, 3),
        "run_h": round((steps * (rollout_s + update_s) + eval_s) / 3600, 3),
    }


def _took(minutes: float) -> str:
    """A duration as people say it: 40 s, 12 min, 3.4 h."""
    if minutes < 1:
        return f"{60 * minutes:.0f} s"
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"


# --- the program ------------------------------------------------------------------------------------


def preflight(cfg: Config, gpu_mem_gb: float = 0.0) -> tuple[dict, list[str]]:
    """Run the phases; returns (result, what does not fit: one line per setting to lower)."""
    from seal_mini.engine.policy import load_policy  # looked up at each call: a test injects its own loader

    device = resolve_device(cfg.device)
    if gpu_mem_gb:
        cap_memory(gpu_mem_gb, device)
    shrink = CPU_SHRINK if device.type == "cpu" and cfg.model.name not in (TINY, SCRATCH) else 1
    shape = architecture(cfg, shrink > 1)
    result: dict = {"recipe_model": cfg.model.name, "device": str(device), "gpu_mem_gb": gpu_mem_gb or None}
    if shrink > 1:
        for name in "max_new_tokens max_prompt_tokens max_response_tokens max_total_tokens prefill_tokens".split():
            setattr(cfg.rollout, name, getattr(cfg.rollout, name) // shrink)
        cfg.validate()
        print(f"[preflight] CPU: shrunk scale (2 layers, lengths / {shrink}): this checks the plumbing, not the recipe")
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="seal_mini_preflight_") as folder:
        tokenizer = tiny_tokenizer()
        if cfg.model.name == SCRATCH:  # its compact tool block, so that prompts are as long as the recipe's
            tokenizer.chat_template = CHAT_TEMPLATE
        if cfg.model.tool_format == "bfcl_llama":  # BFCL's Llama prompt: Llama 3's header tokens as tokens
            tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS["bfcl_llama"])})
        params = write_random_model(shape, Path(folder), tokenizer, device)
        loaded = copy.deepcopy(cfg)
        loaded.model.name, loaded.model.gguf_file, loaded.lora.adapter_path = folder, "", ""
        loaded.sft.enabled = False  # the random model stands in for the warm start too
        reset_peak(device)
        try:
            policy = load_policy(loaded)
        except torch.OutOfMemoryError:
            problems.append(
                "model: the weights alone do not fit; use model.load_in_4bit=true, a smaller model, or a larger card"
            )
            return {**result, "fits": False}, problems
    result["parameters_b"], result["parameters"] = round(params / 1e9, 2), params
    result["load"] = peak_memory(device)
    size = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    print(f"[preflight] {cfg.model.name}: {size} parameters (random weights); load: {_memory_text(result['load'])}")

    try:
        filler = _Filler(policy.renderer)
        before = asdict(policy.limits)
        result["rollout"], trajs = rollout_phase(policy, cfg, filler, shrink)
        r = result["rollout"]
        print(
            f"[preflight] rollouts: {r['episodes']} episodes ({r['groups']} groups, one growing to "
            f"{r['longest_tokens']} tokens) in {r['seconds']:.1f} s; {r['slots']} slots (KV {r['kv_cache_gb']:.2f} GB); "
            f"prefill {r['prefill_tok_per_s']:.0f} tok/s, decode {r['decode_tok_per_s']:.0f} tok/s; {_memory_text(r)}"
        )
        if any(asdict(policy.limits)[k] != before[k] for k in ("max_concurrent", "prefill_tokens")):
            problems.append(_rollout_advice(cfg, policy.limits))
        G = cfg.rollout.group_size
        typical = min(trajs[G:], key=lambda t: abs(row_tokens(t) - r["typical_tokens"]))
        longest = max(trajs, key=row_tokens)
        before = asdict(policy.limits)
        result["update_typical"] = update_phase(policy, cfg, typical)
        result["update_max"] = update_phase(policy, cfg, longest)
        for name in ("update_typical", "update_max"):
            u = result[name]
            print(
                f"[preflight] {name.replace('_', ' ')}: {u['sequences']} x {u['tokens'] // u['sequences']} tokens, "
                f"{u['tok_per_s']:.0f} tok/s; {_memory_text(u)}"
            )
        if asdict(policy.limits) != before:
            problems.append(
                f"train.micro_batch / train.logprob_chunk: the update ran out of memory at the recipe's setting; "
                f"it fit at train.micro_batch={policy.limits.micro_batch or cfg.train.micro_batch} "
                f"train.logprob_chunk={policy.limits.logprob_chunk or cfg.train.logprob_chunk}"
            )
    except ConfigError as e:  # out of memory even at the smallest settings
        problems.append(str(e))
        return {**result, "fits": False}, problems
    if not result["update_typical"]["tokens"]:  # every episode ended before its first token
        problems.append(
            "rollout.max_prompt_tokens: every first prompt was over it, so nothing was generated; raise it "
            "(and rollout.max_total_tokens) above the recipe's prompts"
        )
        return {**result, "fits": False}, problems
    result["projection"] = p = projection(cfg, result["rollout"], result["update_typical"])
    print(
        f"[preflight] projected: a step {_took(p['step_min'])} (rollouts {_took(p['step_rollout_min'])}, update "
        f"{_took(p['step_update_min'])}); {cfg.train.steps} steps and the held-in evaluation ({p['eval_episodes']} "
        f"episodes, {_took(60 * p['eval_h'])}): {_took(60 * p['run_h'])}"
    )
    result["fits"] = not problems
    return result, problems


def _rollout_advice(cfg: Config, limits) -> str:
    setting = f"rollout.max_concurrent={limits.max_concurrent}" if limits.max_concurrent else ""
    if limits.prefill_tokens:
        setting = f"{setting} rollout.prefill_tokens={limits.prefill_tokens}".strip()
    source = "rollout.kv_budget_gb" if cfg.rollout.kv_budget_gb else "the automatic KV budget (rollout.kv_budget_gb=0)"
    return f"rollout: a wave ran out of memory with the slots {source} gives; it fit with {setting}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini preflight", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value")
    parser.add_argument("--gpu-mem-gb", type=float, default=0.0, help="use at most this much GPU memory")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    cfg = load_config(args.recipe, args.overrides)
    result, problems = preflight(cfg, args.gpu_mem_gb)
    for line in problems:
        print(f"[preflight] does not fit: {line}", file=sys.stderr)
    if not problems:
        print("[preflight] fits")
    print(json.dumps({**result, "problems": problems}))
    return 1 if problems else 0
