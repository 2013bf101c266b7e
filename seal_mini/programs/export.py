"""Take a trained agent out of its run directory: the LoRA adapter with a model card, optionally merged.

    python -m seal_mini export RUN_DIR                      # RUN_DIR/export: adapter + README.md card
    python -m seal_mini export RUN_DIR --merged OUT          # also base + adapter merged, for serving
    python -m seal_mini export RUN_DIR --push-to-hub USER/NAME   # upload (only when asked)

The adapter folder is peft's own format, so it loads as is:
  transformers + peft   AutoPeftModelForCausalLM.from_pretrained("RUN_DIR/export")
  vLLM                  LLM(BASE, enable_lora=True) ... LoRARequest("seal", 1, "RUN_DIR/export")
Its base_model_name_or_path loads from any directory: a hub id stays one, a local folder is named by its
absolute path, and a base that only the run has (tiny-random, a warm start built by `sft`) is exported
beside the adapter in base/ and named by that folder's absolute path.
The merged folder is a plain transformers model (weights, tokenizer and chat template) that any server
loads without peft. Merging adds the adapter to the unquantized base in float32 and saves it in --dtype
(float32 by default); the card states the largest log-prob gap this leaves against the adapter on the
same base, measured on the run's first held-in prompt. A run trained on 4-bit (NF4) base weights differs
from both by the quantization error of the base, as any server of the unquantized base does.
Every saved model is checked to load back through AutoTokenizer with the run's own token ids (save_model).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
from pathlib import Path

import torch
import yaml

from seal_mini import __version__
from seal_mini.config import CATEGORIES, Config, ConfigError, config_from_dict, saved_config
from seal_mini.engine.device import DTYPES
from seal_mini.engine.logprobs import token_logprobs
from seal_mini.engine.policy import ADAPTER_FILES, SCRATCH, TINY, TOKENIZER_PROBE, load_hf_base, warm_start_dir
from seal_mini.engine.render import ChatRenderer
from seal_mini.envs.episode import Episode
from seal_mini.envs.splits import load_split, tasks_for
from seal_mini.evaluation.report import markdown_table, pct
from seal_mini.runio import (
    FileError,
    atomic_write_text,
    check_model_folder,
    holder_text,
    new_dir,
    read_json,
    read_metrics,
    run_lock,
    write_json,
    writer,
)

EXPORT_MARK = "seal_mini_config.yaml"
"""The run's recipe, written into every export: also how an earlier export is told from other folders."""


def run_config(run_dir: Path, overrides: list[str] | tuple = ()) -> Config:
    """The resolved config a run was trained with (RUN_DIR/config.yaml), with `key.sub=value` overrides."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir}: no config.yaml; give a run directory (runs/<name>)")
    cfg = saved_config(run_dir)
    return config_from_dict(cfg.to_dict(), overrides) if overrides else cfg


def writable(out: Path, force: bool) -> Path:
    """`out` if an export may go there: a new or empty folder, or an earlier export (replaced whole).
    Anything else is refused rather than deleted, unless `force`."""
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_MARK).is_file() and not force:
        raise ConfigError(
            f"{out} is a folder that holds something other than an export; name a new folder, or add --force "
            "to replace it"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; name a folder for the export")
    return out


def trained_adapter(run_dir: Path) -> Path:
    """RUN_DIR/adapter, written when training finished, its files checked (nothing damaged is copied or loaded)."""
    adapter = run_dir / "adapter"
    missing = [f for f in ADAPTER_FILES if not (adapter / f).is_file()]
    if missing:
        holder = writer(run_dir)  # another command writing the run now (this one may hold it itself)
        hint = (
            f"it is written when training ends, and {holder_text(holder)} writes the run now: wait for it to end"
            if holder and holder.get("pid") != os.getpid()
            else f"finish training first (python -m seal_mini train --resume {run_dir})"
        )
        raise ConfigError(f"{adapter}: no trained adapter ({', '.join(missing)} missing); {hint}")
    check_model_folder(
        adapter, ADAPTER_FILES, f"restore it, or train again (python -m seal_mini train --resume {run_dir})"
    )
    return adapter


def first_held_in(run_dir: Path, cfg: Config) -> str:
    """The first task of the run's held-in split: split.json as the run wrote it, else the config's split."""
    path = run_dir / "split.json"
    if not path.exists():
        return load_split(cfg)["eval"][0]
    split = read_json(path, "name a task with --task, or restore split.json")
    if not isinstance(split, dict) or not split.get("eval"):
        raise FileError(f"{path}: holds no held-in task ids; name a task with --task")
    return split["eval"][0]


# --- the model card ----------------------------------------------------------------------------------

MERGE_GAP_TOKENS = 512
"""Tokens of the run's first held-in prompt on which the merged model's log-probs are compared."""


def trained_on(cfg: Config) -> str:
    """What the run's tasks were (data.source), in words for the card."""
    categories = ", ".join(cfg.data.categories)
    if cfg.data.source == "bfcl":
        return f"BFCL V3 multi-turn tool-use tasks ({categories})"
    if cfg.data.source == "practice":
        return (
            f"the kit's practice tasks ({categories}; data.source: practice): short multi-turn tool tasks "
            "generated on BFCL's back ends, not BFCL V3 itself, so its scores say nothing about BFCL"
        )
    return f"the tasks of data.source: {cfg.data.source} ({categories})"


