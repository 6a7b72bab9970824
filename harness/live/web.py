"""`kvgate run PLAN --web [HOST:PORT]`: Locust's own web UI, plus a kvgate page at /kvgate.

The run serves Locust's UI (its charts and tables, what load-testing users know) and adds,
through its Flask app, a blueprint with
- `/kvgate`: live charts of pool usage per replica against the watermarks, GPU memory, TTFT
  p95 by class against the 900 ms line, refusals by reason, faults as markers, and a table
  of every gate's running value and its decision so far (PASS, FAIL or UNDECIDED by its
  anytime-valid bound, which a page refreshed every few seconds may look at as often as
  it likes; gates/sequential.py);
- `/kvgate/state.json`: `{"elapsed_s", "gates": [{"id", "value_text", "status",
  "decision", "bound_text", "key", "n", "needs_n", "settled", ...}],
  "until": {"text", "gates": [{"id", "decision", "settled", "n", "needs_n", ...}]} or
  null, "samples": {...}, "faults": [...], "fault_kinds": [...], "stopping"}`; `until`
  is, for a load that runs until its gates are decided (`load.until: decided`,
  harness/live/until.py), where the stop rule stands and each held gate's way to a
  decision (n so far, about how many it needs);
- `POST /kvgate/stop`: a graceful stop; the run is still judged and reported;
- `POST /kvgate/fault` (`{"kind": K}`): the plan's first fault of kind K, now, journaled.
The gates' values come from the running evaluation (watch.py), refreshed every
10 s. Bound beyond loopback, every route (Locust's too) needs the token, given as `?token=`
or the `X-Kvgate-Token` header.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from flask import Blueprint, Response, jsonify, request

from contract import servers
from gates import schema
from harness.jsonl import JsonlTail
from harness.sink import RecordSink

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HISTORY = 600  # points kept per series (20 min at one point per 2 s)
POINT_EVERY_S = 2.0
POOL_GAUGES = servers.metric_names("kv_usage")  # each server profile's KV-usage gauge
GPU_GAUGES = ("kvgate_sim_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED")
PAGE = Path(__file__).with_name("web.html")


class WebError(ValueError):
    """The --web address cannot be served; the message says why."""


def parse_bind(bind: str, token: str | None) -> tuple[str, int, str | None]:
    """(host, port, token) for `--web HOST:PORT`; beyond loopback a token is required (one
    is made up and printed when none is given)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise WebError(f"--web {bind!r}: give HOST:PORT, e.g. 127.0.0.1:8089")
    host = host.strip("[]") or "127.0.0.1"
    if host not in LOOPBACK and not token:
        token = secrets.token_urlsafe(16)
    return host, int(port), token


class Series:
    """Bounded (t, value) history per name."""

    def __init__(self) -> None:
        self.points: dict[str, deque[tuple[float, float]]] = {}

    def add(self, name: str, t: float, value: float) -> None:
        self.points.setdefault(name, deque(maxlen=HISTORY)).append((round(t, 1), value))

    def as_json(self) -> dict[str, list[tuple[float, float]]]:
        return {name: list(points) for name, points in self.points.items()}


