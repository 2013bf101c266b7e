"""Independent runs side by side: each on its own GPUs, as many at once as the GPUs allow.

An ablation sweep, or one recipe at several seeds, is a set of independent runs. `run_placed` starts them
concurrently, each with CUDA_VISIBLE_DEVICES naming its own set of GPUs (a run of R ranks gets R GPUs and
runs under torchrun), and gives a set to the next waiting run as soon as its run ends: with at least as
many GPU sets as runs, the sweep takes as long as its longest run. Without a GPU the runs go one after
another (they would only share the same CPU cores). Every run writes its output to its own log file; a
run that fails does not stop the others, and `failure_report` names it, its GPUs, its exit code and the
end of its log. A run that is stopped can be started again: each run continues from its own checkpoint.

    jobs = [Job(name, launch_command(["pipeline", recipe, "seed=1"], ranks=1), Path(f"runs/{name}.log")), ...]
    outcomes = run_placed(jobs, visible_gpus(), per_run=1)
    print(failure_report(outcomes))
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seal_mini.config import ConfigError


@dataclass
class Job:
    """One independent run: a name, the command that runs it, and where its output goes."""

    name: str
    command: list[str]
    """The whole command line (launch_command builds one for `python -m seal_mini ...`)."""
    log: Path


@dataclass
class Outcome:
    """How a job ended."""

    job: Job
    gpus: list[str]
    """The GPUs it had (CUDA_VISIBLE_DEVICES); empty on a machine without GPUs."""
    returncode: int
    seconds: float


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES when it is set, else every GPU nvidia-smi lists."""
    from seal_mini.engine.device import nvidia_smi

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    return [str(i) for i in range(len(nvidia_smi()))]


def gpu_sets(gpus: list[str], per_run: int) -> list[list[str]]:
    """Disjoint sets of `per_run` GPUs, in order (GPUs left over are not used)."""
    if per_run < 1:
        raise ConfigError(f"GPUs per run: {per_run}; must be at least 1")
    if gpus and per_run > len(gpus):
        raise ConfigError(f"{per_run} GPUs per run, but only {len(gpus)} are visible ({','.join(gpus)})")
    return [gpus[i : i + per_run] for i in range(0, len(gpus) - per_run + 1, per_run)]


def launch_command(argv: list[str], ranks: int = 1) -> list[str]:
    """`python -m seal_mini ARGV`; under torchrun with `ranks` processes when there are several."""
    if ranks > 1:  # torchrun (torch.distributed.run) with a free port of its own, so several can run at once
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        return [sys.executable, *launcher, "-m", "seal_mini", *argv]
    return [sys.executable, "-m", "seal_mini", *argv]


def run_placed(
    jobs: list[Job], gpus: list[str], per_run: int = 1, poll_s: float = 0.5, echo: Callable[[str], None] = print
) -> list[Outcome]:
    """Run every job to its end, each on its own set of `per_run` GPUs, as many at once as there are sets.

    Returns one Outcome per job, in the order of jobs. A stop (Ctrl-C) ends the running jobs and re-raises."""
    sets = gpu_sets(gpus, per_run) or [[]]  # no GPU: one job at a time, on the CPU
    waiting = list(range(len(jobs)))
    running: dict[int, tuple[subprocess.Popen, list[str], float]] = {}  # job index -> (process, GPUs, start)
    outcomes: dict[int, Outcome] = {}
    try:
        while waiting or running:
            free = [s for s in sets if all(s != gpus_of for _, gpus_of, _ in running.values())]
            while waiting and free:
                i, gpu_set = waiting.pop(0), free.pop(0)
                running[i] = (_start(jobs[i], gpu_set), gpu_set, time.monotonic())
                echo(f"[runs] {jobs[i].name}: started{_on(gpu_set)}; log {jobs[i].log}")
            for i, (process, gpu_set, started) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[i]
                outcomes[i] = Outcome(jobs[i], gpu_set, process.returncode, time.monotonic() - started)
                how = "finished" if process.returncode == 0 else f"FAILED (exit code {process.returncode})"
                echo(f"[runs] {jobs[i].name}: {how} after {outcomes[i].seconds:.0f} s{_on(gpu_set)}")
            time.sleep(poll_s if running else 0)
    except BaseException:
        for process, _, _ in running.values():  # no orphans: each run continues from its checkpoint next time
            process.terminate()
        for process, _, _ in running.values():
            process.wait()
        raise
    return [outcomes[i] for i in range(len(jobs))]


def _start(job: Job, gpu_set: list[str]) -> subprocess.Popen:
    env = dict(os.environ)
    if gpu_set:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_set)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with open(job.log, "ab") as log:  # the child keeps its own handle; appended, so a rerun keeps the old lines
        return subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _on(gpu_set: list[str]) -> str:
    return f" on GPU{'s' if len(gpu_set) > 1 else ''} {','.join(gpu_set)}" if gpu_set else ""


def failure_report(outcomes: list[Outcome], tail_lines: int = 15) -> str:
    """One block per failed job: its name, GPUs, exit code, log and the last lines of the log; '' if none failed."""
    blocks = []
    for o in outcomes:
        if o.returncode == 0:
            continue
        try:
            tail = o.job.log.read_text(errors="replace").splitlines()[-tail_lines:]
        except OSError as e:
            tail = [f"(cannot read the log: {e.strerror})"]
        blocks.append(
            f"{o.job.name} failed with exit code {o.returncode} after {o.seconds:.0f} s{_on(o.gpus)}; "
            f"log {o.job.log}:\n" + "\n".join(f"    {line}" for line in tail)
        )
    head = f"[runs] {len(blocks)} of {len(outcomes)} runs failed; rerun the same command to continue them\n"
    return head + "\n".join(blocks) if blocks else ""
