"""The system under test: start/stop the reference deployment, or health-check an external one.

The harness never imports `server`: the reference deployment is `python -m server.serve`,
started in its own session (Ctrl-C reaches the harness only, which stops it in order) and
known only through its ready file and HTTP, exactly as a vLLM deployment would be.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from contract.host import OWN_GROUP
from harness.plan import ExternalTarget, Plan, ReferenceTarget, VllmTarget
from harness.samplers.http import request

READY_POLL_S = 0.2


class TargetError(RuntimeError):
    """The target could not be started or reached; the message says which and why."""


@dataclass(slots=True)
class RunningTarget:
    """What the rest of the run needs to know about a target that is up."""

    base_url: str  # where traffic goes (gateway, or the external URL)
    kind: str  # reference | vllm | sglang | tgi | openai
    replicas: list[dict[str, Any]] = field(default_factory=list)  # [{"id","pid","port","url"}]
    gateway_pid: int | None = None
    admin_key: str | None = None
    server_log: Path | None = None
    state_dir: Path | None = None
    api_key: str | None = None  # external: the key every user sends


def _describe_http(
    base_url: str, paths: tuple[str, ...], token: str | None = None
) -> dict[str, Any]:
    """JSON bodies of the info endpoints that answer (missing ones are simply absent)."""
    found: dict[str, Any] = {}
    for path in paths:
        try:
            resp = request(base_url + path, timeout_s=3.0, token=token)
            if resp.status == 200:
                found[path] = resp.json()
        except (OSError, ValueError):
            continue
    return found


def _first(*values: Any) -> str | None:
    """The first value given, as text (meta.json's target fields are text, and a server's
    info endpoints are not held to that), or None."""
    found = next((v for v in values if v not in (None, "")), None)
    return None if found is None else str(found)


class ReferenceDeployment:
    """The shipped gateway + replicas as child processes.

    Invariant: after `stop()` returns, no process this object started is alive (SIGTERM to
    the serve process, then SIGKILL to its session and any replica PID still running).
    """

    def __init__(self, spec: ReferenceTarget, plan: Plan, run_dir: Path) -> None:
        self.spec = spec
        self.plan = plan
        self.dir = run_dir / "server"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = self.dir / "ready.json"
        self.log_path = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.running: RunningTarget | None = None

    def command(self) -> list[str]:
        spec = self.spec
        cmd = [sys.executable, "-m", "server.serve", "--replicas", str(spec.replicas)]
        cmd += ["--policy", spec.policy, "--gpu", spec.gpu, "--model", spec.model]
        cmd += ["--host", "127.0.0.1", "--port", "0"]
        cmd += ["--state-dir", str(self.dir / "state"), "--ready-file", str(self.ready_file)]
        config = self.plan.resolve(spec.scheduler_config)
        if spec.scheduler:
            config = self.dir / "scheduler.yaml"
            config.write_text(yaml.safe_dump(spec.scheduler, sort_keys=True))
        if config is not None:
            cmd += ["--config", str(config)]
        tenants = self.plan.resolve(spec.tenants)
        if tenants is not None:
            cmd += ["--tenants", str(tenants)]
        if spec.time_scale is not None:
            cmd += ["--time-scale", str(spec.time_scale)]
        if spec.kv_actual_factor is not None:
            cmd += ["--kv-actual-factor", str(spec.kv_actual_factor)]
        if spec.mutant is not None:
            cmd += ["--mutant", spec.mutant]
        return cmd + list(spec.extra_args)

    def start(self) -> RunningTarget:
        repo_root = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.ready_file.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=repo_root,
                env=env,
                process_group=OWN_GROUP,
            )
        ready = self._wait_ready()
        self.running = RunningTarget(
            base_url=str(ready["gateway_url"]).rstrip("/"),
            kind="reference",
            replicas=list(ready.get("replicas", [])),
            gateway_pid=int(ready.get("pid") or self.proc.pid),
            admin_key=self.spec.admin_key,
            server_log=self.log_path,
            state_dir=self.dir / "state",
        )
        return self.running

    def _wait_ready(self) -> dict[str, Any]:
        assert self.proc is not None
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetError(
                    f"the reference server exited with code {self.proc.returncode} before it "
                    f"was ready; see {self.log_path}:\n{self._log_tail()}"
                )
            if self.ready_file.exists():
                try:
                    ready: dict[str, Any] = json.loads(self.ready_file.read_text())
                    return ready
                except json.JSONDecodeError:
                    pass  # being written; read it again on the next poll
            time.sleep(READY_POLL_S)
        raise TargetError(
            f"the reference server was not ready within {self.spec.startup_timeout_s}s "
            f"(target.startup_timeout_s); see {self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def describe(self) -> dict[str, Any]:
        assert self.running is not None
        # The reference server's /debug/info takes a key; the admin key is the harness's.
        info = _describe_http(
            self.running.base_url, ("/debug/info", "/v1/models"), self.running.admin_key
        )
        return describe_reference(self.spec, self.running, info)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None:
            return
        # psutil.Process objects (not bare PIDs) so a recycled PID is never signalled;
        # children() also finds restarted replicas, whose PIDs the ready file does not list
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.proc.pid).children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.status() == psutil.STATUS_STOPPED:
                    child.resume()  # a paused process cannot act on SIGTERM
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        self.proc = None


def describe_reference(
    spec: ReferenceTarget, running: RunningTarget, info: dict[str, Any]
) -> dict[str, Any]:
    """meta.json's `target` for the reference deployment, from the server's own endpoints."""
    debug = info.get("/debug/info") or {}
    models = (info.get("/v1/models") or {}).get("data") or [{}]
    model = models[0] if models else {}
    config = debug.get("scheduler_config") or debug.get("config") or spec.scheduler or {}
    config_digest = _first(
        debug.get("scheduler_config_digest"),
        model.get("scheduler_config_digest"),
        hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest() if config else None,
    )
    return {
        "url": running.base_url,
        "kind": "reference",
        "model": _first(debug.get("model"), model.get("id"), spec.model),
        "model_digest": _first(debug.get("model_digest"), model.get("model_digest")),
        "runtime_version": _first(debug.get("runtime_version"), model.get("runtime_version")),
        "gpu_sku": _first(debug.get("gpu_sku"), model.get("gpu_sku"), spec.gpu),
        "scheduler_config_digest": config_digest,
        "policy": _first(debug.get("policy"), spec.policy),
        "mutant": _first(debug.get("mutant"), spec.mutant),
        "replicas": [{"id": r.get("id"), "url": r.get("url")} for r in running.replicas],
        "config": config,
        "server_info": info,
    }


class ExternalDeployment:
    """A server someone else runs: checked for health, described, never started or stopped."""

    def __init__(self, spec: ExternalTarget) -> None:
        self.spec = spec
        self.info: dict[str, Any] = {}

    def start(self) -> RunningTarget:
        url = self.spec.url + (self.spec.health_path or self.spec.profile.health_path)
        deadline = time.monotonic() + self.spec.health_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                resp = request(url, timeout_s=3.0)
                if resp.status == 200:
                    return RunningTarget(self.spec.url, self.spec.kind, api_key=self.spec.api_key)
                last = f"HTTP {resp.status}"
            except OSError as exc:
                last = str(exc)
            time.sleep(1.0)
        raise TargetError(
            f"{url} was not healthy within {self.spec.health_timeout_s}s ({last}); is the "
            "server running, and is target.url (or --target-url) right?"
        )

    def describe(self) -> dict[str, Any]:
        info = _describe_http(self.spec.url, self.spec.profile.info_paths, self.spec.api_key)
        models = (info.get("/v1/models") or {}).get("data") or [{}]
        tgi = info.get("/info") or {}
        version = info.get("/version") or {}
        return {
            "url": self.spec.url,
            "kind": self.spec.kind,
            "model": _first(self.spec.model, tgi.get("model_id"), models[0].get("id")),
            "model_digest": _first(tgi.get("model_sha"), models[0].get("model_digest")),
            "runtime_version": _first(version.get("version"), tgi.get("version")),
            "gpu_sku": None,  # filled from NVML by the orchestrator when it sees a GPU
            "scheduler_config_digest": None,
            "policy": None,
            "mutant": None,
            "replicas": [],
            "config": {},
            "server_info": info,
        }

    def stop(self) -> None:
        """Nothing to stop: the harness does not own an external server."""


class ManagedVllmDeployment:
    """A vLLM server kvgate runs (harness/engines/vllm_deployment.py), described like an
    external one once it is up, with the engine flags it was started with."""

    def __init__(self, spec: VllmTarget, run_dir: Path, say: Callable[[str], None]) -> None:
        from harness.engines.vllm_deployment import VllmDeployment

        self.spec = spec
        self.engine = VllmDeployment(spec, run_dir, say)
        self.external = ExternalDeployment(spec)

    def start(self) -> RunningTarget:
        url = self.engine.start()
        assert self.engine.proc is not None and self.engine.launch is not None
        replica = {"id": "vllm", "pid": self.engine.proc.pid, "port": self.engine.port, "url": url}
        return RunningTarget(
            base_url=url,
            kind="vllm",
            replicas=[replica],
            server_log=self.engine.launch.log_path,
            api_key=self.spec.api_key,
        )

    def describe(self) -> dict[str, Any]:
        meta = self.external.describe()
        flags = self.spec.model_dump(
            exclude={"type", "url", "kind", "api_key", "health_path", "pid", "pidfile", "env"}
        )
        meta.update(
            policy=self.spec.scheduling_policy,
            replicas=[{"id": "vllm", "url": self.spec.url}],
            config=flags,
            gpu_sku=meta.get("gpu_sku") or ("cpu" if self.spec.device == "cpu" else None),
            scheduler_config_digest=hashlib.sha256(
                json.dumps(flags, sort_keys=True, default=str).encode()
            ).hexdigest(),
        )
        return meta

    def stop(self) -> None:
        self.engine.stop()


Deployment = ReferenceDeployment | ManagedVllmDeployment | ExternalDeployment


def make_deployment(plan: Plan, run_dir: Path, say: Callable[[str], None] = print) -> Deployment:
    if isinstance(plan.target, ReferenceTarget):
        return ReferenceDeployment(plan.target, plan, run_dir)
    if isinstance(plan.target, VllmTarget):
        return ManagedVllmDeployment(plan.target, run_dir, say)
    return ExternalDeployment(plan.target)