def _split_sizes(run_dir: Path) -> str:
    path = run_dir / "split.json"
    split = read_json(path, "restore split.json (the run's task ids)") if path.is_file() else {}
    return f", {len(split['train'])} training and {len(split['eval'])} held-in" if split.get("train") else ""


def results_table(run_dir: Path) -> str:
    """Held-in success per category, backbone vs trained, from the run's eval/*.json."""
    paths = {tag: run_dir / "eval" / f"{tag}.json" for tag in ("base", "adapter")}
    evals = {tag: read_json(path) for tag, path in paths.items() if path.exists()}
    if not evals:
        return "_No held-in evaluation in this run yet._\n"
    seen = {c for e in evals.values() for c in e["success"] if c != "mean"}
    columns = [c for c in CATEGORIES if c in seen] + sorted(seen - set(CATEGORIES)) + ["mean"]
    rows = [
        ["backbone" if tag == "base" else "trained adapter", *(pct(e["success"].get(c)) for c in columns)]
        for tag, e in evals.items()
    ]
    sizes = sorted({e["n_tasks"] for e in evals.values() if "n_tasks" in e})
    over = f"\nOver {' / '.join(map(str, sizes))} held-in tasks, greedy.\n" if sizes else ""
    return markdown_table(["policy", *columns], rows) + over


def suites_table(run_dir: Path) -> str:
    """Out-of-distribution suites the run evaluated (eval/<suite>_{base,adapter}.json)."""
    lines = []
    for path in sorted((run_dir / "eval").glob("*.json")):
        result = read_json(path)
        if isinstance(result, dict) and "suite" in result:
            scores = ", ".join(f"{k} {pct(v)}" for k, v in result.get("scores", {}).items())
            lines.append(f"- `{result.get('tag', path.stem)}` ({result['suite']}): {scores or 'no columns scored'}")
    return "\n".join(lines) + "\n" if lines else "_None evaluated._\n"


def is_hub_id(name: str) -> bool:
    """A Hugging Face Hub id (owner/name), not a local folder or a model the kit builds."""
    return name.count("/") == 1 and not Path(name).exists() and not name.startswith((".", "/"))


LLAMA_FORM = (
    " It is saved as a LlamaForCausalLM with attention biases, the same function as the Qwen2 it was trained "
    "as, so that AutoTokenizer reads the tokenizer it was trained with (for a qwen2 model it would rebuild "
    "the tokenizer with Qwen's own pre-tokenizer, and the ids would differ)."
)
"""What the card says about a model saved in its Llama form (save_model)."""


