"""Command line: python -m seal_mini COMMAND [args], or `seal-mini COMMAND [args]` where the package is
installed (pyproject.toml's console script). Each command lives in its own module."""

from __future__ import annotations

import importlib
import os
import sys

from seal_mini.config import ConfigError
from seal_mini.runio import FileError

# command -> (module in seal_mini[:function, default main], one-line help). Imported lazily: `oracle` needs no torch.
COMMANDS = {
    "pipeline": ("programs.pipeline", "train -> evaluate -> report for a recipe (what run.sh runs)"),
    "sft": ("programs.pipeline:sft_command", "build a recipe's warm start: supervised fine-tuning on demonstrations"),
    "train": ("programs.pipeline:train_command", "SEAL training for a recipe, or --resume RUN_DIR"),
    "sweep": ("programs.sweep", "a recipe (and --ablations) over --seeds N, one table with mean and spread"),
    "probe": (
        "programs.probe",
        "what RL starts from on a recipe's warm start: success, mixed groups, labels, weights, each cue's effect",
    ),
    "eval": ("programs.eval", "held-in BFCL V3 evaluation of a model, adapter or scripted policy"),
    "report": ("programs.pipeline:report_command", "markdown report with plots from run directories"),
    "oracle": ("checks.oracle", "replay ground truth / empty / drop-last-call policies through the env"),
    "diagnose-check": ("checks.diagnose_check", "inject faults into ground-truth episodes and check the diagnoser"),
    "dataset": ("programs.dataset", "write a run's rollouts, turn labels and evaluations as Parquet (HF datasets)"),
    "export": ("programs.export", "the trained adapter with a model card; --merged for a merged model; --push-to-hub"),
    "chat": ("programs.chat", "play one BFCL task with the trained agent (or the backbone), turn by turn"),
    "bench": (
        "checks.bench",
        "benchmarks that print numbers (rollout: batched vs one at a time; ranks: 1 process vs N)",
    ),
    "preflight": ("checks.preflight", "memory and speed of a recipe on this machine, random weights, no download"),
    "gpu-check": (
        "checks.gpu_check",
        "the main recipe proven on one card in minutes: one JSON of every stage (--dry-run on the CPU)",
    ),
}


DATA_PARALLEL = ("pipeline", "train", "eval")
"""Commands that run on several ranks under torchrun (seal_mini.distributed)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m seal_mini COMMAND [args]   (installed: seal-mini COMMAND [args])\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<16} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    # Rollouts hold one large KV block per layer, then the update allocates activations of every length.
    # With fixed-size segments the CUDA allocator cannot hand one's freed memory to the other unless the
    # sizes match, and reserved-but-unusable memory piles up; expandable segments grow and shrink in
    # place. Read when CUDA first allocates, so it is set here, before any command runs.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    module, _, function = COMMANDS[argv[0]][0].partition(":")
    command = getattr(importlib.import_module(f"seal_mini.{module}"), function or "main")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun started this process as one of several ranks
        if argv[0] not in DATA_PARALLEL:
            print(f"error: {argv[0]} runs in one process; start it without torchrun", file=sys.stderr)
            return 2
        from seal_mini import distributed

        return distributed.run_command(command, argv[1:])
    try:
        return command(argv[1:])
    except (ConfigError, FileError, OSError) as e:  # a wrong setting, a damaged file, a full disk: one line
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
