"""What the data-parallel tests start, under torchrun or alone: `python -m seal_mini ARGS` with test hooks
from the environment. Not a test module itself.

  SEAL_TEST_FAKE_SCORE=1     rewards from the parity of the first turn's text (a tiny random model scores
                             0 on the real checker, and its updates would all be zero)
  SEAL_TEST_KILL=R:S         rank R kills itself (SIGKILL, as the kernel's OOM killer does) in the update
                             of step S
  SEAL_TEST_OVERRIDE=R:k=v   rank R runs with one more override (a mismatched setting)
  SEAL_TEST_GUARD=DIR        ranks other than 0 fail on any attempt to write under DIR
"""

import os
import signal
import sys
from pathlib import Path

from seal_mini import __main__ as cli
from seal_mini.envs.verifier import Verdict
from seal_mini.training import train as train_module

RANK = int(os.environ.get("RANK", "0"))


def fake_score(envs):
    out = []
    for env in envs:
        first = env.turn_records()[0]
        text = first.final_text or "".join(e.call or "" for e in first.events)
        out.append(Verdict(float(len(text) % 2 == 0), "" if len(text) % 2 == 0 else "fake:odd"))
    return out


def kill_in_update(rank: int, step: int):
    real_update = train_module.update
    calls = []

    def update(*args, **kwargs):
        if RANK == rank and len(calls) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        calls.append(1)
        return real_update(*args, **kwargs)

    return update


def guard_writes(folder: Path) -> None:
    """Raise PermissionError on any file-system write under `folder` (Python's audit events)."""
    folder = folder.resolve()

    def inside(path) -> bool:
        try:
            return Path(os.fsdecode(path)).resolve().is_relative_to(folder)
        except (TypeError, ValueError):
            return False

    def hook(event: str, args: tuple) -> None:
        paths = []
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            mode, flags = args[1], args[2]
            writes = any(c in (mode or "") for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            paths = [args[0]] if writes else []
        elif event in ("os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"):
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        elif event == "os.mkdir" and not os.path.exists(args[0]):
            paths = [args[0]]
        if any(inside(p) for p in paths):
            raise PermissionError(f"rank {RANK} wrote into the run directory: {event} {paths}")

    sys.addaudithook(hook)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if os.environ.get("SEAL_TEST_FAKE_SCORE"):
        train_module.score = fake_score
    if os.environ.get("SEAL_TEST_KILL"):
        rank, step = (int(x) for x in os.environ["SEAL_TEST_KILL"].split(":"))
        train_module.update = kill_in_update(rank, step)
    if os.environ.get("SEAL_TEST_OVERRIDE"):
        rank, override = os.environ["SEAL_TEST_OVERRIDE"].split(":", 1)
        if RANK == int(rank):
            argv.append(override)
    if os.environ.get("SEAL_TEST_GUARD") and RANK != 0:
        guard_writes(Path(os.environ["SEAL_TEST_GUARD"]))
    sys.exit(cli.main(argv))
