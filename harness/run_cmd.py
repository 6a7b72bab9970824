"""`kvgate run PLAN`: run a plan, then gate it and write the reports; exit with the verdict.

Exit codes: 0 pass (or a completed run when no gates package is present), 1 internal error,
2 bad plan or usage, 3 fail, 4 marginal, 5 invalid, 130 interrupted.

Workers on other hosts: start the master with `kvgate run PLAN --master-bind 0.0.0.0:5557
--expect-workers N`, then on each worker host `kvgate run PLAN --worker --master HOST:5557`
(same plan file and --set flags; the master tells workers where the target is).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from harness.plan import Plan, PlanError, load_plan

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
WORKER_SLACK_S = 600.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvgate run",
        description="Run a load/chaos plan against a target, then gate it and write reports.",
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
    )
    p.add_argument("plan", help="plan YAML (see harness/plans/)")
    p.add_argument("--out", help="run directory to write (default: OUTPUT_DIR/NAME-TIMESTAMP)")
    p.add_argument("--target-url", help="run against this already-running server instead")
    p.add_argument("--processes", type=int, default=0, help="local Locust worker processes")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a plan field by its dotted path, e.g. --set target.policy=naive",
    )
    p.add_argument("--master-bind", help="HOST:PORT the Locust master listens on for workers")
    p.add_argument("--expect-workers", type=int, default=0, help="remote workers to wait for")
    p.add_argument("--worker", action="store_true", help="run as a Locust worker only")
    p.add_argument("--master", help="HOST:PORT of the master (with --worker)")
    p.add_argument("--no-gates", action="store_true", help="skip the gates and reports")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 2) a load too short to give every key gate the samples a PASS "
        "needs (`kvgate plan check PLAN` shows them)",
    )
    p.add_argument(
        "--web",
        nargs="?",
        const="127.0.0.1:8089",
        metavar="HOST:PORT",
        help="serve Locust's web UI and the live kvgate page at /kvgate (default "
        "127.0.0.1:8089; beyond loopback it needs a token: $KVGATE_WEB_TOKEN, or one is made)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _run_dir(plan: Plan, out: str | None) -> Path:
    if out:
        run_dir = Path(out)
        if (run_dir / "meta.json").exists():
            raise PlanError(f"--out {run_dir} already holds a run; choose a new directory")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        run_dir = Path(plan.output_dir) / f"{plan.name}-{stamp}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(
            f"cannot create the run directory {run_dir} ({exc.strerror or exc}); "
            "choose another with --out or the plan's output_dir"
        ) from None
    return run_dir


def _save_plan(plan: Plan, run_dir: Path) -> Path:
    """The resolved plan (overrides applied) that local workers read."""
    data = json.loads(plan.model_dump_json())
    data["base_dir"] = plan.base_dir
    path = run_dir / "plan.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def _judge(run_dir: Path, plan: Plan) -> int:
    """Gates and reports over the finished run; the verdict's exit code. A run that could not
    be judged never exits 0: CI must not read "not judged" as "passed"."""
    from gates.rundir import RunDirError
    from gates.spec import GateSpecError

    try:
        from gates import evaluate_run
        from gates.cli import format_verdict
        from reports import write_reports

        verdict = evaluate_run(run_dir, gates_file=plan.resolve(plan.gates))
        print(f"kvgate: verdict {verdict.status} ({run_dir / 'verdict.json'})")
        # Each gate's value with its interval and n: how sure the verdict is, at a glance.
        print(format_verdict(verdict, header=False))
        for name, path in write_reports(run_dir).items():
            print(f"kvgate: {name}: {path}")
    except GateSpecError as exc:
        print(f"kvgate run: {exc}; the run is kept in {run_dir}", file=sys.stderr)
        return EXIT_USAGE
    except (RunDirError, OSError) as exc:
        print(
            f"kvgate run: could not judge {run_dir}: {exc}; fix it and run `kvgate gate {run_dir}`",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return int(verdict.exit_code)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    level = logging.INFO if args.verbose or args.worker else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        plan = load_plan(args.plan, args.overrides, target_url=args.target_url)
    except PlanError as exc:
        print(f"kvgate run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.master_bind and args.expect_workers < 1:
        print(
            "kvgate run --master-bind: say how many workers to wait for with --expect-workers N",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import locust  # noqa: F401  (gevent monkey-patching before anything opens a socket)

    if args.worker:
        if not args.master:
            print("kvgate run --worker: give --master HOST:PORT", file=sys.stderr)
            return EXIT_USAGE
        from harness.distributed import run_worker

        return run_worker(plan, args.master, plan.planned_seconds() + WORKER_SLACK_S)
    return _run(plan, args)


def _sigterm_interrupts() -> None:
    """SIGTERM tears the run down like Ctrl-C (gevent runs the callback in its own greenlet,
    so the interrupt is thrown into the main greenlet, where the orchestrator catches it)."""
    import gevent

    def interrupt() -> None:
        main = gevent.get_hub().parent
        assert main is not None, "the hub runs under the main greenlet"
        main.throw(KeyboardInterrupt("SIGTERM"))

    gevent.signal_handler(signal.SIGTERM, interrupt)


def _run(plan: Plan, args: argparse.Namespace) -> int:
    from rich.console import Console

    from gates.spec import GateSpecError, load_gate_file
    from harness.live.web import WebError, parse_bind
    from harness.loadgen import Distribution
    from harness.orchestrator import Orchestrator
    from harness.preflight import PreflightError, check_external
    from harness.sampleplan import announce
    from harness.traffic import TrafficError, build_shape, build_user_classes

    console = Console(stderr=True)

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)

    try:
        # the plan's files, traffic and gates must be sound before anything is started
        plan.check_files()
        classes = build_user_classes(plan, "http://127.0.0.1")
        build_shape(plan)
        if not args.no_gates:
            gate_file = load_gate_file(plan.resolve(plan.gates))
            # what each key gate needs, against what the load will give it
            announce(plan, gate_file, classes, args.strict, say)
        # an external target answers and serves the model
        plan = check_external(plan, lambda text: console.print(text, highlight=False))
        web = parse_bind(args.web, os.environ.get("KVGATE_WEB_TOKEN")) if args.web else None
        run_dir = _run_dir(plan, args.out)
    except (PlanError, TrafficError, GateSpecError, PreflightError, WebError) as exc:
        print(f"kvgate run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    layout = Distribution(
        processes=max(0, args.processes),
        master_bind=args.master_bind,
        expect_workers=args.expect_workers,
        plan_file=_save_plan(plan, run_dir),
        log_dir=run_dir,
    )
    console.print(f"kvgate: run directory {run_dir}", highlight=False)
    _sigterm_interrupts()
    result = Orchestrator(plan, run_dir, layout, console, web).run()
    if result.status == "interrupted":
        console.print(f"kvgate: interrupted; partial run in {run_dir}", highlight=False)
        return EXIT_INTERRUPTED
    if result.status != "completed":
        console.print(f"kvgate: run failed: {result.error} (see {run_dir})", highlight=False)
        return EXIT_INTERNAL
    console.print(f"kvgate: run complete: {run_dir}", highlight=False)
    replayed = replay_line(run_dir)
    if replayed:
        console.print(f"kvgate: {replayed}", highlight=False)
    if args.no_gates:
        return EXIT_OK
    return _judge(run_dir, plan)


def replay_line(run_dir: Path) -> str | None:
    """One line on a replayed trace, from meta.json's `replay` (None without one)."""
    from reports.replayed import replay_sentence

    return replay_sentence(json.loads((run_dir / "meta.json").read_text()))


if __name__ == "__main__":
    raise SystemExit(main())
