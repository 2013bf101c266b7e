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
