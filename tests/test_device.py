"""Device checks on a machine without a GPU: nvidia-smi is a fake script on PATH, and torch's CUDA
queries are replaced where a real GPU would answer them."""

import os
import sys
import textwrap

import pytest
import torch

from seal_mini.config import ConfigError, load_config
from seal_mini.engine import device
from seal_mini.engine.policy import load_policy, start_banner

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

SMI_QUERY = "NVIDIA GeForce RTX 4090, 535.54.03, 24564\n"
SMI_HEADER = "| NVIDIA-SMI 535.54.03    Driver Version: 535.54.03    CUDA Version: 12.2     |\n"


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that reports one RTX 4090 with a CUDA 12.2 driver."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.stdout.write({SMI_QUERY!r} if any(a.startswith("--query-gpu") for a in sys.argv) else {SMI_HEADER!r})
        """)
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smi_is_read(fake_smi):
    (gpu,) = device.nvidia_smi()
    assert (gpu.name, gpu.driver, gpu.memory_mb, gpu.cuda) == ("NVIDIA GeForce RTX 4090", "535.54.03", 24564, "12.2")


def test_a_gpu_torch_cannot_use_stops_with_the_mismatch_and_the_fix(fake_smi, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ConfigError) as error:
        device.resolve_device("auto")
    message = str(error.value)
    assert "RTX 4090" in message and "driver 535.54.03" in message and "CUDA 13.0" in message
    assert "update the NVIDIA driver" in message and "CUDA 12.2 or older" in message and "device=cpu" in message
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match="CPU-only build"):
        device.resolve_device("cuda")
    assert device.resolve_device("cpu") == torch.device("cpu")  # on purpose: no check


def test_no_gpu_anywhere_means_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.nvidia_smi() == [] and device.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        device.resolve_device("cuda")


def test_bf16_only_where_the_card_has_it(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    dtype, why = device.compute_dtype("bfloat16", cuda)
    assert dtype == torch.float16 and "7.5" in why and "float16" in why
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert device.compute_dtype("bfloat16", cuda)[0] == torch.float16  # emulated bf16 does not count
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert device.compute_dtype("bfloat16", cuda) == (torch.bfloat16, "model.dtype bfloat16")
    assert device.compute_dtype("bfloat16", torch.device("cpu")) == (torch.float32, "CPU runs in float32")


class FakeCuda:
    """The CUDA memory queries of an 80 GB card with 70 GB free, 3 GB reserved by this process."""

    def __init__(self, monkeypatch):
        self.fraction = None
        props = type("Props", (), {"total_memory": 80 * 2**30, "name": "NVIDIA H100"})()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", self.set_fraction)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (70 * 2**30, 80 * 2**30))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 3 * 2**30)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(device, "_cap_bytes", None)

    def set_fraction(self, fraction, d=None):
        self.fraction = fraction


def test_gpu_memory_cap_sets_the_fraction_and_the_free_memory(monkeypatch):
    fake, cuda = FakeCuda(monkeypatch), torch.device("cuda")
    assert device.free_bytes(cuda) == 70 * 2**30
    device.cap_memory(24, cuda)
    assert fake.fraction == pytest.approx(24 / 80)
    assert device.free_bytes(cuda) == 21 * 2**30  # 24 GB cap minus the 3 GB this process holds
    with pytest.raises(ConfigError, match="at most this GPU's 80.0 GB"):
        device.cap_memory(100, cuda)
    device.uncap_memory(cuda)  # the whole card again (gpu-check caps and uncaps between its stages)
    assert fake.fraction == 1.0 and device.free_bytes(cuda) == 70 * 2**30


def test_peak_memory_is_read_from_the_card_on_a_gpu_and_from_the_process_on_a_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 6 * 2**30)
    device.reset_peak(torch.device("cuda"))
    assert device.peak_memory(torch.device("cuda")) == {"peak_allocated_gb": 5.0, "peak_reserved_gb": 6.0}
    assert calls == ["sync", "reset", "sync"]  # the peak waits for the card, so a time taken after it is whole
    assert set(device.peak_memory(torch.device("cpu"))) == {"peak_rss_gb"}


def test_versions_outside_the_supported_ranges_are_one_line_naming_them(monkeypatch):
    import importlib.metadata

    assert device.supported_versions() == ""  # the pins
    found = {"torch": "2.9.1+cu128", "transformers": "5.17.0", "peft": "0.30.0"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: found[name])
    line = device.supported_versions()
    assert line.startswith("unsupported versions: torch 2.9.1+cu128 (the kit runs on 2.10 up to below 2.16)")
    assert "peft 0.30.0" in line and "transformers" not in line and "\n" not in line
    found["torch"], found["peft"] = "2.11.0+cu130", "0.17.1"  # a card's machine with its own stack
    assert device.supported_versions() == ""


def test_start_banner_on_cpu_and_on_a_gpu(capsys, monkeypatch):
    cfg = load_config(
        None,
        ["model.name=tiny-random", "device=cpu", "rollout.max_total_tokens=8192", "rollout.max_prompt_tokens=6144"],
    )
    policy = load_policy(cfg)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("[device] cpu (") and "torch.float32 (CPU runs in float32)" in line
    assert "backend hf" in line and "4-bit no" in line and "KV budget 2.00 GB (2 GB on CPU)" in line
    assert "256 slots of 8192 tokens" in line  # 2 GB / (256 B a token x 8192) = 1024, capped at a round's 256

    FakeCuda(monkeypatch)
    on_gpu = type(policy)(policy.model, policy.tokenizer, policy.renderer, torch.device("cuda"), "hf", torch.bfloat16)
    line = start_banner(on_gpu, cfg, "model.dtype bfloat16")
    # 70% of 70 GB free = 49 GB of KV; the tiny model's 512 B a token (bf16) x 8192 tokens a slot
    assert line.startswith("[device] cuda (NVIDIA H100, 80.0 GB)") and "bfloat16 (model.dtype bfloat16)" in line
    assert "KV budget 49.00 GB (70% of free GPU memory)" in line and "256 slots" in line


def test_the_command_line_sets_the_cuda_allocator_unless_the_user_did(monkeypatch):
    from seal_mini.__main__ import main

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_the_kv_budget_on_a_gpu_is_a_share_of_the_free_memory_within_the_cap(monkeypatch):
    from types import SimpleNamespace

    from seal_mini.config import RolloutConfig
    from seal_mini.engine.rollout import GPU_KV_SHARE, kv_budget

    FakeCuda(monkeypatch)
    on_gpu = SimpleNamespace(device=torch.device("cuda"))
    assert kv_budget(on_gpu, RolloutConfig()) == (
        int(GPU_KV_SHARE * 70 * 2**30),
        f"{GPU_KV_SHARE:.0%} of free GPU memory",
    )
    device.cap_memory(24, torch.device("cuda"))  # what preflight and gpu-check do for a 24 GB card
    assert kv_budget(on_gpu, RolloutConfig())[0] == int(GPU_KV_SHARE * 21 * 2**30)
    assert kv_budget(on_gpu, RolloutConfig(kv_budget_gb=4.0)) == (4 * 2**30, "rollout.kv_budget_gb")


# --- the CUDA-only branches of the commands, through fakes (no card runs them in CI) --------------------------


def test_gpu_check_reads_the_card_it_finds(fake_smi, monkeypatch, tmp_path):
    from seal_mini.checks import gpu_check

    props = type("Props", (), {"name": "NVIDIA H100", "major": 9, "minor": 0, "total_memory": 80 * 2**30})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    env = gpu_check.environment(gpu_check.Check(tmp_path, dry=False, tokenizer=""))
    assert (env["gpu"], env["capability"], env["gpu_memory_gb"], env["bf16"]) == ("NVIDIA H100", "9.0", 80.0, True)
    assert env["driver"] == "535.54.03" and env["cuda_available"] is True


def test_gpu_check_squeezes_a_card_to_the_weights_plus_3_gb_and_gives_it_back(monkeypatch, tmp_path):
    from seal_mini.checks import gpu_check

    fake = FakeCuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 5 * 2**30)  # the weights
    with gpu_check.squeezed(gpu_check.Check(tmp_path, dry=False, tokenizer=""), policy=None):
        assert fake.fraction == pytest.approx(8 / 80)
    assert fake.fraction == 1.0


@pytest.mark.parametrize(("gpus", "local_world", "backend"), [(2, 2, "cpu:gloo,cuda:nccl"), (1, 2, "gloo")])
def test_each_rank_takes_its_own_gpu_and_nccl_only_with_one_each(monkeypatch, capsys, gpus, local_world, backend):
    from seal_mini import distributed

    chosen, joined = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, timeout: joined.append(backend))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    distributed.start()  # not joined for real: rank() stays 0, so this process prints the banner
    assert chosen == [1 % gpus] and joined == [backend]
    assert f"({backend}, {gpus} GPUs)" in capsys.readouterr().out