def model_card(
    run_dir: Path, cfg: Config, base_model: str, merged: dict | None = None, beside: dict | None = None
) -> str:
    """README.md for an export: what it is, what it trained on and scored, how to load it. `base_model` is
    how the base is loaded (a hub id, a folder); `beside`, given when the base was exported into base/, and
    `merged`, given for a merged model, say how it was saved (save_model's Llama form; dtype, log-prob gap
    over how many tokens)."""
    steps = max((m["step"] for m in read_metrics(run_dir)), default=-1) + 1
    interface = f"on ({'closed' if cfg.interface.closed_loop else 'open'} loop)" if cfg.interface.enabled else "off"
    front: dict = {"base_model": base_model} if is_hub_id(base_model) else {}
    front["tags"] = ["seal_mini", "tool-use", *(["bfcl"] if cfg.data.source == "bfcl" else []), "grpo", "lora"]
    if not merged:
        front["library_name"] = "peft"
    built = "A small Qwen2 built from scratch" if cfg.model.name == SCRATCH else f"`{cfg.model.name}`"
    if cfg.sft.enabled:
        built += ", warm-started by supervised fine-tuning (seal_mini sft),"
    what = "with its LoRA adapter merged into the weights" if merged else "with a LoRA adapter"
    if merged:
        base_text = (
            f"Merged in float32 and saved in {merged['dtype']}: over the first {merged['tokens']} tokens of the "
            f"run's first held-in prompt its log-probs differ from the adapter's on the same unquantized base "
            f"by at most {merged['gap']:.1e}." + (LLAMA_FORM if merged["llama"] else "")
        )
        use = (
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained("<this folder or repo>")\n'
            'tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>")\n```\n'
        )
    else:
        base_text = (
            f"The base is in `{BASE_DIR}/` beside this card (it exists nowhere else); adapter_config.json names it "
            f"by its absolute path, `{base_model}`; once the folder moves (or comes from the Hub), load the base from "
            f"`{BASE_DIR}/` by hand, as below." + (LLAMA_FORM if beside["llama"] else "")
            if beside
            else f"The base loads from `{base_model}`."
        )
        base = f'"<this folder>/{BASE_DIR}"' if beside else f'"{base_model}"'
        use = (
            "```python\nfrom peft import AutoPeftModelForCausalLM, PeftModel\nfrom transformers import "
            "AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoPeftModelForCausalLM.from_pretrained("<this folder>")  # the base named in adapter_config.json\n'
            f'# or: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base}), "<this folder>")\n'
            f"tokenizer = AutoTokenizer.from_pretrained({base})\n```\n\n"
            f'With vLLM: `LLM({base}, enable_lora=True)` and `LoRARequest("seal", 1, "<this folder>")` per request.\n'
        )
    sections = [
        "---\n" + yaml.safe_dump(front, sort_keys=False) + "---",
        f"# {cfg.name}",
        f"{built} {what}, trained by seal_mini {__version__} (SEAL: diagnosis-weighted GRPO with an evolving "
        f"training-time interface) on {trained_on(cfg)}. Evaluation ran the unchanged tasks (no interface), "
        f"greedy. {base_text}",
        "## Training\n\n"
        f"- tasks: data.source {cfg.data.source}{_split_sizes(run_dir)}\n"
        f"- steps run: {steps} of {cfg.train.steps}; up to {cfg.train.tasks_per_step} tasks x {cfg.rollout.group_size} "
        f"rollouts per step; lr {cfg.train.lr}; KL {cfg.train.kl_coef}; clip {cfg.train.clip_ratio}\n"
        f"- LoRA rank {cfg.lora.rank}, alpha {cfg.lora.alpha}, on {', '.join(cfg.lora.target_modules)}; base "
        f"weights {'4-bit NF4' if cfg.model.load_in_4bit else 'unquantized'} during training\n"
        f"- reweighting {'on' if cfg.train.reweight else 'off'}; interface {interface}; rho update "
        f"{cfg.diagnosis.rho_update}; seed {cfg.seed}\n"
        f"- length limits: prompt {cfg.rollout.max_prompt_tokens}, message {cfg.rollout.max_new_tokens}, episode "
        f"{cfg.rollout.max_total_tokens} tokens\n"
        "- the full resolved recipe is `seal_mini_config.yaml` beside this card",
        f"## Held-in {'BFCL V3 multi-turn' if cfg.data.source == 'bfcl' else cfg.data.source} tasks (success, %)\n\n"
        + results_table(run_dir),
        "## Out-of-distribution suites\n\n" + suites_table(run_dir),
        "## Use\n\n" + use,
    ]
    return "\n\n".join(s.rstrip("\n") for s in sections) + "\n"


# --- saving a model so that AutoTokenizer reads it right -----------------------------------------------


