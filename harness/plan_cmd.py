"""`kvgate plan check PLAN`: how many samples each gate needs, and whether the plan's load
will give them, before any load is sent.

Exit codes: 0 every key gate is expected to reach the samples a PASS needs; 4 a key gate
is expected to fall short (a healthy run would read INVALID); 5 no estimate for a key gate
(it counts what only the server decides: measure it with --from); 2 bad plan or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.plan import PlanError, load_plan

EXIT_USAGE = 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvgate plan",
        description="Check a plan's sample sizes before running it.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="check")
    check = sub.add_parser(
        "check",
        help="each key and blocking gate: samples needed, expected, time needed",
        description="Each key and blocking gate of the plan's gate file: the samples a PASS "
        "needs on a healthy system, those the load is expected to give, and the time it takes.",
    )
    check.add_argument("plan", help="plan YAML (see harness/plans/)")
    check.add_argument(
        "--from",
        dest="run_dir",
        metavar="RUN_DIR",
        help="a previous run: its gates' measured counts replace the assumed latencies",
    )
    check.add_argument("--gates", metavar="FILE", help="gate file (default: the plan's)")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a plan field, as `kvgate run --set` does",
    )
    check.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from gates.spec import GateSpecError, load_gate_file
    from harness.sampleplan import CalibrationError, measure, sample_plan, table
    from harness.traffic import TrafficError

    try:
        plan = load_plan(args.plan, args.overrides)
        gates_path = Path(args.gates) if args.gates else plan.resolve(plan.gates)
        gate_file = load_gate_file(gates_path)
        measured = None
        if args.run_dir:
            measured = measure(Path(args.run_dir), gate_file)
        result = sample_plan(plan, gate_file, measured)
    except (PlanError, GateSpecError, TrafficError, CalibrationError) as exc:
        print(f"kvgate plan check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(table(result))
    return result.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
