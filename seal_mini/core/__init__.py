"""SEAL's own pieces, as functions over episodes and labels: turn-level diagnosis (rules and the small-model
judge), the training-time interface and its evolution, the update math (advantages, weights, loss), and
the faults that prove the diagnoser. The loop that runs them with the policy is seal_mini.training."""
