"""What every `kvgate bench NAME` shares: its command line and the processes it measures.

A benchmark is a `Bench`: its options, what it measures (one JSON-able object) and how a
person reads that object. `run` treats them all alike: bad usage exits 2 with the usage and
the reason, `--help` exits 0, `--json` prints the object as one JSON line (the last of
stdout), a table is printed otherwise, and a measurement that could not be made exits 1
with the reason. `start_process` and `stop_process` start and stop what a benchmark
measures, each in its own process, as kvgate starts any target. Standard library only: a
benchmark's own child processes import their module, and so this one, before they measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_USAGE = 1, 2
REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0  # a server is ready in a second or two; a busy machine takes longer
READY_POLL_S = 0.05
STOP_GRACE_S = 10.0
LOG_TAIL_CHARS = 1500


class BenchUsageError(Exception):
    """Options that make no measurement possible; the message says which and what to give."""


class BenchError(RuntimeError):
    """The measurement could not be made (a process did not start, a run failed)."""


def show_fields(result: dict[str, Any], width: int = 0) -> None:
    """The default table: one `key: value` line per top-level key, right-aligned to `width`."""
    for key, value in result.items():
        print(f"{key:>{width}}: {value}")


@dataclass(frozen=True, slots=True)
class Bench:
    """One benchmark as `kvgate bench ...` runs it. `measure` may raise BenchUsageError
    (before it measures anything) or BenchError; `show` prints the result for a person."""

    prog: str  # "kvgate bench server --release"
    description: str  # what --help says above the options: the module's docstring
    options: Callable[[argparse.ArgumentParser], None]
    measure: Callable[[argparse.Namespace], dict[str, Any]]
    show: Callable[[dict[str, Any]], None] = show_fields
    json_help: str = "print one JSON object"


def run(bench: Bench, argv: Sequence[str] | None) -> int:
    """Parse `argv` (sys.argv's when None), measure, print; the exit code."""
    parser = argparse.ArgumentParser(prog=bench.prog, description=bench.description)
    parser.add_argument("--json", action="store_true", help=bench.json_help)
    bench.options(parser)
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or bad usage that argparse has already explained
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        result = bench.measure(args)
    except BenchUsageError as exc:  # told as argparse tells its own usage errors
        parser.print_usage(sys.stderr)
        print(f"{bench.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BenchError as exc:
        print(f"{bench.prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(result))
    else:
        bench.show(result)
    return 0


def progress(line: str) -> None:
    """One line of progress, shown at once (a benchmark of many runs takes minutes each)."""
    print(line, flush=True)


def start_process(
    module: str,
    args: Sequence[str],
    ready: Path,
    log: Path,
    timeout_s: float = READY_TIMEOUT_S,
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """`python -m MODULE ARGS --ready-file READY`, its output in `log`; once READY is written
    (atomically, by the process), the process and what READY says. BenchError, with the end
    of the log, when the process exits first or is not ready within `timeout_s`."""
    argv = [sys.executable, "-m", module, *args, "--ready-file", str(ready)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise BenchError(f"{module} did not start; the end of its output:\n{tail}")
        time.sleep(READY_POLL_S)
    info: dict[str, Any] = json.loads(ready.read_text())
    return proc, info


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace_s`; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
