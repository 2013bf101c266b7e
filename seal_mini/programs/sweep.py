"""`python -m seal_mini sweep RECIPE --seeds N [--ablations [NAME,...]]`: a recipe (and its ablations) over seeds.

Every run is the full pipeline (warm start, training, held-in evaluation, report) in its own run
directory under <out_dir>/<name>_sweep/, as its own process, placed by seal_mini.programs.placement: side by
side on GPU sets where there are GPUs, one after another on the CPU. Runs of one seed share the warm start
(seal_mini/training/sft.py reuses an identical one from a sibling run). An ablation flips the same switches it
flips in recipes/ablations/*.yaml, on top of the recipe given here: those files are read for their
keys, not their `base:`.

Resumable: a run whose final evaluation exists is not run again; a stopped run continues where it
stopped (the pipeline resumes). The table (sweep.md, sweep.json) gives, per variant, the held-in
success of the warm start and after training, mean and spread over the seeds, the paper's Table 3
beside them, and each run's wall time. It reports what it measures, whichever way it comes out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from seal_mini.config import ConfigError, load_config
from seal_mini.programs.placement import Job, failure_report, launch_command, run_placed, visible_gpus
from seal_mini.runio import atomic_write_text, read_json, read_yaml, run_lock, write_json

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: recipes/ablations/ lies there."""
ABLATIONS = ("vanilla_rl", "no_env_adaptation", "no_reweighting", "no_closed_loop")
"""recipes/ablations/<name>.yaml, in the order of the table."""
PAPER = {
    "warm start": ("backbone (Qwen2.5-7B-Instruct)", 14.00),
    "seal": ("SEAL", 40.25),
    "vanilla_rl": ("vanilla RL", 30.75),
    "no_env_adaptation": ("w/o environment-side adaptation", 35.75),
    "no_reweighting": ("w/o diagnosis-guided reweighting", 32.75),
    "no_closed_loop": ("w/o closed-loop update", 33.00),
}
"""The paper's Tables 1 and 3 (Qwen2.5-7B-Instruct, BFCL V3 multi-turn, mean of four categories, %)."""


def flatten(data: dict, prefix: str = "") -> list[str]:
    """A nested mapping as key.sub=value overrides (values written as YAML, as the command line reads them)."""
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, name + ".")
        else:
            out.append(f"{name}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}")
    return out


def ablation_overrides(name: str, folder: Path = ROOT / "recipes" / "ablations") -> list[str]:
    """The switches an ablation recipe flips, as overrides for any recipe (its base and name left out)."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"sweep: no ablation recipe {path}")
    data = read_yaml(path, "fix the ablation recipe") or {}
    data.pop("base", None)
    data.pop("name", None)
    data.get("ood", {}).pop("suites", None)  # the sweep never runs the out-of-distribution suites
    if not data.get("ood", True):
        data.pop("ood")
    return flatten(data)


def chosen_ablations(given: str | None) -> list[str]:
    """--ablations: absent = none, bare = all four, else the comma-separated names (in table order)."""
    if given is None:
        return []
    if given == "all":
        return list(ABLATIONS)
    if "=" in given:  # a bare --ablations swallows the word after it
        raise ConfigError(
            f"sweep: --ablations took the override {given!r} as its value; "
            "put key=value overrides before the flags: sweep RECIPE key=value --seeds N --ablations"
        )
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown or not names:
        raise ConfigError(
            f"sweep: --ablations {given!r}: unknown ablation {unknown[0] if unknown else '(none named)'}; "
            f"name some of {', '.join(ABLATIONS)} (comma-separated), or give --ablations alone for all four"
        )
    return [n for n in ABLATIONS if n in names]


def variants(ablations: list[str]) -> dict[str, list[str]]:
    """Variant name -> its overrides on top of the recipe: the recipe itself ("seal"), then the ablations."""
    return {"seal": [], **{name: ablation_overrides(name) for name in ablations}}


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation, min and max (in %)."""
    values = [100 * v for v in values]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def summarize(rows: list[dict]) -> dict:
    """Per variant: warm start and trained success (mean of categories) over seeds, and wall times."""
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        out[variant] = {
            "warm start": spread([r["base"]["mean"] for r in mine]),
            "trained": spread([r["adapter"]["mean"] for r in mine]),
            "delta": spread([r["adapter"]["mean"] - r["base"]["mean"] for r in mine]),
            "categories": {c: spread([r["adapter"][c] for r in mine]) for c in mine[0]["adapter"] if c != "mean"},
            "seconds": [round(r["seconds"], 1) for r in mine],
        }
    return out


def cell(s: dict) -> str:
    return f"{s['mean']:.1f} ± {s['sd']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"


