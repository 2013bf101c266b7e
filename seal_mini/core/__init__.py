"""SEAL's own pieces, as functions over episodes and labels: turn-level diagnosis (rules and the small-model
judge), the training-time interface and its evolution, the update math (advantages, weights, loss), and
the faults that prove the diagnoser. No model is loaded here; the loop that uses them is seal_mini.training."""
