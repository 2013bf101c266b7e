"""`python -m seal_mini gpu-check --out DIR [--dry-run] [--tokenizer DIR]`: the main recipe proven on one card.

Made to be run the day a GPU is at hand, on a bare machine with no network, in under 8 minutes on one
H100-class card, with nothing left to write. It runs a fixed sequence of stages, each under its own time cap
(STAGES), goes on past a stage that fails (its traceback is recorded), and writes DIR/gpu_check.json (the
stages under "stages", rewritten after each one, so a cut run keeps what it did) and DIR/gpu_check.log:
  environment        torch / CUDA / driver / capability, bf16, bitsandbytes and its CUDA library, the
                     versions against the kit's supported ranges;
  preflight          `preflight` of qwen2_5_3b at --gpu-mem-gb 24 and 16, qwen2_5_7b, toolace2 and
                     qwen3_5_4b at 24;
  train_steps        two training steps of qwen2_5_3b's whole code path (4-bit + LoRA, BFCL prompts,
                     rollouts, checker, diagnosis, update, checkpoint) with random weights of its real
                     shape: seconds and peak allocated / reserved memory per phase;
  engine_vs_generate the engine's greedy tokens against `model.generate`'s on real-length prompts, bf16
                     and 4-bit, and the tokens per second of both;
  unsloth            the design card's GPU loader through the engine: run, or the refusal and its reason;
  out_of_memory      a rollout wave under a memory cap too small for it, recovered as training recovers;
  resume             a training run killed (SIGKILL) after its first checkpoint and started again, against
                     the same run uninterrupted: bit-exact or the largest difference.
`--dry-run` runs the same stages on the CPU at tiny shapes in a few minutes (CI runs it, so the check cannot
rot); its JSON has the same keys. Without a GPU and without --dry-run it refuses in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from functools import cached_property, partial
from pathlib import Path

import torch

from seal_mini.config import ConfigError, load_config
from seal_mini.engine.device import cap_memory, nvidia_smi, peak_memory, reset_peak, supported_versions, uncap_memory
from seal_mini.runio import read_metrics, write_json

MAIN = "recipes/qwen2_5_3b.yaml"
PREFLIGHTS = (
    (MAIN, 24),
    (MAIN, 16),
    ("recipes/qwen2_5_7b.yaml", 24),
    ("recipes/toolace2_llama3_1_8b.yaml", 24),
    ("recipes/qwen3_5_4b.yaml", 24),  # the hybrid: linear layers' states beside the KV, 4-bit on a card
)
"""(recipe, --gpu-mem-gb) of the preflight stage."""
SMALL = ["rollout.group_size=4", "rollout.max_concurrent=8", "train.tasks_per_step=2", "train.mini_batch_tasks=1"]
"""Settings that keep each stage to a few minutes: fewer episodes, the recipe's own lengths and model."""
DRY = ["device=cpu", "model.load_in_4bit=false"]
"""--dry-run: the CPU at tiny shapes (the model is shrunk as preflight shrinks it, its vocabulary the tiny
tokenizer's), and on top of these, short messages where the stage runs the recipe's own code (DRY_LENGTHS)."""
DRY_LENGTHS = [
    "rollout.max_new_tokens=8",
    "rollout.max_response_tokens=64",
    "rollout.group_size=2",
    "model.gradient_checkpointing=false",
]
TRAIN = ["train.steps=2", "train.save_every=1", "train.eval_every=0", "data.max_train_tasks=4", "ood.suites=[]"]
"""Two steps of two tasks, a checkpoint after each, no evaluation."""


class StageTimeout(BaseException):
    """A stage ran past its cap (a BaseException: the `except Exception` of the code under test cannot
    swallow it)."""


