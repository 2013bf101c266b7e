"""Commands that are programs rather than library: the pipeline and its stages, sweeps, probe, chat, dataset and
export (the kit's checks of itself are seal_mini.checks)."""