def as_llama(model):
    """The same function in Llama's form: Qwen2 is Llama with biased q, k and v projections, so a Llama with
    attention biases and a zero o_proj bias computes exactly what the Qwen2 did."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    assert not getattr(c, "use_sliding_window", False), "a sliding-window Qwen2 has no Llama form"
    config = LlamaConfig(
        **{k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")},
        **{k: getattr(c, k) for k in ("num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps")},
        **{k: getattr(c, k) for k in ("max_position_embeddings", "rope_parameters", "tie_word_embeddings")},
        **{k: getattr(c, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        attention_bias=True,
        mlp_bias=False,
    )
    state = dict(model.state_dict())
    for i in range(c.num_hidden_layers):
        state[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(c.hidden_size, dtype=model.dtype)
    llama = LlamaForCausalLM(config).to(model.dtype)
    llama.load_state_dict(state, strict=True)
    llama.generation_config = model.generation_config
    return llama.eval()


def _reads_back(folder: Path, tokenizer) -> bool:
    """Whether AutoTokenizer loads the folder's tokenizer with the same ids and chat template as `tokenizer`."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(folder))
    ids = [t.encode(TOKENIZER_PROBE, add_special_tokens=False) for t in (auto, tokenizer)]
    return ids[0] == ids[1] and len(auto) == len(tokenizer) and auto.chat_template == tokenizer.chat_template


def save_model(model, tokenizer, folder: Path) -> bool:
    """Weights, config and tokenizer into `folder`, loadable by AutoModelForCausalLM and AutoTokenizer with the
    run's own token ids. AutoTokenizer rebuilds the tokenizer of every qwen2 model with Qwen's pre-tokenizer,
    which cuts a tokenizer trained here (engine/scratch.py, engine/tiny.py) differently; such a model is saved
    in its Llama form (as_llama), whose tokenizer AutoTokenizer reads from the folder's tokenizer.json.
    Returns whether it was saved in that form."""
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    settings = read_json(folder / "tokenizer_config.json")
    for how_it_was_loaded in ("is_local", "local_files_only"):  # not settings of the tokenizer
        settings.pop(how_it_was_loaded, None)
    write_json(folder / "tokenizer_config.json", settings)
    llama = not _reads_back(folder, tokenizer) and model.config.model_type == "qwen2"
    if llama:
        as_llama(model).save_pretrained(str(folder))
    if not _reads_back(folder, tokenizer):
        raise ConfigError(
            f"{folder}: AutoTokenizer does not read this tokenizer as the run's ({type(tokenizer).__name__}); "
            "load it with PreTrainedTokenizerFast.from_pretrained, never with AutoTokenizer"
        )
    return llama


# --- export -------------------------------------------------------------------------------------------

BASE_DIR = "base"
"""The export's subfolder for a base that exists only in the run (tiny-random, a warm start)."""


def base_model(cfg: Config) -> str:
    """The model the adapter was trained on: the run's warm start (sft.enabled) or model.name."""
    return str(warm_start_dir(cfg)) if cfg.sft.enabled else cfg.model.name


def _unquantized(cfg: Config) -> Config:
    cfg = copy.deepcopy(cfg)
    cfg.model.load_in_4bit = cfg.model.cpu_4bit = False  # merging into 4-bit weights would round the adapter away
    return cfg


def export_adapter(run_dir: Path, out: Path, force: bool = False) -> Path:
    """Copy the trained adapter, naming a base that loads from anywhere, with its model card and the run's
    recipe beside it; a base only the run has (tiny-random, a warm start) goes into out/base."""
    cfg = run_config(run_dir)
    adapter = trained_adapter(run_dir)
    adapter_config = read_json(adapter / "adapter_config.json", f"finish or resume the training of {run_dir}")
    model_card(run_dir, cfg, cfg.model.name)  # each run file the card reads is checked before anything is built
    base = base_model(cfg)
    travels = base == TINY or (Path(base) / "identity.json").is_file()  # built by the kit: nowhere else
    if travels:
        base = str(out.resolve() / BASE_DIR)
    elif Path(base).exists():
        base = str(Path(base).resolve())
    with new_dir(writable(out, force)) as tmp:
        shutil.copyfile(adapter / "adapter_model.safetensors", tmp / "adapter_model.safetensors")
        write_json(tmp / "adapter_config.json", {**adapter_config, "base_model_name_or_path": base})
        if travels:
            model, tokenizer = load_hf_base(_unquantized(cfg), torch.device("cpu"), torch.float32)
            llama = save_model(model, tokenizer, tmp / BASE_DIR)
        card = model_card(run_dir, cfg, base, beside={"llama": llama} if travels else None)
        atomic_write_text(tmp / "README.md", card)
        shutil.copyfile(run_dir / "config.yaml", tmp / EXPORT_MARK)
    return out


