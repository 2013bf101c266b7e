"""`python -m seal_mini sweep RECIPE --seeds N [--ablations [NAME,...]]`: a recipe (and its ablations) over seeds.

Every run is the full pipeline (warm start, training, held-in evaluation, report) in its own run
directory under <out_dir>/<name>_sweep/, as its own process, placed by seal_mini.programs.placement: side by
side on GPU sets where there are GPUs, one after another on the CPU. By default every run starts from one
warm start (sft.seed = the recipe's seed; --warm-start per-seed builds one per seed), so what differs
between two seeds is what RL does, and a variant is compared with SEAL on the same seed: the same warm
start, task order and sampling streams, only the switch flipped. An ablation flips the same switches it
flips in recipes/ablations/*.yaml, on top of the recipe given here: those files are read for their keys,
not their `base:`. Runs that share a warm start share its held-in evaluation too.

A run scores the mean of its last --last held-in evaluations. The table (sweep.md, sweep.json) gives, per
variant and per category, the mean and spread over seeds, the paired difference to SEAL with 95% paired-t
and bootstrap intervals, how many seeds a 5-point difference needs at the measured spread, and, from each
run's own files, how much better SEAL's training episodes did than each variant's at the same steps while
SEAL trained with cues on, and the held-in label shares before and after. It reports what it measures,
whichever way it comes out. Resumable: a run whose final evaluation exists is not run again; a stopped run
continues where it stopped (the pipeline resumes).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import yaml

from seal_mini.config import ConfigError, changed_settings, load_config, saved_config
from seal_mini.core.interface import active_cues
from seal_mini.labels import FAILURE_LABELS, LABELS
from seal_mini.programs.placement import Job, failure_report, launch_command, run_placed, visible_gpus
from seal_mini.runio import atomic_write_text, read_json, read_jsonl_gz, read_yaml, run_lock, write_json

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: recipes/ablations/ lies there."""
ABLATIONS = ("vanilla_rl", "no_env_adaptation", "no_reweighting", "no_closed_loop")
"""The paper's ablations, recipes/ablations/<name>.yaml, in the order of the table: a bare --ablations runs these."""
CONTROLS = ("shuffled_weights", "turn_weights", "missing_call_rho_1")
"""The kit's variants of the diagnostic weight (recipes/ablations/<name>.yaml too), run when named: the
weights traded among a group's failures (their size kept, their information gone), turn-level weights, and
teaching assignment 1's first rho change."""
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
    """--ablations: absent = none, bare = the paper's four, else the comma-separated names (in table order)."""
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
    unknown = [n for n in names if n not in ABLATIONS + CONTROLS]
    if unknown or not names:
        raise ConfigError(
            f"sweep: --ablations {given!r}: unknown ablation {unknown[0] if unknown else '(none named)'}; "
            f"name some of {', '.join(ABLATIONS + CONTROLS)} (comma-separated), or give --ablations alone for the "
            "paper's four"
        )
    return [n for n in ABLATIONS + CONTROLS if n in names]


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation, min and max (in %)."""
    values = [100 * v for v in values]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


# --- paired statistics over seeds -------------------------------------------------------------------


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (p > 0.5): its density integrated by
    Simpson's rule, inverted by bisection (accurate to about 1e-6; no statistics package needed)."""
    assert 0.5 < p < 1 and df >= 1
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float, n: int = 2000) -> float:
        f = lambda t: math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))  # noqa: E731
        h = x / n
        inner = sum((4 if k % 2 else 2) * f(k * h) for k in range(1, n))
        return 0.5 + h / 3 * (f(0.0) + inner + f(x))

    low, high = 0.0, 1000.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def paired(diffs: list[float], resamples: int = 10_000) -> dict:
    """Mean of paired differences (points) with a 95% paired-t interval and a 95% bootstrap interval over
    the pairs (seeds), and the seeds a 5-point effect needs at 80% power at this spread."""
    n, m = len(diffs), statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if n > 1 else float("nan")
    out = {"mean": m, "sd": sd, "n": n, "t95": None, "boot95": None, "seeds_for_5": None}
    if n < 2:
        return out
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    rng = random.Random(0)  # the interval of a given table is reproducible
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    out["t95"] = [m - half, m + half]
    out["boot95"] = [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]]
    z = statistics.NormalDist()
    out["seeds_for_5"] = math.ceil(((z.inv_cdf(0.975) + z.inv_cdf(0.8)) * sd / 5.0) ** 2) if sd > 0 else 2
    return out


