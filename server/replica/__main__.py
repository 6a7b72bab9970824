"""`python -m server.replica`: one replica process (standalone, or started by `serve`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence

from contract import EventKind
from server import eventloop
from server.httputil import start_site, write_json_atomic
from server.options import (
    add_engine_args,
    add_http_args,
    check_engine_args,
    check_http_args,
    http_limits,
)
from server.replica.app import build_app
from server.replica.collector import StepCollector
from server.replica.runtime import PARENT_PID_ENV, ReplicaRuntime
from server.scheduler import ConfigError

PARENT_POLL_S = 0.5
STANDALONE_MAX_CLIENT_CONNECTIONS = 1024


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m server.replica", description=__doc__)
    parser.add_argument("--replica-id", default="r0", help="name used in events and headers")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    add_engine_args(parser)
    add_http_args(parser, STANDALONE_MAX_CLIENT_CONNECTIONS)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    try:
        rt = ReplicaRuntime(args)
    except (ConfigError, ValueError, KeyError) as exc:
        sys.stderr.write(f"kvgate replica: {exc}\n")
        return 2
    limits = http_limits(args)
    if rt.internal_token:
        # Behind a gateway every connection comes from the gateway: no per-client cap.
        limits = dataclasses.replace(limits, max_client_connections=0)
    runner, port = await start_site(build_app(rt), args.host, args.port, limits)
    rt.loop.collector = StepCollector.take_over()
    rt.loop.start()
    rt.events.append_lifecycle(EventKind.REPLICA_STARTED)
    url = f"http://{args.host}:{port}"
    mode = "behind its gateway" if rt.internal_token else "standalone (takes API keys)"
    print(
        f"kvgate: replica {rt.replica_id} listening on {url} pid={os.getpid()}, {mode}", flush=True
    )
    if args.ready_file:
        write_json_atomic(
            args.ready_file, {"id": rt.replica_id, "pid": os.getpid(), "port": port, "url": url}
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    orphan_watch = loop.create_task(_exit_with_parent(stop))
    await stop.wait()
    orphan_watch.cancel()
    await rt.loop.stop()
    await runner.cleanup()
    rt.events.close()
    return 0


async def _exit_with_parent(stop: asyncio.Event) -> None:
    """Started by serve: stop when serve is gone (even SIGKILLed), never linger orphaned."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    while os.getppid() == int(parent):
        await asyncio.sleep(PARENT_POLL_S)
    sys.stderr.write("kvgate replica: serve is gone; stopping\n")
    stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check_engine_args(args) or check_http_args(args)
    if problem:
        sys.stderr.write(f"kvgate replica: {problem}\n")
        return 2
    return eventloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