class LiveState:
    """What the page shows, gathered from the record sink, the growing tables and the
    running evaluation."""

    def __init__(self, run_dir: Path, sink: RecordSink, watermarks: dict[str, float]) -> None:
        self.sink = sink
        self.watermarks = watermarks
        self.samples = JsonlTail(run_dir / f"{schema.SAMPLES}.jsonl")
        self.faults = JsonlTail(run_dir / f"{schema.FAULTS}.jsonl")
        self.t0 = time.time()
        self.series: dict[str, Series] = {
            k: Series() for k in ("pool", "gpu_memory", "ttft_p95", "refusals")
        }
        self.fault_marks: list[tuple[float, str]] = []
        self.gates: list[dict[str, Any]] = []
        self.until: dict[str, Any] | None = None  # load.until: decided only
        self.fault_kinds: list[str] = []
        self.stopping: str | None = None
        self._last_point = 0.0

    def refresh(self) -> None:
        now = time.time()
        if now - self._last_point < POINT_EVERY_S:
            return
        self._last_point = now
        at = now - self.t0
        for klass, p95 in self.sink.ttft_p95_by_class().items():
            self.series["ttft_p95"].add(klass, at, p95)
        for reason, n in self.sink.refusals.items():
            self.series["refusals"].add(reason, at, float(n))
        memory: dict[tuple[str, float], float] = {}  # (target, t) -> MiB, categories summed
        for row in self.samples.poll():
            metric, t = row.get("metric"), float(row.get("t") or now) - self.t0
            if metric in POOL_GAUGES:
                self.series["pool"].add(str(row.get("target")), t, float(row["value"]))
            elif metric in GPU_GAUGES:
                scale = 1 << 20 if str(metric).endswith("_bytes") else 1
                key = (str(row.get("target")), round(t, 1))
                memory[key] = memory.get(key, 0.0) + float(row["value"]) / scale
        for (target, t), mib in sorted(memory.items(), key=lambda item: item[0][1]):
            self.series["gpu_memory"].add(target, t, mib)
        for row in self.faults.poll():
            t = float(row.get("t_start") or now) - self.t0
            self.fault_marks.append((round(t, 1), f"{row.get('kind')} {row.get('target')}"))

    def as_json(self) -> dict[str, Any]:
        self.refresh()
        return {
            "elapsed_s": round(time.time() - self.t0, 1),
            "gates": self.gates,
            "until": self.until,
            "samples": {name: s.as_json() for name, s in self.series.items()},
            "watermarks": self.watermarks,
            "ttft_line_s": 0.9,
            "faults": self.fault_marks,
            "fault_kinds": self.fault_kinds,
            "stopping": self.stopping,
        }


def blueprint(
    state: LiveState,
    stop: Callable[[], None],
    inject: Callable[[str], str],
    token: str | None,
) -> Blueprint:
    bp = Blueprint("kvgate", __name__, url_prefix="/kvgate")

    @bp.route("")
    @bp.route("/")
    def page() -> Response:
        return Response(PAGE.read_text(encoding="utf-8"), mimetype="text/html")

    @bp.route("/state.json")
    def state_json() -> Response:
        return jsonify(state.as_json())

    @bp.route("/stop", methods=["POST"])
    def stop_route() -> Response:
        state.stopping = state.stopping or "stopped from the web page"
        stop()
        return jsonify({"ok": True, "stopping": state.stopping})

    @bp.route("/fault", methods=["POST"])
    def fault_route() -> tuple[Response, int]:
        body = request.get_json(silent=True) or {}
        kind = str(body.get("kind") or request.form.get("kind") or "")
        try:
            return jsonify({"ok": True, "message": inject(kind)}), 200
        except ValueError as exc:
            return jsonify({"ok": False, "error": str(exc)}), 400

    return bp


def require_token(token: str) -> Callable[[], Response | None]:
    """A before_request hook: every route needs the token (query or header)."""

    def check() -> Response | None:
        given = request.args.get("token") or request.headers.get("X-Kvgate-Token") or ""
        if hmac.compare_digest(given, token):
            return None
        return Response(
            json.dumps({"error": "this kvgate run needs its token: ?token=... or X-Kvgate-Token"}),
            status=401,
            mimetype="application/json",
        )

    return check


def start_web_ui(
    env: Any,
    state: LiveState,
    stop: Callable[[], None],
    inject: Callable[[str], str],
    web: tuple[str, int, str | None],
) -> tuple[Any, str]:
    """Locust's web UI for the Locust environment `env` on `web` (host, port, token), with
    the kvgate page added: the UI object and the page's address, token included."""
    host, port, token = web
    # Locust's UI re-parses sys.argv with its own parser when it renders its page; ours
    # (kvgate run PLAN --web ...) would read as ambiguous Locust options, so it sees none.
    sys.argv = sys.argv[:1]
    web_ui = env.create_web_ui(host=host, port=port)
    if token:
        web_ui.app.before_request(require_token(token))
    web_ui.app.register_blueprint(blueprint(state, stop, inject, token))
    gevent.sleep(0.2)  # Locust binds its server in a greenlet: let it, to learn the port
    bound = getattr(getattr(web_ui, "server", None), "server_port", port)
    shown = f"http://{host}:{bound}/kvgate"
    shown += f"?token={token}" if token else ""
    return web_ui, shown
