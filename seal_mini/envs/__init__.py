"""The benchmark as an environment: BFCL V3 tasks, the episode (reset / step), BFCL's own decoding and
checker, the verifier's reward, scripted ground-truth replays, and the practice tasks. No model here."""