# --- what a run scored -------------------------------------------------------------------------------


def run_score(run_dir: Path, last: int) -> dict:
    """Held-in success per category (and mean) of a run, averaged over its last `last` evaluations (the
    in-training ones, eval/step_NNNN.json, and the final one, eval/adapter.json): one evaluation is a noisy
    reading of a run whose held-in success wanders from one evaluation to the next."""
    evals = sorted((run_dir / "eval").glob("step_[0-9][0-9][0-9][0-9].json")) + [run_dir / "eval" / "adapter.json"]
    chosen = [read_json(p)["success"] for p in evals[-last:]]
    return {c: statistics.fmean(e[c] for e in chosen) for c in chosen[-1]} | {"evaluations": len(chosen)}


def training_rounds(run_dir: Path) -> dict:
    """Per training round, in step order: its success (mean reward of its episodes) and whether it trained
    with cues on, from the run's own rounds/ and trajectories/ files."""
    success, cues_on = [], []
    for path in sorted((run_dir / "rounds").glob("step_*.json")):
        rows = read_jsonl_gz(run_dir / "trajectories" / f"{path.stem}.jsonl.gz")
        success.append(statistics.fmean(r["reward"] for r in rows))
        cues_on.append(bool(active_cues(read_json(path)["interface_used"])))
    return {"success": success, "cues_on": cues_on}


def cue_round_gap(seal: dict, other: dict) -> float | None:
    """Training success, SEAL minus another variant of the same seed (same tasks at each step), in points,
    over the rounds SEAL trained with cues on: the cues' effect during training, matched in time (cue-on
    rounds are the later ones, so SEAL's own cue-on vs cue-off rounds would compare early with late)."""
    # strict=False: a run may stop early
    gaps = [a - b for a, b, on in zip(seal["success"], other["success"], seal["cues_on"], strict=False) if on]
    return 100 * statistics.fmean(gaps) if gaps else None


def held_in_labels(run_dir: Path, tag: str) -> dict[str, float]:
    """Share of held-in turns per label in one evaluation (eval/<tag>.json)."""
    counts = read_json(run_dir / "eval" / f"{tag}.json").get("label_counts", {})
    total = sum(counts.values()) or 1
    return {z: n / total for z, n in counts.items()}


def summarize(rows: list[dict]) -> dict:
    """Per variant: warm start and trained success over seeds (mean of categories and per category), the
    paired difference SEAL - variant per seed, wall times, and the mechanism figures."""
    seal = {r["seed"]: r for r in rows if r["variant"] == "seal"}
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        categories = [c for c in mine[0]["score"] if c not in ("mean", "evaluations")]
        pairs = [(seal[r["seed"]], r) for r in mine if r["seed"] in seal]
        out[variant] = {
            "warm start": spread([r["base"]["mean"] for r in mine]),
            "trained": spread([r["score"]["mean"] for r in mine]),
            "delta": spread([r["score"]["mean"] - r["base"]["mean"] for r in mine]),
            "categories": {c: spread([r["score"][c] for r in mine]) for c in categories},
            "seconds": [round(r["seconds"], 1) for r in mine],
        }
        if variant != "seal":
            diff = lambda key, ps=pairs: [100 * (a["score"][key] - b["score"][key]) for a, b in ps]  # noqa: E731
            out[variant]["seal_minus"] = {key: paired(diff(key)) for key in ["mean", *categories]}
            gaps = [cue_round_gap(a["rounds"], b["rounds"]) for a, b in pairs]
            if gaps and None not in gaps:
                out[variant]["cue_round_gap"] = paired(gaps)
        elif mine[0]["rounds"]["cues_on"]:
            out[variant]["cue_rounds"] = [sum(r["rounds"]["cues_on"]) for r in mine], len(mine[0]["rounds"]["cues_on"])
        out[variant]["labels"] = {
            which: {z: statistics.fmean(r["labels"][which].get(z, 0.0) for r in mine) for z in LABELS}
            for which in ("base", "trained")
        }
    return out


