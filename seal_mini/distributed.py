"""Data-parallel SEAL over several processes, with torch.distributed as torchrun starts it (docs/multi_gpu.md).

`torchrun --nproc-per-node N -m seal_mini pipeline RECIPE` (what `SEAL_MINI_GPUS=N bash run.sh RECIPE` runs)
starts N ranks, one per GPU, each holding the whole policy (the 4-bit base and the LoRA). Training: task k
of a step goes to rank k mod N with its G episodes, so a group stays on one rank (its shared prompt prefill);
after diagnosis the episodes' outcomes are gathered, so every rank computes the advantages, the profile C_t,
Omega_{t+1} and rho one process would; in the update each rank computes the gradients of its own episodes,
and the mini-batch's token count and the gradients are summed over the ranks (all-reduce), so every rank
takes the optimizer step one process would. Evaluation splits every piece of work the same way and gathers
the rows in task order. Rank 0 alone holds the run directory's lock and writes into it; the other ranks'
stdout is silenced and their stderr lines start with their rank.

Collectives run on gloo for CPU tensors and on NCCL for CUDA tensors; ranks that share a GPU use gloo for
everything. When a rank dies, torchrun's elastic agent stops the others and prints a summary naming it and
its error. In one process torch.distributed is never initialised and every collective here is the identity:
the kit runs exactly as it does without this module.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from seal_mini import runio
from seal_mini.config import ConfigError, leaves

TIMEOUT = datetime.timedelta(hours=2)
"""How long a rank waits in a collective for the others. Ranks wait for each other at every gather: while
another plays a share of long episodes, or while rank 0 alone plays BFCL V4 memory's prerequisite
conversations. A rank that dies is noticed by torchrun at once, whatever this says; this bounds a hang."""


class RankStopped(RuntimeError):
    """A collective failed because another rank stopped (it raised, was killed, or cannot be reached)."""


def world_size() -> int:
    """Processes in the job (1 without torchrun)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without torchrun)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the one process that writes into the run directory and prints."""
    return rank() == 0


# --- starting and stopping ------------------------------------------------------------------------------


def start() -> None:
    """Join the process group torchrun set up (its environment names the rank, the world and the address).

    Each rank takes GPU LOCAL_RANK when there are enough GPUs for one each; ranks that must share a GPU
    (or a CPU job) use gloo for every collective."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        torch.cuda.set_device(local_rank % gpus)
    backend = "cpu:gloo,cuda:nccl" if gpus >= local_world else "gloo"  # NCCL needs a GPU per rank
    dist.init_process_group(backend=backend, timeout=TIMEOUT)
    if rank() != 0:
        sys.stdout = open(os.devnull, "w")  # progress lines and samples come from rank 0 (and its bars)
        sys.stderr = RankPrefixed(sys.stderr, f"[rank {rank()}] ")
    else:
        print(
            f"[ranks] {world_size()} processes ({backend}{f', {gpus} GPUs' if gpus else ', CPU'}): each plays its "
            "share of every step's tasks and of every evaluation; rank 0 writes the run directory",
            flush=True,
        )


def stop() -> None:
    """Leave the process group (after the command ended, well or not)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class RankPrefixed(io.TextIOBase):
    """A text stream that starts every line with a prefix (`[rank 1] `), so interleaved output says whose."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.line_start = stream, prefix, True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            out.append((self.prefix if self.line_start else "") + piece)
            self.line_start = piece.endswith(("\n", "\r"))
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


