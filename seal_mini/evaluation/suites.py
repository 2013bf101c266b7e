"""The out-of-distribution suites, registered once: check, run, print (BFCL V4 memory and web search,
tau2-bench). A suite is one module that declares its `Suite` (seal_mini.evaluation.ood); adding one is
that module and its entry in SUITES. Nothing else branches on a suite's name.
"""

from __future__ import annotations

import copy
import importlib.util

from seal_mini.config import ConfigError
from seal_mini.evaluation import bfcl_v4, tau2
from seal_mini.evaluation.agents import ModelAgent
from seal_mini.evaluation.ood import EXTRA, Suite

SUITES: dict[str, Suite] = {s.name: s for s in (bfcl_v4.MEMORY, bfcl_v4.WEB_SEARCH, tau2.TAU2)}
"""Every suite by name, in the order the report shows them."""


def check_suites(cfg, imports: bool = True) -> None:
    """Fail before anything runs, not hours later, when ood.suites names an unknown suite or (with `imports`)
    one whose optional extra is missing. (The config cannot check the names: it sits below evaluation.)"""
    for name in cfg.ood.suites:
        if name not in SUITES:
            raise ConfigError(f"ood.suites: unknown suite {name!r}; choose from {list(SUITES)}")
    for name in cfg.ood.suites if imports else []:
        columns, _ = SUITES[name].columns(cfg)
        # a suite none of whose columns runs here (web search without its key) imports nothing
        missing = [m for m in SUITES[name].modules(columns) if columns and importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"ood.suites: {name} needs the optional extra ({', '.join(missing)} missing): {EXTRA}")


def run_suite(suite: str, agent, cfg, out_dir, tag: str, source: str = "", progress: bool = True) -> dict:
    """Score `agent` on one suite; writes <out_dir>/<tag>.json.

    Episodes run under the suite token limits (ood.max_*_tokens), not training's."""
    cfg = suite_config(cfg)
    if isinstance(agent, ModelAgent):
        agent = agent.with_config(cfg)
    return SUITES[suite].run(agent, cfg, out_dir, tag, source=source, progress=progress)


def suite_config(cfg):
    """A copy of cfg whose rollout limits are the suites' (ood.max_prompt/response/total_tokens)."""
    cfg = copy.deepcopy(cfg)
    cfg.rollout.max_prompt_tokens = cfg.ood.max_prompt_tokens
    cfg.rollout.max_response_tokens = cfg.ood.max_response_tokens
    cfg.rollout.max_total_tokens = cfg.ood.max_total_tokens
    cfg.validate()
    return cfg


def print_suite(result: dict) -> None:
    """One line per suite result, and one per skipped column with its reason."""
    cells = " | ".join(f"{k} {100 * v:.2f}%" for k, v in result["scores"].items())
    user = f", user: {result['user_simulator']}" if result.get("user_simulator") else ""
    print(f"[eval] {result['tag']} ({result['policy']}{user}): {cells or 'nothing ran'}")
    for column, reason in result["skipped"].items():
        print(f"[eval] {result['tag']}: {column} skipped: {reason}")