def cell(s: dict) -> str:
    return f"{s['mean']:.1f} ± {s['sd']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"


def paired_cell(d: dict) -> str:
    if d["t95"] is None:
        return f"{d['mean']:+.1f} (one seed)"
    t, b = d["t95"], d["boot95"]
    return f"{d['mean']:+.1f} [t {t[0]:+.1f}, {t[1]:+.1f}] [boot {b[0]:+.1f}, {b[1]:+.1f}]"


def table(summary: dict, n_tasks: int, last: int) -> str:
    """The markdown tables: per variant, then per category, paired differences to SEAL with 95% intervals,
    the seeds a 5-point effect needs, the mechanism figures, and the paper's Table 3 beside ours."""
    first = next(iter(summary.values()))
    n = first["trained"]["n"]
    lines = [
        "| variant | held-in success | change vs warm start | SEAL - variant, paired (95% t / bootstrap) "
        "| seeds for 5 points | wall time per run (s) | paper (7B) |",
        "|---|---|---|---|---|---|---|",
        f"| warm start | {cell(first['warm start'])} | - | - | - | - | {PAPER['warm start'][1]:.2f} |",
    ]
    for variant, s in summary.items():
        name, paper = PAPER.get(variant, (variant, None))
        d = s.get("seal_minus", {}).get("mean")
        diff = paired_cell(d) if d else "-"
        need = str(d["seeds_for_5"]) if d and d["seeds_for_5"] is not None else "-"
        seconds = ", ".join(f"{x:.0f}" for x in s["seconds"])
        paper_cell = f"{paper:.2f} ({name})" if paper is not None else "-"
        lines.append(
            f"| {variant} | {cell(s['trained'])} | {cell(s['delta'])} | {diff} | {need} | {seconds} | {paper_cell} |"
        )
    categories = list(first["categories"])
    lines += ["", "Per category (mean ± sd over seeds; below each ablation: SEAL - variant, paired):", ""]
    lines += ["| variant | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
    for variant, s in summary.items():
        lines.append(f"| {variant} | " + " | ".join(cell(s["categories"][c]) for c in categories) + " |")
        if "seal_minus" in s:
            lines.append("| SEAL - it | " + " | ".join(paired_cell(s["seal_minus"][c]) for c in categories) + " |")
    lines += ["", "Mechanism (from each run's own files):", ""]
    for variant, s in summary.items():
        parts = []
        if "cue_rounds" in s:
            on, total = s["cue_rounds"]
            parts.append(f"trained with cues on in {'/'.join(map(str, on))} of {total} rounds (per seed)")
        if "cue_round_gap" in s:
            parts.append(
                f"training success, SEAL minus it, in the rounds SEAL trained with cues on (same step, same tasks): "
                f"{paired_cell(s['cue_round_gap'])} points"
            )
        base, trained = s["labels"]["base"], s["labels"]["trained"]
        moved = sorted((z for z in FAILURE_LABELS if base.get(z) or trained.get(z)), key=lambda z: -base.get(z, 0.0))
        parts.append(
            "held-in turns per label, warm start -> trained: "
            + ", ".join(f"{z} {100 * base.get(z, 0.0):.1f} -> {100 * trained.get(z, 0.0):.1f}%" for z in moved)
        )
        lines.append(f"- {variant}: " + "; ".join(parts))
    note = (
        f"\nSuccess rate (%), mean of the categories, on {n_tasks} held-in tasks, bare benchmark, greedy; a run "
        f"scores the mean of its last {last} evaluations; mean ± sample standard deviation [min, max] over {n} "
        "seeds. Paired: SEAL minus the variant on the same seed (same warm start, same task order and sampling "
        "streams), mean with its 95% paired-t and bootstrap intervals; 'seeds for 5 points' is how many seeds "
        "a 5-point difference needs for 80% power at that pair's measured spread (normal approximation). The "
        "paper's numbers are Qwen2.5-7B on BFCL V3 (Tables 1 and 3), beside ours for their direction only.\n"
    )
    return "\n".join(lines) + "\n" + note


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seal_mini sweep", description="a recipe and its ablations over seeds"
    )
    parser.add_argument("recipe", help="recipes/X.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value, applied to every run")
    parser.add_argument(
        "--seeds", type=int, required=True, help="seeds 0..N-1 (the table says how many a 5-point effect needs)"
    )
    parser.add_argument(
        "--ablations",
        nargs="?",
        const="all",
        metavar="NAME,...",
        help=f"also the ablations of recipes/ablations/: alone, the paper's four; or some of {','.join(ABLATIONS + CONTROLS)}",
    )
    parser.add_argument("--last", type=int, default=3, help="a run scores the mean of its last N held-in evaluations")
    parser.add_argument(
        "--warm-start",
        choices=("shared", "per-seed"),
        default="shared",
        help="shared: every seed starts from one warm start (the recipe's seed), so seeds differ in RL alone",
    )
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides
    if args.seeds < 1:
        raise ConfigError("sweep: --seeds must be >= 1")
    if args.last < 1:
        raise ConfigError("sweep: --last must be >= 1")
    args.ablations = chosen_ablations(args.ablations)
    base = load_config(args.recipe, args.overrides)  # a bad recipe or override fails here, before any run
    if args.warm_start == "shared" and base.sft.enabled and base.sft.seed < 0:
        args.overrides = [*args.overrides, f"sft.seed={base.seed}"]
    sweep_dir = Path(base.out_dir) / f"{base.name}_sweep"
    with run_lock(sweep_dir, "sweep"):  # two sweeps of one recipe would race for sweep.json and its runs
        return run_sweep(args, base, sweep_dir)


