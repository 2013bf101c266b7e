"""seal_mini: SEAL (co-evolving agent and training-time interface) for tool-use agents on one GPU."""

__version__ = "0.1.0"
