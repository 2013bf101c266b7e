"""Shared test setup: the hub is offline for every test, so a forgotten download fails loudly."""

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
