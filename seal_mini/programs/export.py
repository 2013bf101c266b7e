"""Take a trained agent out of its run directory: the LoRA adapter with a model card, optionally merged.

    python -m seal_mini export RUN_DIR                      # RUN_DIR/export: adapter + README.md card
    python -m seal_mini export RUN_DIR --merged OUT          # also base + adapter merged, for serving
    python -m seal_mini export RUN_DIR --push-to-hub USER/NAME   # upload (only when asked)

The adapter folder is peft's own format, so it loads as is:
  transformers + peft   PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), "RUN_DIR/export")
  vLLM                  LLM(BASE, enable_lora=True) ... LoRARequest("seal", 1, "RUN_DIR/export")
The merged folder is a plain transformers model (weights, tokenizer and chat template) that any server
loads without peft. The adapter was trained on top of 4-bit (NF4) base weights; merging adds it to the
unquantized base in --dtype, which is what serving stacks do, so the merged model's log-probs differ
from the training policy's by the quantization error of the base (not by the adapter).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
from pathlib import Path

import yaml

from seal_mini import __version__
from seal_mini.config import CATEGORIES, Config, ConfigError, config_from_dict, saved_config
from seal_mini.engine.policy import ADAPTER_FILES, SCRATCH
from seal_mini.runio import atomic_write_text, check_model_folder, new_dir, read_json, read_metrics, run_lock

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
        hint = f"finish training first (python -m seal_mini train --resume {run_dir})"
        raise ConfigError(f"{adapter}: no trained adapter ({', '.join(missing)} missing); {hint}")
    check_model_folder(
        adapter, ADAPTER_FILES, f"restore it, or train again (python -m seal_mini train --resume {run_dir})"
    )
    return adapter


# --- the model card ----------------------------------------------------------------------------------


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def results_table(run_dir: Path) -> str:
    """Held-in BFCL V3 success per category, backbone vs trained, from the run's eval/*.json."""
    paths = {tag: run_dir / "eval" / f"{tag}.json" for tag in ("base", "adapter")}
    evals = {tag: read_json(path) for tag, path in paths.items() if path.exists()}
    if not evals:
        return "_No held-in evaluation in this run yet._\n"
    header = "| policy | " + " | ".join(CATEGORIES) + " | mean |\n|---|" + "---|" * (len(CATEGORIES) + 1) + "\n"
    rows = []
    for tag, e in evals.items():
        cells = [_pct(e["success"].get(c)) for c in (*CATEGORIES, "mean")]
        rows.append(f"| {'backbone' if tag == 'base' else 'trained adapter'} | " + " | ".join(cells) + " |")
    return header + "\n".join(rows) + "\n"


def suites_table(run_dir: Path) -> str:
    """Out-of-distribution suites the run evaluated (eval/<suite>_{base,adapter}.json)."""
    lines = []
    for path in sorted((run_dir / "eval").glob("*.json")):
        result = read_json(path)
        if isinstance(result, dict) and "suite" in result:
            scores = ", ".join(f"{k} {_pct(v)}" for k, v in result.get("scores", {}).items())
            lines.append(f"- `{result.get('tag', path.stem)}` ({result['suite']}): {scores or 'no columns scored'}")
    return "\n".join(lines) + "\n" if lines else "_None evaluated._\n"


