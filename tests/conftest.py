"""Shared test setup: the hub is offline for every test, so a forgotten download fails loudly, and every
test has a tier.

Tiers (docs/tests.md): `unit` (a file's `pytestmark`: the method's pieces without a model or a command:
math, config, labels, rules, the episode and checker, the interface, the practice world, file I/O), `slow`
(a real pretrained model; deselected unless asked for with `-m slow`) and `integration`
(everything else, given here: tiny models, rollouts and updates, whole commands, ranks, the 800-task
differential). `bash run.sh test -m unit` is the fast tier; `bash run.sh test` runs all but slow."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

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


TINY_QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # wider than hidden / heads, as Qwen3's 128 is: the KV arithmetic must read head_dim
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
}
"""A tiny random Qwen3 (query and key norms, explicit head_dim) with the tiny tokenizer's vocabulary."""


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """The folder of a tiny random Qwen3 causal LM, built offline from its config."""
    import torch

    from seal_mini.engine.tiny import tiny_tokenizer
    from seal_mini.programs.preflight import write_random_model

    tokenizer = tiny_tokenizer()
    folder = tmp_path_factory.mktemp("tiny_qwen3")
    write_random_model({**TINY_QWEN3, "vocab_size": len(tokenizer)}, folder, tokenizer, torch.device("cpu"))
    return str(folder)
