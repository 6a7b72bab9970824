"""Checks on an external target before any load is sent: it answers, and serves the model.

A run against a server that is not there, or that would refuse every request for naming the
wrong model, proves nothing about that server, so these are set-up errors (exit 2) with
what to do, found in seconds rather than after the whole plan:
- nothing answers at the URL (within target.health_timeout_s);
- /v1/models refuses the key;
- target.model is not among the models the server lists; with no target.model, the one
  model it lists is used (several: the user must choose).
And a warning, not an error: a target on this host that runs in another scheduling group
than kvgate (session or cpu cgroup), among which the kernel shares the CPUs first
(contract.host.OWN_GROUP says what that did to a run); the loop_kept_up evidence check
judges what it costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.plan import ExternalTarget, Plan, VllmTarget
from harness.samplers.host import is_this_host, listening_pid
from harness.samplers.http import request

PROC = Path("/proc")
AUTOGROUPS = PROC / "sys/kernel/sched_autogroup_enabled"
RETRY_S = 1.0
SAY_EVERY_S = 5.0  # how often a wait for the target says so on the console


class PreflightError(RuntimeError):
    """The target cannot be judged as configured; the message says why and what to do."""


def _models(target: ExternalTarget, say: Callable[[str], None]) -> list[str] | None:
    """The model ids /v1/models lists, None when the server has no such endpoint."""
    url = target.url + "/v1/models"
    t0 = time.monotonic()
    next_say = t0 + SAY_EVERY_S
    last = "no answer"
    while True:
        try:
            resp = request(url, token=target.api_key, timeout_s=5.0)
            break
        except OSError as exc:
            last = str(getattr(exc, "reason", exc))
        waited = time.monotonic() - t0
        if waited >= target.health_timeout_s:
            raise PreflightError(
                f"nothing answers at {target.url} ({last}) within {target.health_timeout_s:g} s; "
                "is the server running, and are --target-url / target.url right?"
            )
        if time.monotonic() >= next_say:
            next_say += SAY_EVERY_S
            say(
                f"kvgate: waiting for {url} to answer ({waited:.0f} s of "
                f"{target.health_timeout_s:g} s: {last})"
            )
        time.sleep(RETRY_S)
    if resp.status in (401, 403):
        raise PreflightError(
            f"{url} refused the key (HTTP {resp.status}); set target.api_key "
            "(--set target.api_key=...) to a key this server accepts"
        )
    if resp.status == 404:
        return None
    if resp.status != 200:
        raise PreflightError(f"{url} answered HTTP {resp.status}: {resp.body[:200]!r}")
    try:
        data: Any = resp.json()
        return [str(m["id"]) for m in data["data"]]
    except (ValueError, KeyError, TypeError):
        raise PreflightError(
            f"{url} did not answer an OpenAI model list ({{'data': [{{'id': ...}}]}}): "
            f"{resp.body[:200]!r}"
        ) from None


def check_external(plan: Plan, say: Callable[[str], None] = print) -> Plan:
    """The plan, its external target's model resolved; PreflightError when it cannot run.
    A vLLM target kvgate starts itself is checked when it is up (harness/target.py)."""
    target = plan.target
    if isinstance(target, VllmTarget):
        from harness.engines.vllm import VllmInstallError, python_and_model

        try:
            python_and_model(target)
        except VllmInstallError as exc:
            raise PreflightError(str(exc)) from None
        return plan
    if not isinstance(target, ExternalTarget):
        return plan
    served = _models(target, say)
    apart = other_scheduler_group(target.url)
    if apart is not None:
        say(f"kvgate: warning: {apart}")
    if served is None:
        if target.model is None:
            raise PreflightError(
                f"{target.url} has no /v1/models to say what it serves; name the model with "
                "--set target.model=NAME"
            )
        return plan
    if target.model is None:
        if len(served) != 1:
            listed = ", ".join(served) or "none"
            raise PreflightError(
                f"{target.url} serves {len(served)} models ({listed}); choose one with "
                "--set target.model=NAME"
            )
        return plan.model_copy(update={"target": target.model_copy(update={"model": served[0]})})
    if target.model not in served:
        raise PreflightError(
            f"model {target.model!r} is not served at {target.url}; it serves: "
            f"{', '.join(served) or 'none'}. Set target.model to one of them"
        )
    return plan


def scheduler_group(pid: int | str, proc: Path = PROC) -> str:
    """The group among which the kernel's CPU scheduler shares the CPUs first, for process
    `pid` (or "self"): its cpu cgroup when that is not the root one (autogroups apply only in
    the root), else its session's autogroup while autogroups are on, else the root. A process
    whose session never had one of its own (no setsid above it, as under some CI runners)
    is in the default autogroup, whose file reads empty: a group like any other.
    OSError or ValueError when /proc cannot tell."""
    where = proc / str(pid)
    for line in (where / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)  # "4:cpu,cpuacct:/path"; v1 only
        if "cpu" in controllers.split(",") and path not in ("", "/"):
            return f"cgroup {path}"
    if (proc / AUTOGROUPS.relative_to(PROC)).read_text().strip() != "1":
        return "root"
    said = (where / "autogroup").read_text().split()
    return said[0] if said else "the default autogroup"


def other_scheduler_group(url: str, proc: Path = PROC) -> str | None:
    """Why the server listening at `url` may starve kvgate's load generator, or None: it runs
    on this host in another scheduling group than kvgate (another session while the kernel's
    autogroups are on, which share the CPUs between sessions before threads, or another cpu
    cgroup). None also when it cannot be told."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not parts.hostname or not is_this_host(parts.hostname):
        return None
    try:
        pid = listening_pid(port)
        if pid is None:
            return None
        theirs, ours = scheduler_group(pid, proc), scheduler_group("self", proc)
    except (OSError, ValueError):
        return None
    if theirs == ours:
        return None
    return (
        f"the server at {url} (pid {pid}) runs in another scheduling group than kvgate "
        f"({theirs}, kvgate's: {ours}), and the kernel shares the CPUs between groups before "
        "threads (another session while kernel.sched_autogroup_enabled is 1, or another cpu "
        "cgroup): a busy server then takes them from kvgate's load generator, and a run whose "
        "generator falls behind reads INVALID (loop_kept_up). Start the server from the shell "
        "that runs kvgate, or run kvgate on another host"
    )
