"""`python -m seal_mini report RUN_DIR [RUN_DIR ...] [--out DIR]`: the markdown report with plots
(seal_mini/evaluation/report.py), drawn from run directories' files alone."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seal_mini.config import ConfigError
from seal_mini.evaluation.report import build_report


def main(argv: list[str]) -> int:
    """`report`: the report of the run directories given, the first the main run."""
    parser = argparse.ArgumentParser(prog="python -m seal_mini report", description="report from run directories")
    parser.add_argument("runs", nargs="+", help="run directories; the first is the main run")
    parser.add_argument("--out", help="output folder (default: FIRST_RUN/report)")
    args = parser.parse_args(argv)
    runs = [Path(r) for r in args.runs]
    for run in runs:
        if not run.is_dir():
            raise ConfigError(f"report: {run}: no such folder")
    out = Path(args.out) if args.out else runs[0] / "report"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"report --out {out}: that is a file; name a folder for the report")
    path = build_report(runs, out, " ".join([parser.prog, *argv]))
    print(json.dumps({"report": str(path)}))
    return 0
