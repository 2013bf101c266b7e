"""What the out-of-distribution suites share: optional imports, the loopback-only guard, results.

The suites (seal_mini.memory_eval for BFCL V4 memory and web search, seal_mini.tau2_eval for
tau2-bench) never train; they score a policy the way their packages do. Each suite episode fits the
rollout engine's reset / step / truncate contract, so a model policy runs through the same engine,
the same `ModelAgent` and the same trajectory records as the held-in BFCL V3 evaluation.

A suite result (<run_dir>/eval/<suite>_<base|adapter>.json) is one dict:
    suite, tag, policy, source        what was scored, as in the held-in results
    user_simulator                    who played the user (tau2), None where no user is simulated
    scores    {column: success rate}  one column per memory back end / web-search set / tau2 domain
    passed, total {column: count}
    skipped   {column: reason}        columns that could not run here, with the one-line reason
    mean                              the mean over the columns that ran (Table 2's average)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import ipaddress
import socket
from collections.abc import Iterator

from seal_mini.config import ConfigError

EXTRA = "pip install -r requirements-ood.txt"


def require(module: str, suite: str) -> None:
    """Import check for a suite's optional dependency, with the install line when it is missing."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{suite} needs the optional extra ({e.name} is missing): {EXTRA}") from None


SUITE_MODULES = {
    "bfcl_v4_memory": ("overrides", "rank_bm25"),
    "bfcl_v4_web_search": ("serpapi", "html2text", "bs4"),
    "tau2": ("tau2",),
}
"""What each suite needs from the optional extra (module names)."""


def check_suites(cfg) -> None:
    """Fail before training, not hours later, when a suite the recipe names cannot be imported."""
    for suite in cfg.ood.suites:
        modules = list(SUITE_MODULES[suite])
        if suite == "bfcl_v4_memory" and "vector" in cfg.ood.memory_backends and cfg.ood.embedding_model:
            modules += ["sentence_transformers", "faiss"]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"ood.suites: {suite} needs the optional extra ({', '.join(missing)} missing): {EXTRA}")


class NetworkRefused(ConnectionRefusedError):
    """A connection to a non-loopback address was attempted inside `loopback_only()`."""


def _is_loopback(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False  # a host name other than localhost: resolving it is already network access


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Within this block, any connection or name lookup outside loopback raises NetworkRefused.

    The suites' packages carry clients for remote services (LLM APIs, telemetry, model hubs); this
    makes sure none is ever contacted, whatever a package does on import or at run time."""
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def refuse(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise NetworkRefused(f"network access to {address[0]!r} refused: suites run offline (loopback only)")

    def connect(self, address):
        refuse(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        refuse(self, address)
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            raise NetworkRefused(f"name lookup of {host!r} refused: suites run offline (loopback only)")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = (
            real_connect,
            real_connect_ex,
            real_getaddrinfo,
        )


def suite_result(
    suite: str,
    tag: str,
    agent_name: str,
    source: str,
    rows: list[dict],
    columns: list[str],
    skipped: dict[str, str],
    user_simulator: str | None = None,
) -> dict:
    """The result dict of a suite from its scored rows (each has "column" and "reward" in [0, 1])."""
    passed = {c: sum(r["reward"] for r in rows if r["column"] == c) for c in columns}
    total = {c: sum(1 for r in rows if r["column"] == c) for c in columns}
    scores = {c: passed[c] / total[c] for c in columns if total[c]}
    return {
        "suite": suite,
        "tag": tag,
        "policy": agent_name,
        "source": source,
        "user_simulator": user_simulator,
        "scores": scores,
        "passed": passed,
        "total": total,
        "skipped": dict(skipped),
        "mean": sum(scores.values()) / len(scores) if scores else None,
    }


def run_suite(suite: str, agent, cfg, out_dir, tag: str, source: str = "", progress: bool = True) -> dict:
    """Score `agent` on one suite (tau2 or a BFCL V4 suite); writes <out_dir>/<tag>.json.

    tau2's user simulator comes from cfg.ood; a scripted agent gets the scripted user that carries out
    the device actions its replay asks for."""
    if suite == "tau2":
        from seal_mini.tau2_eval import ScriptedUser, Tau2ScriptedAgent, evaluate_tau2

        user = ScriptedUser() if isinstance(agent, Tau2ScriptedAgent) else None
        return evaluate_tau2(agent, cfg, out_dir, tag, source=source, user=user, progress=progress)
    from seal_mini.bfcl_v4 import evaluate_bfcl_v4

    return evaluate_bfcl_v4(agent, cfg, out_dir, tag, suite=suite, source=source, progress=progress)


def scripted_agent(suite: str, mode: str):
    """A suite's scripted policy (replays of what the package ships, or empty answers)."""
    if suite == "tau2":
        from seal_mini.tau2_eval import Tau2ScriptedAgent

        return Tau2ScriptedAgent(mode)
    from seal_mini.bfcl_v4 import ScriptedAgenticAgent

    return ScriptedAgenticAgent(mode)


def print_suite(result: dict) -> None:
    cells = " | ".join(f"{k} {100 * v:.2f}%" for k, v in result["scores"].items())
    user = f", user: {result['user_simulator']}" if result.get("user_simulator") else ""
    print(f"[eval] {result['tag']} ({result['policy']}{user}): {cells or 'nothing ran'}")
    for column, reason in result["skipped"].items():
        print(f"[eval] {result['tag']}: {column} skipped: {reason}")