def run_command(command_main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run one command as this rank: join the group, run, report any error as one line naming this rank
    (and into torchrun's error file, so its summary shows it), leave the group."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    handler = get_error_handler()
    handler.initialize()
    start()
    try:
        code = command_main(argv)
        # every rank leaves the group together: a rank that tears its side down while another still talks
        # to it can abort that one (gloo's threads end the process with std::terminate)
        _all_gather(code, "waiting for the other ranks to finish")
        return code
    except (ConfigError, runio.FileError, OSError, RankStopped) as e:  # a setting, a file, a lost rank: one line
        print(f"{'[rank 0] ' if is_main() else ''}error: {e}", file=sys.stderr, flush=True)  # others: prefixed
        handler.record_exception(e)
        return 1 if isinstance(e, RankStopped) else 2
    except BaseException as e:  # anything else: the traceback, here and in torchrun's summary
        handler.record_exception(e)
        raise
    finally:
        stop()


# --- collectives ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _collective(what: str) -> Iterator[None]:
    """Turn the failure of a collective into RankStopped, which says what this rank was doing."""
    try:
        yield
    except torch.OutOfMemoryError:  # a RuntimeError too, but this rank's own trouble
        raise
    except RuntimeError as e:  # gloo and NCCL report a lost peer as RuntimeError (or torch's DistError)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankStopped(
            f"rank {rank()} stopped while {what}: another rank stopped or cannot be reached ({first[:200]}); "
            "torchrun's summary lists each rank that stopped and why (a killed one by its signal). The last "
            "checkpoint stands: rerun the same command to continue"
        ) from None


def _all_gather(obj, what: str) -> list:
    """Every rank's `obj`, in rank order (pickled, over gloo on the CPU)."""
    out = [None] * world_size()
    with _collective(what):
        dist.all_gather_object(out, obj)
    return out


def rank_positions(n: int) -> list[int]:
    """The positions 0..n-1 this rank takes: every N-th, from its rank on (all of them in one process)."""
    return list(range(rank(), n, world_size()))


def gather_in_order(items: list, positions: list[int], what: str = "gathering results") -> list:
    """Every rank's items, each put at its position: the whole list, as one process would have it, on
    every rank. `positions` says where this rank's items stand (rank_positions() gives them)."""
    assert len(items) == len(positions), f"{len(items)} items for {len(positions)} positions"
    if world_size() == 1:
        assert list(positions) == list(range(len(items))), "one process holds every position, in order"
        return list(items)
    placed: dict[int, object] = {}
    for their_positions, their_items in _all_gather((list(positions), list(items)), what):
        placed.update(zip(their_positions, their_items, strict=True))
    assert sorted(placed) == list(range(len(placed))), "the ranks' positions must cover 0..n-1 once each"
    return [placed[p] for p in range(len(placed))]


def split_work(items: list, play: Callable[[list], list], what: str = "gathering results") -> list:
    """play(this rank's share of items) -> one result per item; returns every result in items' order, on
    every rank. In one process: play(items)."""
    local = rank_positions(len(items))
    return gather_in_order(play([items[i] for i in local]), local, what)


def all_reduce_sum(value: int | float, what: str = "summing over ranks") -> int | float:
    """The sum of `value` over the ranks (the value itself in one process)."""
    if world_size() == 1:
        return value
    total = torch.tensor([float(value)], dtype=torch.float64)
    with _collective(what):
        dist.all_reduce(total)
    return int(total.item()) if isinstance(value, int) else float(total.item())


def all_reduce_sums(sums: dict[str, float], what: str = "summing metrics over ranks") -> dict[str, float]:
    """Per key, the sum over the ranks (a key one rank lacks counts as 0 there), added in rank order."""
    if world_size() == 1:
        return sums
    out: dict[str, float] = {}
    for theirs in _all_gather(sums, what):
        for k, v in theirs.items():
            out[k] = out.get(k, 0.0) + v
    return out


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in place; a rank with no episode in the mini-batch
    adds zeros. One all-reduce per dtype over the flattened gradients (NCCL on GPUs that are not shared)."""
    if world_size() == 1:
        return
    through_cpu = params and params[0].device.type != "cpu" and "nccl" not in str(dist.get_backend())
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
        if through_cpu:  # ranks sharing a GPU reduce over gloo, on the CPU
            flat = flat.cpu()
        with _collective("summing gradients over ranks"):
            dist.all_reduce(flat)
        flat = flat.to(group[0].device)
        offset = 0
        for p in group:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()


def from_rank0(fn: Callable, *args, what: str = "waiting for rank 0"):
    """fn(*args) run by rank 0 alone, its result (or its error) given to every rank: decisions that read
    or change the run directory (what to resume from, which work is done) are made once."""
    if world_size() == 1:
        return fn(*args)
    box: list = [None]
    error = None
    if is_main():
        try:
            box[0] = (True, fn(*args))
        except Exception as e:
            error = e
            box[0] = (False, _picklable(e))
    with _collective(what):
        dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if not ok:
        raise error if error is not None else value  # rank 0 raises its own error, with its traceback
    return value


def _picklable(e: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"on rank 0: {type(e).__name__}: {e}")


def check_same(what: str, value: dict) -> None:
    """Refuse to go on, on every rank, when the ranks disagree on `value` (settings, package versions):
    ConfigError naming the rank, the keys and both values. Nothing to check in one process."""
    if world_size() == 1:
        return
    values = _all_gather(leaves(value), f"comparing {what} across ranks")
    for r, theirs in enumerate(values[1:], start=1):
        differ = sorted(k for k in {*values[0], *theirs} if values[0].get(k) != theirs.get(k))
        if differ:
            shown = "; ".join(f"{k}: {theirs.get(k)!r} (rank 0: {values[0].get(k)!r})" for k in differ[:5])
            raise ConfigError(
                f"rank {r} runs with other {what} than rank 0 ({shown}{'; ...' if len(differ) > 5 else ''}); "
                "start every rank with the same command, recipe and packages"
            )


def check_same_weights(params: list[torch.nn.Parameter]) -> None:
    """Refuse to go on when the ranks' weights differ (they must take identical steps): compares the
    float64 sum and sum of squares of every tensor. Nothing to compute in one process."""
    if world_size() == 1:
        return
    with torch.no_grad():  # one (tensors, 2) array, one copy from the GPU
        sums = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for p in params]).tolist()
    check_same("adapter weights after the update", {f"tensor {i}": s for i, s in enumerate(sums)})


# --- the run directory ------------------------------------------------------------------------------------


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str) -> Iterator[None]:
    """runio.run_lock held by rank 0 for the whole job; the other ranks go on once it holds it (or stop
    with its error). In one process: runio.run_lock."""
    with contextlib.ExitStack() as stack:
        from_rank0(stack.enter_context, runio.run_lock(run_dir, command), what="waiting for rank 0 to lock the run")
        yield
