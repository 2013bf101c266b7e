"""The out-of-distribution suites as one entry point: check, run, print (BFCL V4 memory and web search,
tau2-bench). What the suites share (optional imports, the network guard, the result dict) is in
seal_mini.evaluation.ood; each suite's own protocol is in bfcl_v4.py and tau2.py.
"""

from __future__ import annotations

import copy
import importlib.util
import os

from seal_mini.config import ConfigError
from seal_mini.evaluation import bfcl_v4, tau2
from seal_mini.evaluation.agents import ModelAgent, ScriptedAgent
from seal_mini.evaluation.bfcl_v4 import evaluate_bfcl_v4
from seal_mini.evaluation.ood import EXTRA, SUITE_MODULES
from seal_mini.evaluation.tau2 import ScriptedUser, evaluate_tau2


def check_suites(cfg) -> None:
    """Fail before training, not hours later, when a suite the recipe names cannot be imported."""
    for suite in cfg.ood.suites:
        if suite == "bfcl_v4_web_search" and not os.environ.get("SERPAPI_API_KEY"):
            continue  # it will be skipped with its reason; nothing of it gets imported
        modules = list(SUITE_MODULES[suite])
        if suite == "bfcl_v4_memory" and "vector" in cfg.ood.memory_backends and cfg.ood.embedding_model:
            modules += ["sentence_transformers", "faiss"]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"ood.suites: {suite} needs the optional extra ({', '.join(missing)} missing): {EXTRA}")


def run_suite(suite: str, agent, cfg, out_dir, tag: str, source: str = "", progress: bool = True) -> dict:
    """Score `agent` on one suite (tau2 or a BFCL V4 suite); writes <out_dir>/<tag>.json.

    Episodes run under the suite token limits (ood.max_*_tokens), not training's. tau2's user simulator
    comes from cfg.ood; a scripted agent gets the scripted user that carries out the device actions its
    replay asks for."""
    cfg = suite_config(cfg)
    if isinstance(agent, ModelAgent):
        agent = ModelAgent(agent.policy, cfg, adapter=agent.adapter, temperature=agent.temperature)
    if suite == "tau2":
        user = ScriptedUser() if isinstance(agent, ScriptedAgent) else None
        return evaluate_tau2(agent, cfg, out_dir, tag, source=source, user=user, progress=progress)
    return evaluate_bfcl_v4(agent, cfg, out_dir, tag, suite=suite, source=source, progress=progress)


def suite_config(cfg):
    """A copy of cfg whose rollout limits are the suites' (ood.max_prompt/response/total_tokens)."""
    cfg = copy.deepcopy(cfg)
    cfg.rollout.max_prompt_tokens = cfg.ood.max_prompt_tokens
    cfg.rollout.max_response_tokens = cfg.ood.max_response_tokens
    cfg.rollout.max_total_tokens = cfg.ood.max_total_tokens
    cfg.validate()
    return cfg


def scripted_agent(suite: str, mode: str):
    """A suite's scripted policy (replays of what the package ships, or empty answers)."""
    if suite == "tau2":
        return ScriptedAgent(mode, tau2.SCRIPTED)
    return bfcl_v4.scripted_agent(mode)


def print_suite(result: dict) -> None:
    """One line per suite result, and one per skipped column with its reason."""
    cells = " | ".join(f"{k} {100 * v:.2f}%" for k, v in result["scores"].items())
    user = f", user: {result['user_simulator']}" if result.get("user_simulator") else ""
    print(f"[eval] {result['tag']} ({result['policy']}{user}): {cells or 'nothing ran'}")
    for column, reason in result["skipped"].items():
        print(f"[eval] {result['tag']}: {column} skipped: {reason}")