@contextlib.contextmanager
def time_cap(seconds: int):
    """Raise StageTimeout in the block after `seconds` (SIGALRM: between Python operations, so a CUDA kernel
    already launched finishes first)."""

    def expire(signum, frame):
        raise StageTimeout(f"over its cap of {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Check:
    """What the stages share: where to write, the device, the random-weight model of the main recipe."""

    def __init__(self, out: Path, dry: bool, tokenizer: str):
        self.out, self.dry, self.tokenizer_dir = out, dry, tokenizer
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.device = torch.device("cpu" if dry else "cuda")
        self.partial: dict = {}
        """What the running stage has measured so far: kept when it fails or runs past its cap."""

    def overrides(self, *more: str, lengths: bool = True) -> list[str]:
        """The stage's settings: SMALL, the device (DRY on a dry run, with DRY_LENGTHS unless `lengths` is
        False: preflight shrinks lengths itself), then `more`."""
        device = [*DRY, *(DRY_LENGTHS if lengths else [])] if self.dry else ["device=cuda"]
        return [*SMALL, *device, *more]

    @cached_property
    def model(self) -> Path:
        """The main recipe's architecture with random weights, written once (shrunk on a dry run)."""
        from transformers import AutoTokenizer

        from seal_mini.checks.preflight import architecture, write_random_model
        from seal_mini.engine.tiny import tiny_tokenizer

        folder = self.work / "qwen2_5_3b_random"
        shape = architecture(load_config(MAIN), shrink=self.dry)
        # a local Qwen2.5 tokenizer folder if one was given (the real vocabulary: BFCL prompts at their real
        # token lengths), else the kit's tiny ChatML tokenizer (the same texts, more tokens)
        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir) if self.tokenizer_dir else tiny_tokenizer()
        if self.dry:  # a vocabulary of the tokenizer's size: the CPU's logits stay small
            shape["vocab_size"] = len(tokenizer)
        folder.mkdir(parents=True, exist_ok=True)
        write_random_model(shape, folder, tokenizer, self.device)
        return folder


# --- the stages ------------------------------------------------------------------------------------------


def environment(check: Check) -> dict:
    """What the machine has: versions, the card, bf16, bitsandbytes' CUDA library, unsloth."""
    import peft
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "versions": supported_versions() or "within the supported ranges",
        "cuda_available": torch.cuda.is_available(),
        **dict.fromkeys(("gpu", "capability", "gpu_memory_gb", "bf16", "driver")),  # a dry run: no card
    }
    if torch.cuda.is_available():
        props, gpus = torch.cuda.get_device_properties(0), nvidia_smi()
        out |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "gpu_memory_gb": round(props.total_memory / 2**30, 1),
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False),
            "driver": gpus[0].driver if gpus else "unknown",
        }
    try:
        import bitsandbytes
        from bitsandbytes import cextension

        out["bitsandbytes"] = bitsandbytes.__version__
        library = getattr(getattr(cextension, "lib", None), "_name", "") or str(getattr(cextension, "lib", ""))
        out["bitsandbytes_library"] = Path(library).name if library else "none"
        out["bitsandbytes_cuda"] = "cuda" in library.lower()
    except Exception as e:  # noqa: BLE001 - recorded: the 4-bit stages then fail and say so
        out["bitsandbytes"] = f"not usable: {type(e).__name__}: {e}"
    out["unsloth"] = "installed" if importlib.util.find_spec("unsloth") else "not installed"
    return out


def preflights(check: Check) -> dict:
    """`preflight` of the recipes at the card sizes they are meant for (uncapped on a dry run)."""
    from seal_mini.checks.preflight import preflight

    out = check.partial
    for recipe, gigabytes in PREFLIGHTS:
        key = f"{Path(recipe).stem}@{gigabytes}gb"
        try:
            cfg = load_config(recipe, check.overrides(lengths=False))
            result, problems = preflight(cfg, 0 if check.dry else gigabytes)
            keep = ("fits", "parameters_b", "load", "rollout", "update_typical", "update_max", "projection")
            out[key] = {k: result[k] for k in keep if k in result} | {"problems": problems}
        except Exception:  # noqa: BLE001 - one recipe's failure is recorded, the next still runs
            out[key] = {"fits": False, "traceback": traceback.format_exc()}
        finally:
            uncap_memory(check.device)
    return out | {"failures": [k for k, v in out.items() if "traceback" in v]}


