"""One run, in order: target up, samplers on, idle baseline, load with faults, idle after, teardown.

`Orchestrator.run()` is the only sequence; `_teardown` always runs (Ctrl-C, errors) and
stops what was started in reverse order: faults (their rollbacks), users, workers, the
proxy of network faults, the sampler process (after a last drain of the event log), the
target. Then the JSON lines are compacted and meta.json gets everything a later reader needs.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from locust.runners import STATE_STOPPED
from rich.console import Console

from contract.host import OWN_GROUP
from contract.runmeta import RunMeta, RunStatus
from gates import run_profile, schema
from gates.rundir import read_table
from gates.spec import load_gate_file
from harness import replay, rundir, summary
from harness.faults.admin import ReplicaAdmin
from harness.faults.base import ReplicaAdminAPI
from harness.faults.proxy import ProxyInPath, start_proxy_in_path
from harness.faults.scheduler import FaultScheduler
from harness.live.console import Progress
from harness.live.until import UntilDecided
from harness.live.watch import RunWatch
from harness.live.web import LiveState, start_web_ui
from harness.loadgen import Distribution, LoadGenerator
from harness.plan import ExternalTarget, Plan, VllmTarget
from harness.release_probe import PROBE_MAX_TOKENS, ProbeSpec, prompt_tokens_for, run_probes
from harness.samplers.nvml import describe_gpus, load_pynvml
from harness.samplers.process import OWN_ROLE, SamplerConfig
from harness.sink import RecordSink
from harness.target import Deployment, ManagedVllmDeployment, RunningTarget, make_deployment
from harness.traffic import build_shape, build_user_classes, run_block_tokens, target_profile
from workloads.blocks import BlockCheck
from workloads.prompts import generator_for
from workloads.shapes import StepRampShape

log = logging.getLogger(__name__)
SAMPLER_STOP_TIMEOUT_S = 20.0


@dataclass(slots=True)
class RunResult:
    run_dir: Path
    status: RunStatus  # completed | interrupted | error
    error: str | None = None


@dataclass(slots=True)
class Clock:
    """Epoch timestamps of the run's edges (None until reached)."""

    t_start: float = field(default_factory=time.time)
    load_start: float | None = None
    load_end: float | None = None
    idle_before: tuple[float, float] | None = None
    after_load: tuple[float, float] | None = None
    t_end: float | None = None


