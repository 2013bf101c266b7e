"""Commands that are programs rather than library: the pipeline and sweeps, the checks that prove the kit
(oracle, differential, diagnose-check), benchmarks, preflight, chat, dataset and export."""