def table(summary: dict, n_tasks: int) -> str:
    """The markdown table: ours (mean ± sd [min, max] over seeds) beside the paper's Table 3."""
    lines = [
        "| variant | held-in success after training | change vs warm start | wall time per run (s) | paper (7B) |",
        "|---|---|---|---|---|",
    ]
    first = next(iter(summary.values()))
    lines.append(f"| warm start | {cell(first['warm start'])} | - | - | {PAPER['warm start'][1]:.2f} |")
    for variant, s in summary.items():
        name, paper = PAPER.get(variant, (variant, None))
        seconds = ", ".join(f"{x:.0f}" for x in s["seconds"])
        paper_cell = f"{paper:.2f} ({name})" if paper is not None else "-"
        lines.append(f"| {variant} | {cell(s['trained'])} | {cell(s['delta'])} | {seconds} | {paper_cell} |")
    note = (
        f"\nSuccess rate (%), mean of the categories, on {n_tasks} held-in tasks, bare benchmark, greedy; "
        f"mean ± sample standard deviation [min, max] over {first['trained']['n']} seeds. The warm start row "
        "is the backbone every variant of a seed starts from. The paper's numbers are Qwen2.5-7B on BFCL V3 "
        "(Tables 1 and 3), beside ours for their direction only.\n"
    )
    return "\n".join(lines) + "\n" + note


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seal_mini sweep", description="a recipe and its ablations over seeds"
    )
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value, applied to every run")
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0..N-1 (each run takes minutes to hours)")
    parser.add_argument(
        "--ablations",
        nargs="?",
        const="all",
        metavar="NAME,...",
        help=f"also the ablations of recipes/ablations/: alone, all four; or some of {','.join(ABLATIONS)}",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        raise ConfigError("sweep: --seeds must be >= 1")
    args.ablations = chosen_ablations(args.ablations)
    base = load_config(args.recipe, args.overrides)  # a bad recipe or override fails here, before any run
    sweep_dir = Path(base.out_dir) / f"{base.name}_sweep"
    with run_lock(sweep_dir, "sweep"):  # two sweeps of one recipe would race for sweep.json and its runs
        return run_sweep(args, base, sweep_dir)


def run_sweep(args: argparse.Namespace, base, sweep_dir: Path) -> int:
    """Every run of the sweep that is not done yet, then the table from all of them."""
    record = sweep_dir / "sweep.json"
    seconds = read_json(record).get("seconds", {}) if record.exists() else {}

    # every run of the sweep, in table order; the ones whose final evaluation exists are done
    runs = []
    for seed in range(args.seeds):
        for variant, extra in variants(args.ablations).items():
            name = f"{base.name}_{variant}_seed{seed}"
            overrides = [*args.overrides, *extra, f"seed={seed}", f"name={name}", f"out_dir={sweep_dir}"]
            runs.append((variant, seed, name, load_config(args.recipe, overrides), overrides))
    todo = [r for r in runs if not (r[3].run_dir / "eval" / "adapter.json").exists()]
    jobs = [
        Job(name, launch_command(["pipeline", args.recipe, *overrides]), Path(f"{cfg.run_dir}.log"))
        for _, _, name, cfg, overrides in todo
    ]
    # side by side on GPU sets where there are GPUs, one after another on the CPU, in waves as wide as the
    # GPU sets, so a stopped sweep keeps the wall times of the runs it finished; runs go in table order, so
    # the warm start a seed's variants share is built by its first run and reused by the others
    gpus = visible_gpus()
    wave = max(1, len(gpus))
    outcomes = []
    for start in range(0, len(jobs), wave):
        outcomes += run_placed(jobs[start : start + wave], gpus, per_run=1)
        for outcome in outcomes[-wave:]:
            seconds[outcome.job.name] = seconds.get(outcome.job.name, 0.0) + outcome.seconds
        write_json(record, {"seconds": seconds})
    failed = failure_report(outcomes)
    if failed:
        print(failed)
        return 1

    rows = []
    for variant, seed, name, cfg, _ in runs:
        base_eval, trained = (
            read_json(cfg.run_dir / "eval" / "base.json"),
            read_json(cfg.run_dir / "eval" / "adapter.json"),
        )
        rows.append(
            {
                "variant": variant,
                "seed": seed,
                "run": str(cfg.run_dir),
                "base": base_eval["success"],
                "adapter": trained["success"],
                "seconds": seconds.get(name, float("nan")),
                "n_tasks": trained["n_tasks"],
            }
        )
        print(
            f"[sweep] {name}: warm start {100 * base_eval['success']['mean']:.1f}% -> "
            f"{100 * trained['success']['mean']:.1f}%",
            flush=True,
        )
    summary = summarize(rows)
    text = f"# Sweep: {args.recipe}, {args.seeds} seeds\n\n" + table(summary, rows[0]["n_tasks"])
    atomic_write_text(sweep_dir / "sweep.md", text)
    write_json(record, {"seconds": seconds, "rows": rows, "summary": summary, "recipe": args.recipe})
    print(text)
    print(json.dumps({"sweep": str(sweep_dir / "sweep.md")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
