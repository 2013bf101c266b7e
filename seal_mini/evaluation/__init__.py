"""Scoring a policy on the unchanged benchmarks: held-in BFCL V3, the out-of-distribution suites (BFCL V4
memory and web search, tau2-bench), and the report drawn from a run's files."""