@contextlib.contextmanager
def measured(module, names: list[str], device: torch.device, into: dict):
    """Wrap module.<name> for each name: seconds and peak memory of every call, summed and maxed into
    `into[name]` (peak allocated / reserved on a GPU, the process's peak resident memory on the CPU)."""
    originals = {name: getattr(module, name) for name in names}

    def wrap(name: str, fn: Callable):
        def call(*args, **kwargs):
            reset_peak(device)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds, peak = time.perf_counter() - started, peak_memory(device)
                phase = into.setdefault(name, {"calls": 0, "seconds": 0.0})
                phase["calls"] += 1
                phase["seconds"] = round(phase["seconds"] + seconds, 2)
                for k, v in peak.items():
                    phase[k] = max(phase.get(k, 0.0), v)

        return call

    for name, fn in originals.items():
        setattr(module, name, wrap(name, fn))
    try:
        yield into
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def train_steps(check: Check) -> dict:
    """Two steps of the main recipe's loop on its random-weight model: per phase, time and peak memory."""
    from seal_mini.training import checkpoint
    from seal_mini.training import train as train_module

    cfg = load_config(MAIN, check.overrides(*TRAIN, f"model.name={check.model}", f"out_dir={check.work}", "name=steps"))
    phases: dict = {}
    with (
        measured(train_module, ["run_rollouts", "score", "diagnose_turns", "update"], check.device, phases),
        measured(checkpoint, ["save_checkpoint"], check.device, phases),
    ):
        train_module.train(cfg, restart=True)
    rows = read_metrics(cfg.run_dir)
    keys = ("step", "charts/reward", "charts/episode_tokens_mean", "charts/truncated_frac", "time/step_s")
    return {
        "tokenizer": check.tokenizer_dir or "the kit's tiny ChatML tokenizer",
        "four_bit": cfg.model.load_in_4bit,
        "phases": phases,
        "steps": [{k: r.get(k) for k in keys} for r in rows],
    }


def engine_vs_generate(check: Check) -> dict:
    """Greedy tokens of the engine and of `model.generate` on three real-length BFCL prompts, stop tokens
    suppressed on both sides so each writes the same number; tokens per second of both. bf16 and 4-bit
    (on a dry run float32 and the CPU's 4-bit)."""
    out = {}
    for kind, four_bit in (("bf16", False), ("4bit", True)):
        extra = ["model.cpu_4bit=true", "model.load_in_4bit=true"] if check.dry and four_bit else []
        extra += [] if check.dry else [f"model.load_in_4bit={str(four_bit).lower()}"]
        cfg = load_config(MAIN, check.overrides(f"model.name={check.model}", *extra))
        out[kind] = _compare_greedy(cfg, new_tokens=8 if check.dry else 64)
    return out


def _compare_greedy(cfg, new_tokens: int) -> dict:
    from seal_mini.engine.policy import load_policy
    from seal_mini.engine.rollout import run_rollouts
    from seal_mini.envs.bfcl import load_tasks
    from seal_mini.envs.episode import Episode

    policy = load_policy(cfg, banner=False)
    stops = sorted(policy.renderer.stop_ids)
    # real BFCL first prompts of 3 categories; the response budget ends each episode after its first message
    envs = [Episode(task) for task in load_tasks()[::270][:3]]
    cfg.rollout.max_new_tokens, cfg.rollout.max_response_tokens = new_tokens, new_tokens
    cfg.rollout.max_prompt_tokens = cfg.rollout.max_total_tokens - new_tokens - 8

    def no_stop(rows, sampled, logits):
        logits[:, stops] = float("-inf")
        return logits

    started = time.perf_counter()
    trajs = run_rollouts(policy, envs, cfg.rollout, 0.0, cfg.seed, logits_hook=no_stop)
    engine_s = time.perf_counter() - started
    engine = [[t for t, m in zip(tr.input_ids, tr.loss_mask, strict=True) if m] for tr in trajs]
    generated, generate_s = [], 0.0
    for tr in trajs:
        ids = torch.tensor([tr.input_ids[: tr.prompt_len]], device=policy.device)
        started = time.perf_counter()
        with torch.no_grad():
            output = policy.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                suppress_tokens=stops,
                pad_token_id=policy.renderer.pad_id,
            )
        generate_s += time.perf_counter() - started
        generated.append(output[0, ids.shape[1] :].tolist())
    return {
        "prompt_tokens": [tr.prompt_len for tr in trajs],
        "same_tokens": f"{sum(e == g for e, g in zip(engine, generated, strict=True))}/{len(trajs)}",
        "engine_tok_per_s": round(sum(len(e) for e in engine) / engine_s, 1),
        "generate_tok_per_s": round(sum(len(g) for g in generated) / generate_s, 1),
        "engine_s": round(engine_s, 2),
        "generate_s": round(generate_s, 2),
        "first_difference": next(
            ({"engine": e[:12], "generate": g[:12]} for e, g in zip(engine, generated, strict=True) if e != g), None
        ),
    }


