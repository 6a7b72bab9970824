"""`kvgate serve` (= `python -m server.serve`): the reference deployment. This process is the
gateway and supervises N replica processes; SIGINT/SIGTERM stops all of them."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from server.gateway.app import Gateway, build_app, build_metrics_app
from server.gateway.supervisor import ReplicaStartError
from server.httputil import HttpLimits, start_site, write_json_atomic
from server.options import (
    add_engine_args,
    add_http_args,
    check_engine_args,
    check_http_args,
    http_limits,
)
from server.scheduler import ConfigError

GATEWAY_MAX_CLIENT_CONNECTIONS = 1024


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate serve", description=__doc__)
    parser.add_argument("--replicas", type=int, default=2, help="replica processes (1..16)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port; 0 picks one")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="also serve /metrics without a key on --metrics-host:PORT (0 picks one), for a "
        "Prometheus scraper; off unless given",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of the keyless /metrics bind"
    )
    add_engine_args(parser)
    add_http_args(parser, GATEWAY_MAX_CLIENT_CONNECTIONS)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="kvgate-serve-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        gw = Gateway(args, state_dir, secrets.token_hex(16))
    except (ConfigError, ValueError, KeyError) as exc:
        sys.stderr.write(f"kvgate serve: {exc}\n")
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner, port = await start_site(build_app(gw), args.host, args.port, http_limits(args))
    url = f"http://{args.host}:{port}"
    print(f"kvgate: gateway listening on {url}", flush=True)
    metrics_runner = None
    metrics_url = None
    if args.metrics_port is not None:
        metrics_runner, mport = await start_site(
            build_metrics_app(gw), args.metrics_host, args.metrics_port, HttpLimits()
        )
        metrics_url = f"http://{args.metrics_host}:{mport}/metrics"
        print(f"kvgate: keyless metrics on {metrics_url}", flush=True)
    try:
        starting = loop.create_task(gw.start())
        stopped = loop.create_task(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            return 0
        starting.result()
        _announce(gw, url, args.ready_file, state_dir, metrics_url)
        await stop.wait()
        return 0
    except ReplicaStartError as exc:
        sys.stderr.write(f"kvgate serve: {exc}\n")
        return 1
    finally:
        await gw.stop()
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()


def _announce(
    gw: Gateway, url: str, ready_file: Path | None, state_dir: Path, metrics_url: str | None
) -> None:
    replicas = [r.public() for r in gw.supervisor.replicas.values()]
    for r in replicas:
        print(f"kvgate: replica {r['id']} pid={r['pid']} port={r['port']}", flush=True)
    print(f"kvgate: state dir {state_dir}", flush=True)
    if ready_file:
        write_json_atomic(
            ready_file,
            {
                "gateway_url": url,
                "pid": os.getpid(),
                "state_dir": str(state_dir),
                "metrics_url": metrics_url,
                "replicas": [
                    {"id": r["id"], "pid": r["pid"], "port": r["port"], "url": r["url"]}
                    for r in replicas
                ],
            },
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check_engine_args(args) or check_http_args(args)
    if problem is None and not 1 <= args.replicas <= 16:
        problem = f"--replicas must be between 1 and 16 (got {args.replicas})"
    if problem:
        sys.stderr.write(f"kvgate serve: {problem}\n")
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
