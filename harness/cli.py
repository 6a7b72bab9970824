"""The `kvgate` command: one entry point that hands each subcommand to the stage that owns it.

The system under test (`server`) is only ever started as its own process, so `serve` and
the scheduler's benchmark replace this process with `python -m ...` instead of importing it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

USAGE = """usage: kvgate COMMAND [ARGS...]

commands:
  serve                 start the reference deployment (gateway + replicas)
  run PLAN              run a load/chaos plan, then gate it and write the reports
  plan check PLAN [--from RUN_DIR] [--json]
                        samples each gate needs, and whether the plan's load gives them
  gate RUN_DIR          evaluate the release gates over a run directory
  report RUN_DIR        write report.html, summary.md and report.json for a run
  compare CAND BASE     rollback decision: candidate run against a baseline run
  capacity RUN [RUN...] capacity runs side by side: goodput and latency against load
  export RUN_DIR --format mooncake|llmd [--out FILE]
                        the run's requests as a Mooncake trace to replay, or its performance
                        as an llm-d Benchmark Report
  qualify PLAN [--runs N] [--mutants all|a,b] [--set K=V] [--json]
                        prove each gate catches its mutants; false alarms over N runs
  bench scheduler|server|client|analysis|proxy|replay [--json]
                        benchmarks of each stage (`bench server --hostile`: hostile input)
  bench verdicts PLAN --runs N [--set K=V] [--json]
                        run a plan N times: the distribution of its verdicts

`kvgate COMMAND --help` describes each command."""

# Subcommands that run in this process: "module:function", called with the remaining argv.
IN_PROCESS = {
    "run": "harness.run_cmd:main",
    "plan": "harness.plan_cmd:main",
    "gate": "gates.cli:main",
    "report": "reports.cli:main",
    "compare": "reports.compare_cmd:main",
    "capacity": "reports.capacity_cmd:main",
    "export": "reports.export.cli:main",
    "qualify": "harness.qualify.cli:main",
}
# Subcommands that become their own process (the server side never shares a process with us).
AS_PROCESS = {
    "serve": "server.serve",
}
# The benchmarks (harness/bench/), and the scheduler's, which imports the server's code.
BENCHES_IN_PROCESS = {
    "server": "harness.bench.server:main",
    "client": "harness.bench.client:main",
    "analysis": "harness.bench.analysis:main",
    "proxy": "harness.bench.proxy:main",
    "verdicts": "harness.bench.verdicts:main",
    "replay": "harness.bench.replay:main",
}
BENCHES_AS_PROCESS = {
    "scheduler": "server.scheduler.bench",
}

EXIT_USAGE = 2


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    func: Callable[[Sequence[str]], int] = getattr(module, func_name)
    return func


def _exec_module(module: str, args: Sequence[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else EXIT_USAGE
    command, rest = args[0], args[1:]
    if command == "bench":
        if not rest or rest[0] not in {**BENCHES_IN_PROCESS, **BENCHES_AS_PROCESS}:
            names = ", ".join(sorted({**BENCHES_IN_PROCESS, **BENCHES_AS_PROCESS}))
            print(f"kvgate bench: name a benchmark: {names}", file=sys.stderr)
            return EXIT_USAGE
        name, rest = rest[0], rest[1:]
        if name in BENCHES_AS_PROCESS:
            return _exec_module(BENCHES_AS_PROCESS[name], rest)
        return _load(BENCHES_IN_PROCESS[name])(rest)
    if command in AS_PROCESS:
        return _exec_module(AS_PROCESS[command], rest)
    if command in IN_PROCESS:
        return _load(IN_PROCESS[command])(rest)
    print(f"kvgate: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
