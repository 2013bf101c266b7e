"""seal_mini: SEAL (co-evolving agent and training-time interface) for tool-use agents on one GPU."""

__version__ = "0.1.0"

SUPPORTED = {"torch": ("2.10", "2.16"), "transformers": ("5.10", "5.18"), "peft": ("0.15", "0.23")}
"""Versions the kit runs on, [from, below): the pins of requirements.txt, and what a GPU machine that already
has its own stack may bring (a bare card's machine: torch 2.11, transformers 5.17). run.sh reads it too."""
