"""Where the model runs, in what precision, and how much memory it may use there: the machine, not the method.

A GPU that nvidia-smi sees but torch cannot use is an error naming the mismatch and its fix (resolve_device):
training a 3B model on the CPU by accident would look like a run that is merely slow. An out-of-memory error
shrinks a setting and tries again (until_it_fits); MemoryLimits keeps the smaller settings for the rest of
the process. The CUDA allocator setting the command line starts with is in seal_mini/__main__.py.
"""

from __future__ import annotations

import gc
import importlib.metadata
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed

from seal_mini import SUPPORTED
from seal_mini.config import ConfigError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def supported_versions() -> str:
    """Empty when torch, transformers and peft are within seal_mini.SUPPORTED, else one line naming what is not."""

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])

    off = []
    for package, (low, high) in SUPPORTED.items():
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            off.append(f"{package} is not installed")
            continue
        if not key(low) <= key(found) < key(high):
            off.append(f"{package} {found} (the kit runs on {low} up to below {high})")
    if not off:
        return ""
    return "unsupported versions: " + "; ".join(off) + ". Install the pins: pip install -r requirements.txt"


# --- what the machine has ---------------------------------------------------------------------------


@dataclass
class NvidiaGpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    driver: str
    memory_mb: int
    cuda: str
    """Newest CUDA version the driver supports (nvidia-smi's header), '' if not shown."""


def nvidia_smi() -> list[NvidiaGpu]:
    """GPUs the NVIDIA driver sees (empty when nvidia-smi is missing or fails)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if query.returncode != 0:
        return []
    found = re.search(r"CUDA Version:\s*([0-9.]+)", header.stdout or "")
    cuda = found.group(1) if found else ""
    gpus = []
    for line in query.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0]:
            memory = int(parts[2]) if parts[2].isdigit() else 0
            gpus.append(NvidiaGpu(parts[0], parts[1], memory, cuda))
    return gpus


def mismatch_message(gpu: NvidiaGpu) -> str:
    """Why torch cannot use a GPU the driver sees, and what to do about it."""
    seen = f"nvidia-smi sees {gpu.name} (driver {gpu.driver}, CUDA up to {gpu.cuda or 'unknown'})"
    if torch.version.cuda is None:
        problem = f"but torch {torch.__version__} is a CPU-only build"
        fix = "install a CUDA build of the pinned torch that your driver supports"
    else:
        problem = f"but torch {torch.__version__} (built for CUDA {torch.version.cuda}) cannot use it"
        fix = (
            f"update the NVIDIA driver to one that supports CUDA {torch.version.cuda}, or install a build of the "
            f"pinned torch for CUDA {gpu.cuda or 'your driver supports'} or older (PyTorch's install page names one "
            "per CUDA version)"
        )
    return f"device: {seen}, {problem}: the driver and the torch CUDA build do not match. Fix: {fix}; or set device=cpu to run on the CPU on purpose"


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when torch can use a GPU, else cpu; never a silent CPU run beside an unusable GPU."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        if torch.distributed.is_initialized():  # one of several ranks: the GPU seal_mini.distributed gave it
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cuda")
    gpus = nvidia_smi()
    if gpus:
        raise ConfigError(mismatch_message(gpus[0]))
    if name == "cuda":
        raise ConfigError("device: cuda was asked for but no CUDA GPU is visible; use device=cpu or auto")
    return torch.device("cpu")


def compute_dtype(wanted: str, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, why): model.dtype where the device can do it, otherwise the closest that it can."""
    if device.type == "cpu":
        return torch.float32, "CPU runs in float32"
    if wanted == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        major, minor = torch.cuda.get_device_capability(device)
        return torch.float16, (
            f"model.dtype bfloat16 asked for, but this GPU (compute capability {major}.{minor}, below 8.0) has no "
            "bfloat16 arithmetic; float16 instead (same memory, narrower range)"
        )
    return DTYPES[wanted], f"model.dtype {wanted}"


def gpu_name(device: torch.device) -> str:
    """'NVIDIA GeForce RTX 4090, 24.0 GB' for a CUDA device, '' otherwise."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device)
    return f"{props.name}, {props.total_memory / 2**30:.1f} GB"


# --- memory -----------------------------------------------------------------------------------------

_cap_bytes: int | None = None
"""The process's GPU memory cap set by cap_memory (None: the whole card)."""


def cap_memory(gigabytes: float, device: torch.device) -> None:
    """Let this process use at most `gigabytes` of the GPU (allocations beyond raise out-of-memory), so a
    larger card stands in for a smaller one; free_bytes then counts within the cap."""
    global _cap_bytes
    if device.type != "cuda":
        raise ConfigError("--gpu-mem-gb: needs a CUDA GPU (on CPU there is no GPU memory to cap)")
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(gigabytes * 2**30)
    if not 0 < cap <= total:
        raise ConfigError(f"--gpu-mem-gb {gigabytes}: must be above 0 and at most this GPU's {total / 2**30:.1f} GB")
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    _cap_bytes = cap


def uncap_memory(device: torch.device) -> None:
    """The whole card again, after cap_memory."""
    global _cap_bytes
    if device.type == "cuda" and _cap_bytes is not None:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    _cap_bytes = None


def free_bytes(device: torch.device) -> int:
    """GPU memory this process can still allocate: the driver's free memory, within the cap if one is set.
    Memory the caching allocator holds but does not use is released first, so it counts as free."""
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(device)[0]
    if _cap_bytes is not None:
        free = min(free, _cap_bytes - torch.cuda.memory_reserved(device))
    return max(free, 0)


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory window (on a GPU; the CPU's resident peak cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict:
    """Peak GPU memory since `reset_peak` (GB), waiting for the GPU first; the process's peak resident
    memory on a CPU."""
    import resource

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return {
            "peak_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
            "peak_reserved_gb": round(torch.cuda.max_memory_reserved(device) / 2**30, 2),
        }
    return {"peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


T = TypeVar("T")


def until_it_fits(attempt: Callable[[], T], shrink: Callable[[], None], device: torch.device) -> T:
    """attempt() until it runs without a CUDA out-of-memory error. After such an error the failed try's
    tensors go (leaving the except block drops its traceback), shrink() drops what else the try left and
    makes the next try smaller (it remembers the smaller setting in a MemoryLimits and says what shrank, or
    raises a ConfigError naming what to lower when nothing is left to shrink), and the cache is freed."""
    while True:
        try:
            return attempt()
        except torch.OutOfMemoryError:
            pass
        shrink()
        gc.collect()  # give the failed try's memory back before the next, smaller one
        if device.type == "cuda":
            torch.cuda.empty_cache()


@dataclass
class MemoryLimits:
    """Settings an out-of-memory error made smaller in this process (0 = the config's own value).
    Later rollouts and updates start from them instead of running out of memory again; the config
    itself is left alone, so a resumed run may use any of them."""

    max_concurrent: int = 0
    """rollout.max_concurrent: episodes generating at once."""
    prefill_tokens: int = 0
    """rollout.prefill_tokens: tokens of one prefill forward."""
    micro_batch: int = 0
    """train.micro_batch: sequences per forward/backward of the update."""
    logprob_chunk: int = 0
    """train.logprob_chunk: positions per chunk of the LM head."""
