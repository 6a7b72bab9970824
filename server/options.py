"""Command-line options shared by `server.replica` and `server.serve`, and what they build:
the scheduler config, the GPU, the model and the tokenizer a replica runs with."""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

import contract
from server.engine.gpus import GPUS
from server.httputil import BODY_TIMEOUT_S, IDLE_TIMEOUT_S, HttpLimits
from server.scheduler import PROFILES, SchedulerConfig
from server.tenants import DEFAULT_TENANTS_PATH
from server.tokenizer import DEFAULT_TOKENIZER_PATH


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Flags every replica takes; `serve` passes them through to its replicas."""
    parser.add_argument(
        "--policy",
        choices=contract.POLICIES,
        default=contract.DEFAULT_POLICY,
        help="scheduler policy",
    )
    parser.add_argument("--config", type=Path, help="scheduler.yaml (default: seed defaults)")
    parser.add_argument(
        "--gpu", choices=sorted(GPUS), default=contract.DEFAULT_GPU, help="virtual GPU"
    )
    parser.add_argument(
        "--model", choices=sorted(PROFILES), help="model profile (default: the config's model)"
    )
    parser.add_argument(
        "--tenants", type=Path, default=DEFAULT_TENANTS_PATH, help="tenants YAML (keys, quotas)"
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=DEFAULT_TOKENIZER_PATH, help="a tokenizer.json"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated step's duration: 0.1 makes the virtual GPU 10x faster",
    )
    parser.add_argument(
        "--kv-actual-factor",
        type=float,
        default=1.0,
        help="actual KV bytes per token as a multiple of the scheduler's estimate "
        "(profile x overhead_factor x safety_factor); >1 models estimation bias",
    )
    parser.add_argument(
        "--mutant",
        choices=tuple(contract.MUTANTS),
        help="carry one named bug, to prove the release gates catch it (off by default; "
        "see contract.MUTANTS)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--state-dir", type=Path, help="event logs and ready files go here")
    parser.add_argument("--ready-file", type=Path, help="JSON written once listening")


def add_http_args(parser: argparse.ArgumentParser, max_client_connections: int) -> None:
    """Connection limits of the listening site (see `server.httputil.HttpLimits`)."""
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT_S,
        help="seconds before an idle connection, or one that has not sent a whole request "
        "head, is closed",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=BODY_TIMEOUT_S,
        help="seconds a request body may take to arrive (else 408)",
    )
    parser.add_argument(
        "--max-client-connections",
        type=int,
        default=max_client_connections,
        help="open connections per client address (0: no cap); one more is answered 429",
    )


def http_limits(args: argparse.Namespace) -> HttpLimits:
    return HttpLimits(args.idle_timeout, args.body_timeout, args.max_client_connections)


def check_http_args(args: argparse.Namespace) -> str | None:
    for flag, value in (
        ("--idle-timeout", args.idle_timeout),
        ("--body-timeout", args.body_timeout),
    ):
        if not 0 < value <= 3600:
            return f"{flag} must be in (0, 3600] seconds (got {value})"
    if args.max_client_connections < 0:
        cap = args.max_client_connections
        return f"--max-client-connections must be 0 (no cap) or more (got {cap})"
    return None


ENGINE_FLAGS = (
    ("policy", "--policy"),
    ("config", "--config"),
    ("gpu", "--gpu"),
    ("model", "--model"),
    ("tenants", "--tenants"),
    ("tokenizer", "--tokenizer"),
    ("time_scale", "--time-scale"),
    ("kv_actual_factor", "--kv-actual-factor"),
    ("mutant", "--mutant"),
    ("host", "--host"),
)


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags of `args` as a replica command line."""
    out: list[str] = []
    for attr, flag in ENGINE_FLAGS:
        value = getattr(args, attr)
        if value is not None:
            out += [flag, str(value)]
    return out


def check_engine_args(args: argparse.Namespace) -> str | None:
    """A message for the first bad value, or None."""
    if not 0 < args.time_scale <= 1000:
        return f"--time-scale must be in (0, 1000] (got {args.time_scale})"
    if not 0.1 <= args.kv_actual_factor <= 10:
        return f"--kv-actual-factor must be in [0.1, 10] (got {args.kv_actual_factor})"
    for attr in ("config", "tenants", "tokenizer"):
        path = getattr(args, attr)
        if path is not None and not Path(path).is_file():
            return f"--{attr} {path}: no such file"
    return None


def runtime_version() -> str:
    try:
        return f"kvgate-sim/{metadata.version('kvgate')}"
    except metadata.PackageNotFoundError:
        return "kvgate-sim/unknown"


def target_info(args: argparse.Namespace, config: SchedulerConfig) -> dict[str, object]:
    """What a harness records about the target (GET /info on gateway and replicas)."""
    return {
        "kind": "kvgate-reference",
        "engine": "sim",
        "policy": args.policy,
        "model": config.model,
        "model_digest": config.model_digest,
        "runtime_version": runtime_version(),
        "gpu_sku": args.gpu,
        "scheduler_config_digest": config.digest(),
        "config": config.model_dump(mode="json"),
        "time_scale": args.time_scale,
        "kv_actual_factor": args.kv_actual_factor,
        "mutant": args.mutant,
    }


def load_config(args: argparse.Namespace) -> SchedulerConfig:
    """The scheduler config from --config (or seed defaults), with --model applied."""
    config = SchedulerConfig.from_yaml(args.config) if args.config else SchedulerConfig()
    if args.model and args.model != config.model:
        config = SchedulerConfig(**{**config.model_dump(), "model": args.model})
    return config
