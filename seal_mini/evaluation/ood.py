"""What the out-of-distribution suites share: the Suite protocol, optional imports, the network guards, results.

The suites (seal_mini.evaluation.bfcl_v4 for BFCL V4 memory and web search, seal_mini.evaluation.tau2 for
tau2-bench) never train; they score a policy the way their packages do. Each module declares its `Suite`
objects; seal_mini.evaluation.suites.SUITES lists each once. Each suite episode fits the rollout engine's
reset / step / truncate contract, so a model policy runs through the same engine, the same `ModelAgent`
and the same trajectory records as the held-in BFCL V3 evaluation.

A suite result (<run_dir>/eval/<suite>_<base|adapter>.json) is one dict:
    suite, tag, policy, source        what was scored, as in the held-in results
    user_simulator                    who played the user (tau2), None where no user is simulated
    scores    {column: success rate}  one column per memory back end / web-search set / tau2 domain
    passed, total {column: count}
    truncated {column: count}         episodes a token limit ended (they score 0)
    skipped   {column: reason}        columns that could not run here, with the one-line reason
    mean                              the mean over the columns that ran (Table 2's average)
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from seal_mini.config import Config, ConfigError
from seal_mini.evaluation.agents import ScriptedAgent

EXTRA = "pip install -r requirements-ood.txt"


def require(module: str, suite: str) -> None:
    """Import check for a suite's optional dependency, with the install line when it is missing."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{suite} needs the optional extra ({e.name} is missing): {EXTRA}") from None


class NetworkRefused(ConnectionRefusedError):
    """A connection or name lookup that an active network guard does not allow."""


ACTIVE: list[str] = []
"""The guards now in force ("loopback" or "public"), outermost first; every one must allow an access."""
REFUSED: list[str] = []
"""Every access a guard refused in this process (tests check that a suite attempted none)."""


def _ip(host) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        return ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return None


def _allows(mode: str, host, lookup: bool) -> bool:
    """Whether a guard lets this host through: a name lookup (lookup=True) or a connection / datagram."""
    ip = _ip(host)
    if mode == "loopback":
        return host in ("localhost", b"localhost", "", None) or (ip is not None and ip.is_loopback)
    # "public": any name may be looked up; only globally routable addresses may be contacted, so a model
    # steering a web-fetch tool cannot reach this machine, its network or a cloud metadata service.
    if lookup:
        return True
    if ip is None:  # a host name given straight to connect(): check what it resolves to
        infos = socket.getaddrinfo(host, None)
        return bool(infos) and all(_allows(mode, info[4][0], lookup=False) for info in infos)
    return ip.is_global


def _audit(event: str, args: tuple) -> None:
    # Audit events are raised from C for every socket, whatever library or event loop made the call.
    if not ACTIVE or not event.startswith("socket."):
        return
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return  # Unix sockets, and sendmsg on a connected socket (already checked at connect)
        host, lookup = address[0], False
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
        host, lookup = args[0], True
    elif event == "socket.getnameinfo":
        host, lookup = args[0][0], True
    else:
        return
    if not all(_allows(mode, host, lookup) for mode in list(ACTIVE)):
        what = "name lookup of" if lookup else "network access to"
        REFUSED.append(f"{event} {host!r}")
        raise NetworkRefused(f"{what} {host!r} refused: this runs offline ({' + '.join(ACTIVE)} only)")


_hook_installed = False


@contextlib.contextmanager
def _guard(mode: str) -> Iterator[None]:
    global _hook_installed
    if not _hook_installed:  # an audit hook cannot be removed: install one, switched by ACTIVE
        sys.addaudithook(_audit)
        _hook_installed = True
    ACTIVE.append(mode)
    try:
        yield
    finally:
        ACTIVE.pop()


def loopback_only():
    """Within this block, any connection, datagram or name lookup outside loopback raises NetworkRefused.

    The suites' packages carry clients for remote services (LLM APIs, telemetry, model hubs); this
    makes sure none is ever contacted, whatever a package does on import or at run time. (Child
    processes are not covered; the suites start none.)"""
    return _guard("loopback")


def public_only():
    """Within this block only globally routable addresses may be contacted (web search: a model-chosen
    URL must not reach this machine, its local network or a metadata service)."""
    return _guard("public")


@dataclass(frozen=True)
class Suite:
    """An out-of-distribution suite: everything that checking, running and scripting it takes (what would
    otherwise be a branch on its name). An entry that leaves a field out fails at import."""

    name: str
    """Its name in ood.suites, `eval --suite` and the result files (eval/<name>_base.json)."""
    columns: Callable[[Config], tuple[list[str], dict[str, str]]]
    """(the columns it runs under cfg, {column: why it is skipped}): back ends, web-search sets, domains."""
    modules: Callable[[list[str]], tuple[str, ...]]
    """The optional extra's modules that running these columns imports."""
    run: Callable[..., dict]
    """run(agent, cfg, out_dir, tag, source="", progress=True) -> the result; writes <out_dir>/<tag>.json."""
    scripted: Callable[[str], ScriptedAgent]
    """Its scripted agent of a mode (`eval --scripted MODE`); an unknown mode is a ConfigError."""
    guard: Callable[[], contextlib.AbstractContextManager] = loopback_only
    """The network it may reach while it runs (web search: the public internet only)."""
    domains: str = ""
    """The cfg.ood key that `eval --domains` sets; empty: --domains does not apply."""
    prefix: str = ""
    """What the report writes before its column names ("tau2" -> "tau2 retail"); empty: the names alone."""


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
    truncated = {c: sum(1 for r in rows if r["column"] == c and r.get("truncated")) for c in columns}
    return {
        "suite": suite,
        "tag": tag,
        "policy": agent_name,
        "source": source,
        "user_simulator": user_simulator,
        "scores": scores,
        "passed": passed,
        "total": total,
        "truncated": truncated,
        "skipped": dict(skipped),
        "mean": sum(scores.values()) / len(scores) if scores else None,
    }