def share_base_evaluation(cfg, others: list) -> None:
    """A run whose warm start and evaluation settings equal a finished run's gets that run's evaluation of the
    warm start (greedy, the same tasks: the same numbers), instead of playing it again."""
    from seal_mini.training.sft import identity

    target = cfg.run_dir / "eval" / "base.json"
    if target.exists() or not cfg.sft.enabled:
        return
    key = lambda c: (identity(c), c.to_dict()["eval"], c.to_dict()["rollout"])  # noqa: E731
    mine = key(cfg)
    for other in others:
        done = other.run_dir / "eval" / "base.json"
        if other.run_dir != cfg.run_dir and done.exists() and key(other) == mine:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, done.read_text())
            print(f"[sweep] {cfg.name}: the warm start's evaluation of {other.name} (the same warm start and tasks)")
            return


def run_sweep(args: argparse.Namespace, base, sweep_dir: Path) -> int:
    """Every run of the sweep that is not done yet, then the table from all of them."""
    from seal_mini.evaluation.suites import check_suites  # here, not at the top: it brings torch

    record = sweep_dir / "sweep.json"
    seconds = read_json(record).get("seconds", {}) if record.exists() else {}

    # every run of the sweep, in table order; the ones whose final evaluation exists are done
    runs = []
    # variant -> its overrides on top of the recipe: the recipe itself ("seal"), then the ablations
    variants = {"seal": [], **{name: ablation_overrides(name) for name in args.ablations}}
    for seed in range(args.seeds):
        for variant, extra in variants.items():
            name = f"{base.name}_{variant}_seed{seed}"
            overrides = [*args.overrides, *extra, f"seed={seed}", f"name={name}", f"out_dir={sweep_dir}"]
            runs.append((variant, seed, name, load_config(args.recipe, overrides), overrides))
            check_suites(runs[-1][3], imports=False)  # an unknown ood.suites name fails now, not inside a run
    for _, _, _, cfg, _ in runs:  # a finished run counts as done only if it was made with these settings
        if (cfg.run_dir / "eval" / "adapter.json").exists() and (cfg.run_dir / "config.yaml").exists():
            _, other = changed_settings(saved_config(cfg.run_dir), cfg)
            if other:
                changes = ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in other.items())
                raise ConfigError(
                    f"sweep: {cfg.run_dir} is a finished run made with other settings ({changes}); give this "
                    "sweep a name of its own (name=...) or move that run away"
                )
    jobs = [
        (cfg, Job(name, launch_command(["pipeline", args.recipe, *overrides]), Path(f"{cfg.run_dir}.log")))
        for _, _, name, cfg, overrides in runs
        if not (cfg.run_dir / "eval" / "adapter.json").exists()
    ]
    # side by side on GPU sets where there are GPUs, one after another on the CPU, in waves as wide as the
    # GPU sets, so a stopped sweep keeps the wall times of the runs it finished; runs go in table order, so
    # the warm start the runs share is built by the first and reused by the others
    # a warm start already built under the recipe's out_dir (by `probe`, `sft` or a run; the sweep's runs sit
    # one folder deeper and would not see it) is copied, not built again
    from seal_mini.engine.policy import WARM_START, warm_start_dir
    from seal_mini.training.sft import copy_identical

    built = sorted(Path(base.out_dir).glob(f"*/{WARM_START}/identity.json"))
    for cfg, _ in jobs:
        if cfg.sft.enabled and not (warm_start_dir(cfg) / "identity.json").exists():
            copy_identical(cfg, built)
    gpus = visible_gpus()
    wave = max(1, len(gpus))
    outcomes = []
    for start in range(0, len(jobs), wave):
        for cfg, _ in jobs[start : start + wave]:
            share_base_evaluation(cfg, [r[3] for r in runs])
        outcomes += run_placed([job for _, job in jobs[start : start + wave]], gpus, per_run=1)
        for outcome in outcomes[-wave:]:
            seconds[outcome.job.name] = seconds.get(outcome.job.name, 0.0) + outcome.seconds
        write_json(record, {"seconds": seconds})
    failed = failure_report(outcomes)
    if failed:
        print(failed)
        return 1

    rows = []
    for variant, seed, name, cfg, _ in runs:
        base_eval = read_json(cfg.run_dir / "eval" / "base.json")
        score = run_score(cfg.run_dir, args.last)
        rows.append(
            {
                "variant": variant,
                "seed": seed,
                "run": str(cfg.run_dir),
                "base": base_eval["success"],
                "score": score,
                "rounds": training_rounds(cfg.run_dir),
                "labels": {
                    "base": held_in_labels(cfg.run_dir, "base"),
                    "trained": held_in_labels(cfg.run_dir, "adapter"),
                },
                "seconds": seconds.get(name, float("nan")),
                "n_tasks": base_eval["n_tasks"],
            }
        )
        print(
            f"[sweep] {name}: warm start {100 * base_eval['success']['mean']:.1f}% -> "
            f"{100 * score['mean']:.1f}% (mean of its last {score['evaluations']} evaluations)",
            flush=True,
        )
    summary = summarize(rows)
    text = f"# Sweep: {args.recipe}, {args.seeds} seeds\n\n" + table(summary, rows[0]["n_tasks"], args.last)
    atomic_write_text(sweep_dir / "sweep.md", text)
    write_json(record, {"seconds": seconds, "rows": rows, "summary": summary, "recipe": args.recipe})
    print(text)
    print(json.dumps({"sweep": str(sweep_dir / "sweep.md")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