def unsloth(check: Check) -> dict:
    """The design card's GPU loader (model.backend: unsloth) through one rollout: it runs, or the engine's
    refusal and its reason are recorded."""
    if importlib.util.find_spec("unsloth") is None:
        return {"result": "not installed: SEAL_MINI_UNSLOTH=1 bash run.sh (with network) installs it"}
    from seal_mini.checks.preflight import SyntheticEpisode
    from seal_mini.engine.policy import load_policy
    from seal_mini.engine.rollout import run_rollouts

    cfg = load_config(MAIN, check.overrides(f"model.name={check.model}", "model.backend=unsloth"))
    try:
        policy = load_policy(cfg, banner=False)
        run_rollouts(policy, [SyntheticEpisode("u", "Hello.", "ok", calls=1)], cfg.rollout, 0.0, cfg.seed)
    except ConfigError as e:  # the engine's refusal: what unsloth's forward does to the KV cache
        return {"result": "refused", "reason": str(e)}
    return {"result": "ran one rollout through the engine"}


@contextlib.contextmanager
def squeezed(check: Check, policy):
    """Memory for a few episodes at once, not 32: on a card, a cap at the weights plus 3 GB (a few 16k-token
    slots of KV); on a dry run, an out-of-memory error for every forward of more than 2 rows."""
    if check.dry:

        def too_many_rows(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] > 2:
                raise torch.OutOfMemoryError("CUDA out of memory (injected: more than 2 rows)")

        release = policy.model.get_base_model().model.register_forward_pre_hook(too_many_rows, with_kwargs=True).remove
    else:
        cap_memory(torch.cuda.memory_allocated(check.device) / 2**30 + 3.0, check.device)
        release = partial(uncap_memory, check.device)
    try:
        yield
    finally:
        release()


def out_of_memory(check: Check) -> dict:
    """A rollout wave asked to hold 32 episodes where memory fits a few (`squeezed`): the engine's recovery
    (fewer episodes at once) must finish every one."""
    from seal_mini.checks.preflight import SyntheticEpisode
    from seal_mini.engine.policy import load_policy
    from seal_mini.engine.rollout import run_rollouts

    cfg = load_config(MAIN, check.overrides(f"model.name={check.model}", "rollout.max_concurrent=32"))
    policy = load_policy(cfg, banner=False)
    envs = [SyntheticEpisode(f"o{k}", "Please help. " * 50, "ok " * 20, calls=2) for k in range(32)]
    with squeezed(check, policy):
        trajs = run_rollouts(policy, envs, cfg.rollout, 1.0, cfg.seed)
    return {
        "episodes": len(trajs),
        "finished": sum(t.env.done for t in trajs),
        "max_concurrent_after": policy.limits.max_concurrent,
        "prefill_tokens_after": policy.limits.prefill_tokens,
    }


