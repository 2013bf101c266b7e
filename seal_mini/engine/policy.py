"""Load the policy: a causal LM with a LoRA adapter, its tokenizer and its chat renderer.

One function, `load_policy(cfg)`, picks how (`model.backend`):
  unsloth  FastLanguageModel with 4-bit weights; needs a CUDA GPU and the optional unsloth extra
           (requirements-gpu.txt). Imported only here, only when chosen.
  hf       transformers + peft LoRA; bitsandbytes 4-bit NF4 base weights on a GPU (QLoRA), full
           precision on CPU unless model.cpu_4bit.
  auto     hf, for now: unsloth's patched forward does not fit the rollout engine's KV cache.
The bare backbone (evaluation's backbone row, the tau2 user simulator, the judge) and the KL term's
reference (Policy.backbone, Policy.reference) live in the same model: never a second copy of the base weights.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seal_mini.config import Config, ConfigError
from seal_mini.engine import attention
from seal_mini.engine.device import MemoryLimits, compute_dtype, gpu_name, resolve_device, supported_versions
from seal_mini.engine.logprobs import causal_lm
from seal_mini.engine.render import ChatRenderer
from seal_mini.engine.scratch import chat_tokenizer, random_model, train_tokenizer_json
from seal_mini.engine.tiny import tiny_model, tiny_tokenizer
from seal_mini.runio import check_model_folder, writing

TINY = "tiny-random"
SCRATCH = "scratch"
TRAINED_ADAPTER = "default"
"""peft's name for the adapter the run trains (the only one saved)."""
REFERENCE_ADAPTER = "reference"
"""The frozen copy of the starting adapter (lora.adapter_path) that the KL term measures against."""

# bitsandbytes, when peft or transformers imports it on a CPU with AVX512-BF16, logs that it cannot load an
# optional kernel (the `kernels` package) for its bf16 4-bit CPU path. The kit never takes that path (full
# precision on a CPU; model.cpu_4bit switches it off in load_hf_base), so that one message is dropped.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward")
)