def model_card(run_dir: Path, cfg: Config, base_model: str, merged: bool = False) -> str:
    """README.md for an export: what it is, how it was trained, what it scored, how to load it."""
    steps = max((m["step"] for m in read_metrics(run_dir)), default=-1) + 1
    if not cfg.interface.enabled:
        interface = "off"
    else:
        interface = "on (closed loop)" if cfg.interface.closed_loop else "on (open loop)"
    front = {"base_model": base_model, "tags": ["seal_mini", "tool-use", "bfcl", "grpo", "lora"]}
    if not merged:
        front["library_name"] = "peft"
    what = "merged into its base weights" if merged else "a LoRA adapter"
    # a tokenizer trained here: AutoTokenizer would rebuild it with Qwen's pre-tokenizer (engine.policy.load_tokenizer)
    tok = "PreTrainedTokenizerFast" if cfg.model.name == SCRATCH else "AutoTokenizer"
    if merged:
        use = (
            f"```python\nfrom transformers import AutoModelForCausalLM, {tok}\n\n"
            'model = AutoModelForCausalLM.from_pretrained("<this folder or repo>")\n'
            f'tokenizer = {tok}.from_pretrained("<this folder or repo>")\n```\n'
        )
    else:
        use = (
            f"```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM, {tok}\n\n"
            f'base = AutoModelForCausalLM.from_pretrained("{base_model}")\n'
            'model = PeftModel.from_pretrained(base, "<this folder or repo>")\n'
            f'tokenizer = {tok}.from_pretrained("{base_model}")\n```\n\n'
            'With vLLM: `LLM(base, enable_lora=True)` and `LoRARequest("seal", 1, "<this folder>")` per request.\n'
        )
    sections = [
        "---\n" + yaml.safe_dump(front, sort_keys=False) + "---",
        f"# {cfg.name}",
        f"`{base_model}` with {what}, trained by seal_mini {__version__} (SEAL: diagnosis-weighted GRPO with an "
        "evolving training-time interface) on BFCL V3 multi-turn tool-use tasks. Evaluation ran the unchanged "
        "benchmark (no interface), greedy.",
        "## Training\n\n"
        f"- steps run: {steps} of {cfg.train.steps}; up to {cfg.train.tasks_per_step} tasks x {cfg.rollout.group_size} "
        f"rollouts per step; lr {cfg.train.lr}; KL {cfg.train.kl_coef}; clip {cfg.train.clip_ratio}\n"
        f"- LoRA rank {cfg.lora.rank}, alpha {cfg.lora.alpha}, on {', '.join(cfg.lora.target_modules)}; base "
        f"weights {'4-bit NF4' if cfg.model.load_in_4bit else 'unquantized'} during training\n"
        f"- reweighting {'on' if cfg.train.reweight else 'off'}; interface {interface}; rho update "
        f"{cfg.diagnosis.rho_update}; seed {cfg.seed}\n"
        "- the full resolved recipe is `seal_mini_config.yaml` beside this card",
        "## Held-in BFCL V3 multi-turn (success, %)\n\n" + results_table(run_dir),
        "## Out-of-distribution suites\n\n" + suites_table(run_dir),
        "## Use\n\n" + use,
    ]
    return "\n\n".join(s.rstrip("\n") for s in sections) + "\n"


# --- export -------------------------------------------------------------------------------------------


def export_adapter(run_dir: Path, out: Path, force: bool = False) -> Path:
    """Copy the trained adapter and write its model card and the run's recipe beside it."""
    cfg = run_config(run_dir)
    adapter = trained_adapter(run_dir)
    adapter_config = read_json(adapter / "adapter_config.json", f"finish or resume the training of {run_dir}")
    base_model = adapter_config.get("base_model_name_or_path") or cfg.model.name
    with new_dir(writable(out, force)) as tmp:
        for name in ADAPTER_FILES:
            shutil.copyfile(adapter / name, tmp / name)
        atomic_write_text(tmp / "README.md", model_card(run_dir, cfg, base_model))
        shutil.copyfile(run_dir / "config.yaml", tmp / EXPORT_MARK)
    return out


def export_merged(run_dir: Path, out: Path, dtype: str = "bfloat16", device: str = "cpu", force: bool = False) -> Path:
    """The base in `dtype` (never 4-bit) with the adapter merged in, saved as a plain transformers model."""
    import torch
    from peft import PeftModel

    from seal_mini.engine.device import DTYPES
    from seal_mini.engine.policy import load_hf_base

    cfg = copy.deepcopy(run_config(run_dir))
    cfg.model.load_in_4bit = False  # merging into 4-bit weights would round the adapter away
    cfg.model.cpu_4bit = False
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: choose from {sorted(DTYPES)}")
    writable(out, force)
    base, tokenizer = load_hf_base(cfg, torch.device(device), DTYPES[dtype])
    model = PeftModel.from_pretrained(base, str(trained_adapter(run_dir))).merge_and_unload()
    with new_dir(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        atomic_write_text(tmp / "README.md", model_card(run_dir, cfg, cfg.model.name, merged=True))
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
    parser.add_argument("--dtype", default="bfloat16", help="merged weights' dtype: bfloat16 | float16 | float32")
    parser.add_argument("--device", default="cpu", help="where to merge (cpu needs the base's size in RAM)")
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
            print(f"[export] merged {args.dtype} model: {merged}")
            summary["merged"] = str(merged)
    if args.push_to_hub:
        summary["hub"] = push(out, args.push_to_hub)
        if args.merged:
            summary["hub_merged"] = push(Path(args.merged), f"{args.push_to_hub}-merged")
        print(f"[export] uploaded: {summary['hub']}")
    print(json.dumps(summary))
    return 0