def resume(check: Check) -> dict:
    """The two-step run of train_steps started again in a subprocess, killed (SIGKILL) as soon as its first
    checkpoint is on disk, and the same command run again; its adapter against the uninterrupted run
    (train_steps', or one run here when that stage did not finish)."""
    from safetensors.torch import load_file

    overrides = check.overrides(*TRAIN, f"model.name={check.model}", f"out_dir={check.work}")
    command = [sys.executable, "-m", "seal_mini", "train", MAIN, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    straight_dir = check.work / "steps"
    if not (straight_dir / "adapter" / "adapter_model.safetensors").exists():
        straight = subprocess.run([*command, "name=steps", "--restart"], capture_output=True, text=True, env=env)
        if straight.returncode:
            raise RuntimeError(f"the uninterrupted run failed: {straight.stderr[-2000:]}")
    killed_dir = check.work / "killed"
    with open(check.work / "killed.log", "w") as log:  # a pipe nobody reads would block the child
        proc = subprocess.Popen([*command, "name=killed", "--restart"], stdout=log, stderr=log, env=env)
        try:
            while proc.poll() is None and not (killed_dir / "checkpoint" / "step_0001" / "state.json").exists():
                time.sleep(0.2)
            killed_at = "after its first checkpoint" if proc.poll() is None else "it had ended before the kill"
        finally:  # never leave a training process on the card
            proc.kill()
            proc.wait()
    again = subprocess.run([*command, "name=killed"], capture_output=True, text=True, env=env)
    if again.returncode:
        raise RuntimeError(f"the rerun after the kill failed: {again.stderr[-2000:]}")
    a = load_file(str(straight_dir / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(killed_dir / "adapter" / "adapter_model.safetensors"))
    diff = max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
    return {
        "killed": killed_at,
        "bit_exact": all(torch.equal(a[k], b[k]) for k in a) and set(a) == set(b),
        "max_abs_difference": diff,
        "continued_from": "checkpoint of step 1" if "checkpoint of step 1" in again.stdout else again.stdout[-300:],
    }


STAGES: tuple[tuple[str, Callable[[Check], dict], int], ...] = (
    ("environment", environment, 20),
    ("preflight", preflights, 200),
    ("train_steps", train_steps, 80),
    ("engine_vs_generate", engine_vs_generate, 45),
    ("unsloth", unsloth, 20),
    ("out_of_memory", out_of_memory, 30),
    ("resume", resume, 85),
)
"""(name, stage, its time cap in seconds): 480 s at most on a card, the process's own start aside."""


# --- the program -----------------------------------------------------------------------------------------


class _Tee:
    """Writes to a stream and to the log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def run_check(out: Path, dry: bool, tokenizer: str = "", only: list[str] | None = None) -> dict:
    """Every stage (or those named), each under its cap; the JSON is rewritten after each."""
    check = Check(out, dry, tokenizer)
    result = {"check": {"dry_run": dry, "device": str(check.device), "started": time.strftime("%Y-%m-%d %H:%M:%S")}}
    result["stages"] = {}
    for name, stage, cap in STAGES:
        if only and name not in only:
            continue
        print(f"[gpu-check] {name} (cap {cap} s)", flush=True)
        started, check.partial = time.perf_counter(), {}
        try:
            with time_cap(cap if not dry else 10 * cap):  # a dry run's CPU is slower than any card
                value = stage(check)
            status = "failed" if value.get("failures") else "ok"
        except (Exception, StageTimeout) as e:  # noqa: BLE001 - a failing stage is recorded, the next one runs
            value = {**check.partial, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            status = "timed out" if isinstance(e, StageTimeout) else "failed"
        result["stages"][name] = {"status": status, "seconds": round(time.perf_counter() - started, 1), **value}
        print(f"[gpu-check] {name}: {status} in {result['stages'][name]['seconds']} s", flush=True)
        write_json(out / "gpu_check.json", result)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.log and the work files")
    parser.add_argument("--dry-run", action="store_true", help="the same stages on the CPU at tiny shapes")
    parser.add_argument("--tokenizer", default="", help="a local Qwen2.5 tokenizer folder (the real vocabulary)")
    parser.add_argument("--stages", nargs="+", choices=[name for name, _, _ in STAGES], help="only these")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise ConfigError("gpu-check: no CUDA GPU is visible here; run it on the card's machine, or --dry-run here")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.log", "a", encoding="utf-8") as log:
        with contextlib.redirect_stdout(_Tee(sys.stdout, log)), contextlib.redirect_stderr(_Tee(sys.stderr, log)):
            result = run_check(out, args.dry_run, args.tokenizer, args.stages)
    failed = [n for n, s in result["stages"].items() if s["status"] != "ok"]
    print(json.dumps({"gpu_check": str(out / "gpu_check.json"), "failed": failed}))
    return 1 if failed else 0