@dataclass
class Policy:
    model: torch.nn.Module
    """The peft-wrapped causal LM; its LoRA parameters are the only trainable ones."""
    tokenizer: object
    renderer: ChatRenderer
    device: torch.device
    backend: str
    """unsloth | hf: what actually loaded it."""
    dtype: torch.dtype
    """Compute dtype (float32 on CPU)."""
    limits: MemoryLimits = field(default_factory=MemoryLimits)
    """Rollout and update settings an out-of-memory error made smaller (see seal_mini.engine.device)."""
    start_adapter: str = ""
    """The adapter folder the policy started from (lora.adapter_path); empty for a fresh adapter."""

    @contextmanager
    def backbone(self):
        """Inside this block the model is the bare backbone: every adapter is switched off."""
        with self.model.disable_adapter():
            yield self.model

    @contextmanager
    def reference(self):
        """Inside this block the model is the KL reference, the policy the run started from (frozen)."""
        if not self.start_adapter:  # LoRA B starts at zero, so a fresh adapter is the backbone
            with self.backbone() as model:
                yield model
            return
        if REFERENCE_ADAPTER not in self.model.peft_config:  # loaded on first use: evaluation never needs it
            self.model.load_adapter(self.start_adapter, adapter_name=REFERENCE_ADAPTER, is_trainable=False)
        trained, trainable = self.model.active_adapter, self.trainable_parameters()
        self.model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)
        try:
            yield self.model
        finally:
            # peft's set_adapter also decides which parameters train; put back exactly what trained before
            self.model.set_adapter(trained, inference_mode=True)
            for p in trainable:
                p.requires_grad_(True)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA parameters (what the optimizer updates)."""
        return [p for p in self.model.parameters() if p.requires_grad]


def resolve_backend(cfg: Config, device: torch.device) -> str:
    """The backend `model.backend` resolves to on this machine."""
    wanted = cfg.model.backend
    if wanted == "auto":
        # unsloth replaces the model's forward with an inference path that returns a new KV cache
        # instead of growing the one it is given, which the rollout engine relies on; until that is
        # bridged and checked on a GPU, auto means transformers + bitsandbytes + peft.
        return "hf"
    if wanted == "unsloth":
        if device.type != "cuda":
            raise ConfigError("model.backend: unsloth needs a CUDA GPU; use model.backend=hf on CPU")
        if importlib.util.find_spec("unsloth") is None:
            raise ConfigError(
                "model.backend: unsloth is not installed; pip install -r requirements-gpu.txt -c requirements.txt "
                "(SEAL_MINI_UNSLOTH=1 bash run.sh does this where a GPU is present) or use model.backend=hf"
            )
        if cfg.model.name in (TINY, SCRATCH) or cfg.model.gguf_file or cfg.sft.enabled:
            raise ConfigError(
                "model.backend: unsloth cannot load tiny-random, scratch, GGUF or warm-start models; use model.backend=hf"
            )
    return wanted


WARM_START = "warm_start"
"""The run directory's folder for the warm start that `sft` builds (seal_mini.training.sft) and RL starts from."""
WARM_START_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""What every warm start holds (sharded weights: their index and shards): without tokenizer.json,
transformers would build a tokenizer that knows two tokens, without a word."""


def warm_start_dir(cfg: Config) -> Path:
    return cfg.run_dir / WARM_START


def load_hf_base(cfg: Config, device: torch.device, dtype: torch.dtype, corpus: list[str] | None = None):
    """(causal LM, tokenizer) with transformers; 4-bit NF4 where the recipe and the device allow it.
    With sft.enabled the backbone is the run's warm start (seal_mini/training/sft.py), not model.name;
    `corpus` is given while that warm start is being built (a model built from scratch learns its
    tokenizer from it)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    name = cfg.model.name
    required, fix = ("config.json",), "model.name: restore the model folder, or name another"
    if cfg.sft.enabled and corpus is None:  # a corpus is given while the warm start itself is being built
        name = str(warm_start_dir(cfg))
        if not (Path(name) / "config.json").is_file():
            raise ConfigError(
                f"sft.enabled: no warm start in {name}; build it with `python -m seal_mini sft RECIPE` "
                "(train and pipeline build it themselves)"
            )
        required = WARM_START_FILES
        fix = f"restore it, or build the warm start again: python -m seal_mini sft {cfg.run_dir}/config.yaml --rebuild"
    elif name == TINY:
        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer).to(device=device, dtype=dtype), tokenizer
    elif name == SCRATCH:
        if corpus is None:
            raise ConfigError("model.name: scratch is built by the warm start; set sft.enabled: true")
        # a BPE tokenizer trained on `corpus` (the training tasks as the template renders them, and the
        # interface's texts: seal_mini.training.sft builds it), a Qwen2 sized by model.scratch, weights from cfg.seed
        s = cfg.model.scratch
        tokenizer = chat_tokenizer(train_tokenizer_json(corpus, s.vocab))
        model = random_model(tokenizer, cfg.seed, s.hidden, s.layers, s.heads, s.kv_heads, s.mlp)
        return model.to(device=device, dtype=dtype), tokenizer

    kwargs: dict = {"dtype": dtype, "attn_implementation": cfg.model.attn_implementation}
    quantize = cfg.model.load_in_4bit and not cfg.model.gguf_file and (device.type == "cuda" or cfg.model.cpu_4bit)
    if quantize:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
        kwargs["device_map"] = {"": str(device)}
    if cfg.model.gguf_file:
        kwargs["gguf_file"] = cfg.model.gguf_file
    elif Path(name).is_dir():  # a damaged file is named here, not deep inside transformers
        check_model_folder(Path(name), required, fix)
    try:
        tokenizer = load_tokenizer(name, cfg.model.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as e:
        raise ConfigError(
            f"model.name: cannot load {name!r} ({str(e).splitlines()[0]}); give a local folder, "
            "a hub id already in the local cache, tiny-random or scratch"
        ) from None
    if not quantize:
        model = model.to(device)
    elif device.type == "cpu":
        # On CPUs with AVX512-BF16, bitsandbytes repacks 4-bit weights on the first no-grad forward and
        # later backward passes come out wrong; the plain CPU kernel is correct.
        import bitsandbytes as bnb

        for module in model.modules():
            if isinstance(module, bnb.nn.Linear4bit):
                module.support_avx512bf16_for_cpu = False
    if cfg.model.gguf_file:  # GGUF weights arrive dequantized; forget the quantizer so saving works
        model.hf_quantizer = None
        model.config.quantization_config = None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


TOKENIZER_PROBE = '<|im_start|>user\nCount "notes.txt", 003 times.<|im_end|>\n{"name": "wc", "arguments": {"n": 12}}'
"""Text on which a folder's tokenizer.json and the tokenizer transformers builds for it must agree."""


def load_tokenizer(name: str, gguf_file: str = ""):
    """The tokenizer a model was trained with. AutoTokenizer, unless a local folder's own tokenizer.json cuts
    text differently: transformers rebuilds a qwen2 model's tokenizer from its vocabulary with Qwen's
    pre-tokenizer, which is wrong for a tokenizer trained here (seal_mini/engine/scratch.py: a warm start
    built from scratch); then the folder's file, exactly as saved."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(name, gguf_file=gguf_file or None)
    saved = Path(name) / "tokenizer.json"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if gguf_file or backend is None or not saved.is_file():
        return tokenizer
    from tokenizers import Tokenizer

    def cuts(t) -> tuple:
        pieces = t.pre_tokenizer.pre_tokenize_str(TOKENIZER_PROBE) if t.pre_tokenizer else None
        return pieces, t.encode(TOKENIZER_PROBE, add_special_tokens=False).ids

    if cuts(backend) != cuts(Tokenizer.from_file(str(saved))):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(name)
    return tokenizer


def _placement(cfg: Config) -> tuple[torch.device, torch.dtype, str]:
    """(device, compute dtype, why that dtype); torch's CPU threads set where the recipe asks (cpu_threads)."""
    device = resolve_device(cfg.device)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    return device, *compute_dtype(cfg.model.dtype, device)


def load_backbone(cfg: Config, corpus: list[str]):
    """(model, tokenizer, renderer, device) without adapter, for building the warm start: model.name
    itself (a model built from scratch learns its tokenizer from `corpus`)."""
    versions = supported_versions()
    if versions and not os.environ.get("SEAL_MINI_ANY_VERSIONS"):  # checked before anything loads
        raise ConfigError(f"{versions} (or set SEAL_MINI_ANY_VERSIONS=1 to run on them untested)")
    device, dtype, _ = _placement(cfg)
    model, tokenizer = load_hf_base(cfg, device, dtype, corpus)
    if cfg.model.attn_implementation == "sdpa":
        model.set_attn_implementation(attention.register())
    return model, tokenizer, ChatRenderer(tokenizer, cfg.model.tool_format), device


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def checked_adapter(cfg: Config) -> Path:
    """lora.adapter_path, its files checked (a damaged one is one line naming it, not a peft traceback)."""
    path = Path(cfg.lora.adapter_path)
    if not (path / "adapter_config.json").is_file():
        raise ConfigError(f"lora.adapter_path: {path} holds no adapter_config.json (save one with save_adapter)")
    check_model_folder(path, ADAPTER_FILES, "restore the adapter, or train it again")
    return path


def add_lora(model, cfg: Config):
    """Wrap the base model with a fresh LoRA adapter (seeded), or the one at lora.adapter_path."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if cfg.model.gradient_checkpointing:
        # Only active in train mode (the update); rollouts run in eval mode with a KV cache.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.adapter_path:
        return PeftModel.from_pretrained(model, str(checked_adapter(cfg)), is_trainable=True)
    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng(devices=[]):  # the adapter's init depends on cfg.seed alone
            torch.manual_seed(cfg.seed)
            return get_peft_model(model, lora)
    except ValueError as e:
        raise ConfigError(f"lora.target_modules: {e}") from None


def _load_unsloth(cfg: Config, dtype: torch.dtype):
    """(peft model, tokenizer) through unsloth's FastLanguageModel (GPU only)."""
    from unsloth import FastLanguageModel  # optional GPU extra, imported only when chosen

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=cfg.model.name,
        max_seq_length=cfg.rollout.max_total_tokens,
        dtype=dtype,
        load_in_4bit=cfg.model.load_in_4bit,
    )
    if cfg.lora.adapter_path:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(checked_adapter(cfg)), is_trainable=True)
    else:
        model = FastLanguageModel.get_peft_model(
            model,
            r=cfg.lora.rank,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            bias="none",
            use_gradient_checkpointing="unsloth" if cfg.model.gradient_checkpointing else False,
            random_state=cfg.seed,
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_policy(cfg: Config, banner: bool = True) -> Policy:
    """The backbone with a LoRA adapter, on the configured device, ready for rollouts and updates;
    prints the start banner (device, dtype, backend, 4-bit, KV budget and slots) unless banner=False."""
    device, dtype, dtype_reason = _placement(cfg)
    backend = resolve_backend(cfg, device)
    if backend == "unsloth":
        model, tokenizer = _load_unsloth(cfg, dtype)
    else:
        base, tokenizer = load_hf_base(cfg, device, dtype)
        if cfg.model.attn_implementation == "sdpa":
            base.set_attn_implementation(attention.register())  # sdpa without the per-step K/V copy
        model = add_lora(base, cfg)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    extra_stops = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    renderer = ChatRenderer(tokenizer, cfg.model.tool_format, extra_stop_ids=extra_stops)
    model.eval()
    policy = Policy(model, tokenizer, renderer, device, backend, dtype, start_adapter=cfg.lora.adapter_path)
    if banner:
        print(start_banner(policy, cfg, dtype_reason), flush=True)
    return policy


def start_banner(policy: Policy, cfg: Config, dtype_reason: str) -> str:
    """One line saying where and how the model runs: device, dtype and why, backend, 4-bit, KV budget, slots."""
    from seal_mini.engine.rollout import concurrency, kv_budget, slot_bytes

    where = (
        f"cuda ({gpu_name(policy.device)})"
        if policy.device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)"
    )
    per_slot = slot_bytes(causal_lm(policy.model).config, policy.dtype, cfg.rollout.max_total_tokens)
    budget, source = kv_budget(policy, cfg.rollout)
    four_bit = any(type(m).__name__ == "Linear4bit" for m in policy.model.modules())  # bitsandbytes base weights
    wave = cfg.train.tasks_per_step * cfg.rollout.group_size
    slots = concurrency(policy, cfg.rollout, wave)
    if cfg.rollout.max_concurrent:
        kv = f"rollout.max_concurrent {cfg.rollout.max_concurrent} (KV {per_slot * slots / 2**30:.2f} GB)"
    else:
        kv = f"KV budget {budget / 2**30:.2f} GB ({source})"
    return (
        f"[device] {where} | {policy.dtype} ({dtype_reason}) | backend {policy.backend} | "
        f"4-bit {'nf4' if four_bit else 'no'} | {kv} -> {slots} slots of "
        f"{cfg.rollout.max_total_tokens} tokens for a round of {wave} episodes"
    )


def save_adapter(policy: Policy, path: str | Path) -> Path:
    """Write the LoRA adapter (only the adapter: the base comes from model.name) to a folder."""
    path = Path(path)
    with writing(path / "adapter_model.safetensors"):  # what a full disk stops (named, not safetensors' words)
        path.mkdir(parents=True, exist_ok=True)
        policy.model.save_pretrained(str(path), selected_adapters=[TRAINED_ADAPTER])  # never the reference copy
    return path