def export_merged(run_dir: Path, out: Path, dtype: str = "float32", device: str = "cpu", force: bool = False) -> Path:
    """The base with the adapter merged in float32, saved in `dtype` (never 4-bit) as a plain transformers
    model; the card states the log-prob gap to the unmerged adapter on the run's first held-in prompt."""
    from peft import PeftModel

    cfg = run_config(run_dir)
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: choose from {sorted(DTYPES)}")
    writable(out, force)
    base, tokenizer = load_hf_base(_unquantized(cfg), torch.device(device), torch.float32)
    model = PeftModel.from_pretrained(base, str(trained_adapter(run_dir))).eval()
    (task,) = tasks_for([first_held_in(run_dir, cfg)], "split.json", cfg)
    prompt = ChatRenderer(tokenizer, cfg.model.tool_format).prompt_ids(*Episode(task).reset())  # as the run renders it
    ids = torch.tensor([prompt[:MERGE_GAP_TOKENS]], device=device)  # (1, T)
    ones, scored = torch.ones_like(ids), torch.ones_like(ids, dtype=torch.float32)
    scored[:, 0] = 0  # the first token has no context
    with torch.no_grad():
        before = token_logprobs(model, ids, ones, scored)
        model = model.merge_and_unload().to(DTYPES[dtype])
        after = token_logprobs(model, ids, ones, scored)
    gap = float((after.float() - before).abs().max())
    with new_dir(out) as tmp:
        llama = save_model(model, tokenizer, tmp)
        merged = {"dtype": dtype, "gap": gap, "tokens": ids.shape[1], "llama": llama}
        atomic_write_text(tmp / "README.md", model_card(run_dir, cfg, base_model(cfg), merged=merged))
        shutil.copyfile(run_dir / "config.yaml", tmp / EXPORT_MARK)
    return out


def push(folder: Path, repo: str) -> str:
    """Upload a folder to the Hugging Face Hub (creating a private repo if needed); returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, private=True, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="seal_mini export")
    return f"https://huggingface.co/{repo}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini export", description="export a trained adapter")
    parser.add_argument("run_dir", help="runs/<name>, a finished training run")
    parser.add_argument("--out", help="adapter folder to write (default RUN_DIR/export)")
    parser.add_argument("--merged", metavar="OUT", help="also write the base with the adapter merged in here")
    parser.add_argument("--dtype", default="float32", help="merged weights' dtype: float32 | bfloat16 | float16")
    parser.add_argument("--device", default="cpu", help="where to merge (the base in float32: 4 bytes a parameter)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="upload the adapter (and REPO-merged) to the Hub")
    parser.add_argument("--force", action="store_true", help="replace an --out / --merged folder that is not an export")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    run_config(run_dir)  # a clear error for a folder that is not a run, before taking its lock
    out = writable(Path(args.out) if args.out else run_dir / "export", args.force)
    if args.merged:
        writable(Path(args.merged), args.force)  # both destinations checked before anything is written
    with run_lock(run_dir, " ".join([parser.prog, *argv])):  # no training may rewrite the adapter meanwhile
        export_adapter(run_dir, out, args.force)
        print(f"[export] adapter and model card: {out}")
        summary = {"adapter": str(out)}
        if args.merged:
            merged = export_merged(run_dir, Path(args.merged), args.dtype, args.device, args.force)
            print(f"[export] merged {args.dtype} model: {merged} (its README.md states the log-prob gap)")
            summary["merged"] = str(merged)
    if args.push_to_hub:
        summary["hub"] = push(out, args.push_to_hub)
        if args.merged:
            summary["hub_merged"] = push(Path(args.merged), f"{args.push_to_hub}-merged")
        print(f"[export] uploaded: {summary['hub']}")
    print(json.dumps(summary))
    return 0