class Orchestrator:
    """Runs one plan into one run directory. Invariant: every process it starts, it stops."""

    def __init__(
        self,
        plan: Plan,
        run_dir: Path,
        layout: Distribution,
        console: Console,
        web: tuple[str, int, str | None] | None = None,  # --web: host, port, token
    ) -> None:
        self.plan = plan
        self.web = web
        self.web_ui: Any = None
        self.live: LiveState | None = None
        self.web_stop = False
        self.run_dir = run_dir
        self.layout = layout
        self.console = console
        self.clock = Clock()
        self.requests = rundir.TableWriter(run_dir, schema.REQUESTS)
        self.faults_writer = rundir.TableWriter(run_dir, schema.FAULTS)
        self.sink = RecordSink(self.requests)
        self.deployment: Deployment = make_deployment(
            plan, run_dir, lambda text: console.print(text, highlight=False)
        )
        self.target: RunningTarget | None = None
        self.proxy: ProxyInPath | None = None  # only for plans with a network fault
        self.target_meta: dict[str, Any] = {}
        self.sampler: subprocess.Popen[bytes] | None = None
        self.loadgen: LoadGenerator | None = None
        self.faults: FaultScheduler | None = None
        self.probe_rows: list[dict[str, object]] = []  # release probe rows, written at teardown
        self.aborted: dict[str, Any] | None = None  # the gate that stopped the load, if one did
        self.until: UntilDecided | None = None  # load.until: decided: its stop rule
        self.progress: Progress | None = None
        self.shape: Any = None
        self.gpus: list[dict[str, Any]] = []
        self.blocks: BlockCheck | None = None  # a replay's block text, tokenized
        # The server profile the run uses, kept in meta.json from its first write, so judging
        # the run again later reads what it was made with, not the profile files of that day.
        self.profile = target_profile(plan)

    # -- the sequence ----------------------------------------------------------------------

    def run(self) -> RunResult:
        status: RunStatus = "error"
        error: str | None = None
        random.seed(self.plan.seed)
        self._write_meta("running")
        try:
            self._start_target()
            self._start_samplers()
            self._start_loadgen()
            self._idle_before()
            self._load()
            self._idle_after()
            self._release_probe()
            status = "completed"
        except KeyboardInterrupt as exc:
            status, error = "interrupted", f"interrupted ({exc or 'Ctrl-C'})"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            # the whole story for whoever debugs it; meta.json keeps the one-line summary
            (self.run_dir / "harness-error.log").write_text(traceback.format_exc())
        finally:
            self._teardown(status, error)
        return RunResult(self.run_dir, status, error)

    def _start_target(self) -> None:
        self.console.print(f"kvgate: starting target ({self.plan.target.type})", highlight=False)
        self.target = self.deployment.start()
        self.target_meta = self.deployment.describe()
        remote = self.layout.master_bind is not None
        self.proxy = start_proxy_in_path(self.plan, self.target.base_url, remote_workers=remote)
        if self.proxy is not None:
            self.target_meta["proxy"] = self.proxy.describe()
            self.console.print(
                f"kvgate: traffic goes through kvgate's proxy at {self.proxy.traffic_url} "
                "(the plan has network faults)",
                highlight=False,
            )
        nvml = load_pynvml()
        if nvml is not None:
            self.gpus = describe_gpus(nvml)
            if self.gpus and not self.target_meta.get("gpu_sku"):
                self.target_meta["gpu_sku"] = self.gpus[0]["name"]
        self.console.print(f"kvgate: target ready at {self.target.base_url}", highlight=False)

    def _start_samplers(self) -> None:
        assert self.target is not None
        s = self.plan.samplers
        intervals = {
            name: (iv.interval_s if iv.enabled else 0.0)
            for name, iv in (
                ("nvml", s.nvml),
                ("prometheus", s.prometheus),
                ("events", s.events),
                ("process", s.process),
                ("host", s.host),
            )
        }
        reference = self.target.kind == "reference"
        watch = {OWN_ROLE: os.getpid()}
        if self.target.gateway_pid:
            watch["gateway"] = self.target.gateway_pid
        pidfiles: dict[str, str] = {}
        target = self.plan.target
        if isinstance(target, ExternalTarget):  # the server's own process, when on this host
            if target.pid:
                watch["server"] = target.pid
            if target.pidfile:
                pidfiles["server"] = target.pidfile
        engine_events, engine_priorities = None, {}
        if isinstance(self.deployment, ManagedVllmDeployment):
            launch = self.deployment.engine.launch
            if launch is not None and launch.events_path is not None:
                engine_events = str(launch.events_path)
            values = target.profile.priority_values if isinstance(target, VllmTarget) else None
            engine_priorities = {str(v): k for k, v in (values or {}).items()}
            if launch is not None:
                pidfiles["server"] = str(launch.pidfile)
        config = SamplerConfig(
            run_dir=str(self.run_dir),
            gateway_url=self.target.base_url if reference else None,
            replicas=self.target.replicas,
            external_url=None if reference else self.target.base_url,
            admin_key=self.target.admin_key,
            state_dir=str(self.target.state_dir) if self.target.state_dir else None,
            watch_pids=watch,
            watch_pidfiles=pidfiles,
            intervals=intervals,
            metric_prefixes=list(s.metric_prefixes),
            engine_events=engine_events,
            engine_priorities=engine_priorities,
            parent_pid=os.getpid(),
            max_runtime_s=self.plan.planned_seconds() + 600.0,
        )
        path = self.run_dir / "sampler.json"
        config.save(path)
        with (self.run_dir / "sampler.log").open("ab") as out:
            self.sampler = subprocess.Popen(
                [sys.executable, "-m", "harness.samplers.process", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parent.parent,
                process_group=OWN_GROUP,
            )

    def _start_loadgen(self) -> None:
        assert self.target is not None
        # the users' traffic goes through the proxy when there is one; samplers never do
        traffic_url = self.proxy.traffic_url if self.proxy else self.target.base_url
        classes = build_user_classes(self.plan, traffic_url)
        self.blocks = replay.check_blocks(self.plan)
        self.shape = build_shape(self.plan)
        self.loadgen = LoadGenerator(
            self.plan, classes, self.shape, traffic_url, self.sink, self.layout
        )
        self.loadgen.connect_workers()
        if self.plan.faults:
            # the replica kinds act on the reference gateway's replicas, or a managed engine
            key = self.target.admin_key
            admin: ReplicaAdminAPI | None = ReplicaAdmin(self.target.base_url, key) if key else None
            if isinstance(self.deployment, ManagedVllmDeployment):
                admin = self.deployment.engine
            self.faults = FaultScheduler(
                self.plan.faults,
                admin,
                self.faults_writer,
                self.sink.recent_cancels,
                proxy=self.proxy.client if self.proxy else None,
                own_pids=self._helper_pids,
            )
        if self.web is not None:
            self._start_web(self.web)
        self.progress = Progress(
            self.console,
            self.sink,
            self.run_dir / f"{schema.SAMPLES}.jsonl",
            self.plan.planned_seconds(),
            users=lambda: self.loadgen.users if self.loadgen else 0,
            faults=self._faults_label,
            decided=lambda: self.until.label() if self.until else None,
        )
        self.progress.start()

    def _start_web(self, web: tuple[str, int, str | None]) -> None:
        """Locust's web UI with the kvgate page (harness/live/web.py)."""
        assert self.loadgen is not None
        config = (self.target_meta.get("config") or {}) if self.target_meta else {}
        marks = ("admission_watermark", "hard_watermark")
        watermarks = {k: float(config[k]) for k in marks if isinstance(config.get(k), int | float)}
        self.live = LiveState(self.run_dir, self.sink, watermarks)
        self.live.fault_kinds = self.faults.kinds if self.faults else []
        self.web_ui, shown = start_web_ui(
            self.loadgen.env, self.live, self._stop_from_web, self._inject_from_web, web
        )
        self.console.print(f"kvgate: live page at {shown} (Locust's UI at /)", highlight=False)

    def _stop_from_web(self) -> None:
        self.web_stop = True

    def _inject_from_web(self, kind: str) -> str:
        if self.faults is None:
            raise ValueError("the plan has no faults to inject")
        return self.faults.inject_now(kind)

    def _helper_pids(self) -> list[int]:
        """kvgate's own helper processes, which no signal fault may pick."""
        pids = [self.sampler.pid] if self.sampler else []
        if self.proxy is not None:
            pids.append(self.proxy.process.pid)
        workers = self.loadgen.workers if self.loadgen else None
        if workers is not None:
            pids += [proc.pid for proc in workers.procs]
        return pids

    def _faults_label(self) -> str:
        if self.faults is None:
            return "0"
        failed = f" ({self.faults.failed} failed)" if self.faults.failed else ""
        return f"{self.faults.fired}/{len(self.faults.faults)}{failed}"

    def _idle_before(self) -> None:
        assert self.progress is not None
        self.progress.phase = "idle before load"
        t0 = time.time()
        gevent.sleep(self.plan.load.idle_before_s)
        self.clock.idle_before = (t0, time.time()) if self.plan.load.idle_before_s else None

    def _load(self) -> None:
        assert self.loadgen is not None and self.progress is not None
        self.progress.phase = "load"
        self.clock.load_start = time.time()
        if self.faults is not None:
            self.faults.start(time.monotonic())
        load = self.plan.load
        gates_file = self.plan.resolve(self.plan.gates)
        if load.until == "decided":
            assert load.min_duration_s is not None and load.max_duration_s is not None
            gates = load_gate_file(gates_file).gates
            self.until = UntilDecided(gates, load.min_duration_s, load.max_duration_s, self.shape)
        watch = RunWatch(
            self.run_dir,
            gates_file,
            self.plan.report_every_s,
            lambda: self._write_meta("running"),
            all_gates=self.live is not None,
            until=self.until,
        )

        def tick(elapsed_s: float) -> str | None:
            if self.live is not None:
                self.live.gates = watch.latest
                if self.until is not None:
                    self.live.until = {"text": self.until.label(), "gates": self.until.progress()}
            if self.web_stop:
                return "stopped from the web page"
            gen = self.loadgen
            if self.live is not None and gen is not None and gen.runner.state == STATE_STOPPED:
                return "stopped from Locust's web UI"  # its own stop button
            return watch.tick(elapsed_s)

        ran = False
        try:
            self.loadgen.run_load(load.duration_s, tick if watch.needed or self.live else None)
            ran = True
        finally:
            watch.close()
            self.aborted = watch.aborted
            self.clock.load_end = time.time()
            if self.until is not None:
                gen = self.loadgen
                because = gen.stopped_early if ran else "the run was interrupted or failed"
                self.until.stopped(
                    self.clock.load_end - self.clock.load_start, because, gen.shape_ended
                )
            if self.faults is not None:
                self.faults.stop()

    def _idle_after(self) -> None:
        assert self.progress is not None
        self.progress.phase = "idle after load"
        t0 = time.time()
        gevent.sleep(self.plan.load.idle_after_s)
        self.clock.after_load = (t0, time.time()) if self.plan.load.idle_after_s else None

    def _release_probe(self) -> None:
        """After the idle window (its memory baseline untouched): cancel-to-release from the
        KV gauge of an external server, which shows no per-request events."""
        target, probe = self.plan.target, self.plan.samplers.release_probe
        if not isinstance(target, ExternalTarget) or not probe.count or target.model is None:
            return
        if isinstance(target, VllmTarget) and target.record_events:
            return  # its scheduler recorder times every release of the run itself
        gauges = target.profile.metrics.kv_usage
        if not gauges:
            return
        assert self.progress is not None and self.target is not None
        self.progress.phase = "release probe"
        max_tokens = PROBE_MAX_TOKENS
        tokens = prompt_tokens_for(
            probe.prompt_tokens, self._max_model_len(), max_tokens, self.sink.prompt_ratio()
        )
        spec = ProbeSpec(
            base_url=self.target.base_url,
            model=target.model,
            api_key=target.api_key,
            metrics_url=target.url + "/metrics",
            gauge_names=gauges,
            prompt=generator_for(None).text(tokens, self.plan.seed),
            max_tokens=max_tokens,
            hz=probe.hz,
            wait_s=probe.wait_s,
        )
        self.probe_rows = run_probes(spec, probe.count)

    def _max_model_len(self) -> int | None:
        """The served model's context length, where the target's profile says its info
        endpoints give it (`info_fields`); None when they do not."""
        info = self.target_meta.get("server_info") or {}
        length = self.profile.info_value("max_model_len", info if isinstance(info, dict) else {})
        return int(length) if isinstance(length, int) and length > 0 else None

    def _write_probe_rows(self) -> None:
        """The probe's rows join the samples table once the sampler process has stopped."""
        if self.probe_rows:
            writer = rundir.TableWriter(self.run_dir, schema.SAMPLES)
            writer.write_many(self.probe_rows)
            writer.close()

    # -- teardown ----------------------------------------------------------------------------

    def _teardown(self, status: RunStatus, error: str | None) -> None:
        steps = (
            ("progress", self._stop_progress),
            ("faults", self._stop_faults),
            ("load generator", self._stop_loadgen),
            ("proxy", self._stop_proxy),
            ("samplers", self._stop_sampler),
            ("release probe", self._write_probe_rows),
            ("target", self.deployment.stop),
            ("writers", self._close_writers),
        )
        for name, step in steps:
            try:
                step()
            except BaseException as exc:  # keep tearing down; a second Ctrl-C included
                log.error("stopping the %s failed: %s", name, exc)
        self.clock.t_end = time.time()
        counts = rundir.compact(self.run_dir)
        self._write_meta(status, error, counts)

    def _stop_progress(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _stop_faults(self) -> None:
        if self.faults is None:
            return
        self.faults.stop()  # ends running faults' holds and waits for their rollbacks
        for unfinished in self.faults.unfinished_rollbacks:
            self.console.print(
                f"kvgate: WARNING: a fault's rollback did not finish ({unfinished}); the "
                "server may have been left down: check it before the next run",
                style="bold red",
                highlight=False,
            )

    def _stop_loadgen(self) -> None:
        if self.web_ui is not None:
            self.web_ui.stop()
        if self.loadgen is not None:
            self.loadgen.close()

    def _stop_proxy(self) -> None:
        if self.proxy is not None:
            self.target_meta["proxy"] = self.proxy.stop()  # with its final counters

    def _stop_sampler(self) -> None:
        if self.sampler is None or self.sampler.poll() is not None:
            return
        self.sampler.send_signal(signal.SIGTERM)
        try:
            self.sampler.wait(timeout=SAMPLER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.sampler.kill()
            self.sampler.wait(timeout=5)

    def _close_writers(self) -> None:
        self.requests.close()
        self.faults_writer.close()

    # -- meta.json ---------------------------------------------------------------------------

    def _windows(self) -> dict[str, Any]:
        c = self.clock
        stress = [c.load_start, c.load_end] if c.load_start and c.load_end else None
        return {
            "stress": stress,
            "idle_before": list(c.idle_before) if c.idle_before else None,
            "after_load": list(c.after_load) if c.after_load else None,
        }

    def _shape_facts(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        start = self.clock.load_start or self.clock.t_start
        end = self.clock.load_end or time.time()
        phases = []
        for phase in getattr(self.shape, "phases", None) or []:
            t0 = float(phase["t0"])
            # mid-run, the last phase still goes on: a look must not read it as a whole one
            still_open = phase.get("t1") is None and self.clock.load_end is None
            t1 = float(phase["t1"]) if phase.get("t1") is not None else end
            if t0 < 1e9:  # relative to the shape's start
                t0, t1 = start + t0, start + t1
            if t0 < end:
                span = {"name": phase["name"], "t0": t0, "t1": min(t1, end)}
                if still_open:
                    span["open"] = True
                phases.append(span)
        # A step ramp's knees, judged on every record (capacity_users and
        # capacity_bound_users: the bisection's bracket, the highest load that held and the
        # lowest that did not); no knees for other shapes.
        knees = getattr(self.shape, "knees", None)
        capacity = {
            **(knees() if callable(knees) else dict.fromkeys(StepRampShape.KNEES)),
            "stop_reason": getattr(self.shape, "stop_reason", None),
            "steps": getattr(self.shape, "steps", None),
        }
        return phases, capacity

    def _worker_hosts(self) -> list[dict[str, Any]]:
        """Load-generator hosts other than this one, from the records' `worker` (host:pid)."""
        here = summary.host_info()["hostname"]
        names = {w.rsplit(":", 1)[0] for w in self.sink.by_worker}
        return [{"hostname": name, "role": "worker"} for name in sorted(names - {here})]

    def _write_meta(
        self, status: RunStatus, error: str | None = None, counts: dict[str, int] | None = None
    ) -> None:
        """meta.json as the run stands: built as a RunMeta (contract/runmeta.py), so a field
        it does not name, or a value of the wrong type, fails here rather than in a reader."""
        lag: dict[str, float | None] = {"p99": None, "max": None}
        samples = None
        if counts and schema.SAMPLES in counts:
            samples = read_table(self.run_dir, schema.SAMPLES).frame
            lag = summary.sim_lag_ms(samples, read_table(self.run_dir, schema.FAULTS).frame)
        phases, capacity = self._shape_facts()
        gen = self.loadgen
        meta = RunMeta(
            status=status,
            error=error,
            plan=json.loads(self.plan.model_dump_json()),
            target=self.target_meta or {"kind": self.profile.kind},
            target_profile=run_profile.snapshot(self.profile),
            harness_version=summary.harness_version(),
            versions=summary.versions(),
            hosts=[summary.host_info(), *self._worker_hosts()],
            gpus=self.gpus,
            t_start=self.clock.t_start,
            t_end=self.clock.t_end,
            seed=self.plan.seed,
            cpu_warning=gen.cpu_warning() if gen else False,
            cpu_warnings=gen.cpu.warnings if gen else [],
            sim_lag_ms_p99=lag["p99"],
            sim_lag_ms_max=lag["max"],
            sim_lag_bound_ms=self.plan.samplers.sim_lag_bound_ms,
            foreign_cpu_bound_share=self.plan.samplers.foreign_cpu_bound_share,
            foreign_cpu_window_bound_share=self.plan.samplers.foreign_cpu_window_bound_share,
            windows=self._windows(),
            phases=phases,
            capacity=capacity,
            aborted=self.aborted,
            **({"until": self.until.record()} if self.until else {}),
            load_generator={
                "mode": "distributed" if self.layout.distributed else "local",
                "processes": self.layout.processes,
                # why the load stopped before its planned end (load.stop_if_failing, an
                # abort, load.until: decided), if it did
                "stopped_early": gen.stopped_early if gen else None,
                "loop_lag_ms": gen.loop_lag.summary() if gen else None,
                "loop_lag_bound_ms": self.plan.samplers.loop_lag_bound_ms,
            },
            records={
                "written": self.sink.total,
                "duplicates_dropped": self.sink.duplicates,
                "by_worker": dict(self.sink.by_worker),
                "by_class": dict(self.sink.by_class),
                "outcomes": dict(self.sink.outcomes),
                "relay": gen.collector.summary() if gen and gen.collector else None,
            },
            tables=counts,
        )
        self._note_block_size(meta)
        self._note_replay(meta, samples, bool(counts and schema.REQUESTS in counts))
        rundir.write_meta(self.run_dir, meta)

    def _note_replay(self, meta: RunMeta, samples: Any, written: bool) -> None:
        """meta.json's `replay` for a plan with a trace; with its schedule error, once the
        requests table is written."""
        if self.plan.traffic.trace is None:
            return
        requests = read_table(self.run_dir, schema.REQUESTS).frame if written else None
        c = self.clock
        stress = (c.load_start, c.load_end) if c.load_start and c.load_end else None
        meta.replay = replay.replay_meta(self.plan, requests, samples, stress, self.blocks)

    def _note_block_size(self, meta: RunMeta) -> None:
        """meta.json's `prompt_block_tokens` once a record carries blocks: kvgate's own
        classes cut prompts in blocks of BLOCK_TOKENS, or of a replayed trace's own size,
        which every class of the run then uses."""
        if meta.prompt_block_tokens is None and self.sink.with_blocks:
            meta.prompt_block_tokens = run_block_tokens(self.plan)
