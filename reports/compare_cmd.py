"""`kvgate compare CANDIDATE_RUN BASELINE_RUN [--out DIR] [--gates FILE] [--current-profiles]`:
the rollback decision, each run judged by the server profile its meta.json keeps (or by
today's profile files with --current-profiles).

Each run passes the evidence checks before it is judged. Writes rollback.md and
rollback.json (into the candidate run, or --out); exits 0 promote, 4 hold, 3 rollback, 2
usage (bad arguments, run directories or gate file, a run the evidence checks refuse, or
an output that cannot be written).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gates import schema
from gates.evidence import EvidenceRefused, check_evidence
from gates.rundir import RunDirError, load_run, unwritable
from gates.spec import GateSpecError, load_gate_file
from gates.verdict import EXIT_USAGE
from reports.charts import env
from reports.cli import Parser, parse
from reports.compare import Comparison
from reports.decide import compare_runs


def write_rollback(comparison: Comparison, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / schema.ROLLBACK_MD, "json": out / schema.ROLLBACK_JSON}
    paths["json"].write_text(json.dumps(comparison.to_dict(), indent=1) + "\n")
    paths["markdown"].write_text(env().get_template("rollback.md.j2").render(c=comparison))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="kvgate compare",
        description="Rollback decision: a candidate run against a baseline run.",
    )
    parser.add_argument(
        "candidate", type=Path, help="run directory of the candidate (new) scheduler"
    )
    parser.add_argument(
        "baseline", type=Path, help="run directory of the baseline (current) scheduler"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write rollback.md/json (default: the candidate run)",
    )
    parser.add_argument(
        "--gates", type=Path, default=None, help="gate file (YAML); default: the built-in gates"
    )
    parser.add_argument(
        "--current-profiles",
        action="store_true",
        help="judge both runs by today's contract/profiles/ files, not the server profile "
        "each kept in meta.json",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        gate_file = load_gate_file(args.gates)
        candidate = load_run(args.candidate, current_profiles=args.current_profiles)
        baseline = load_run(args.baseline, current_profiles=args.current_profiles)
        for side, run in (("candidate", candidate), ("baseline", baseline)):
            try:
                check_evidence(run)
            except EvidenceRefused as exc:
                print(f"kvgate compare: the {side} run {run.path}: {exc}", file=sys.stderr)
                return EXIT_USAGE
        comparison = compare_runs(candidate, baseline, gate_file)
    except (RunDirError, GateSpecError) as exc:
        print(f"kvgate compare: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        paths = write_rollback(comparison, args.out or args.candidate)
    except OSError as exc:
        print(f"kvgate compare: {unwritable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    for name, run in (("candidate", candidate), ("baseline", baseline)):
        if run.profile_note:
            print(f"{name}: {run.profile_note}")
    print(
        f"decision: {comparison.decision}"
        + (
            f" to policy {comparison.baseline.get('policy')}, config {comparison.rollback_to}"
            if comparison.rollback_to
            else ""
        )
    )
    for reason in comparison.reasons:
        print(f"  - {reason}")
    if comparison.likely_cause:
        print(f"likely cause: {comparison.likely_cause}")
    if comparison.recommended_admission_watermark is not None:
        print(
            f"keep a global admission watermark of "
            f"{comparison.recommended_admission_watermark:g} ({comparison.watermark_reason})"
        )
    print(f"wrote {paths['markdown']} and {paths['json']}")
    return comparison.exit_code


if __name__ == "__main__":
    sys.exit(main())
