"""The model side: device and precision, loading the policy (QLoRA or a model built from scratch), chat
rendering, the reference and the batched rollout, and token log-probabilities."""
