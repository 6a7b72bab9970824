"""`kvgate gate RUN_DIR [--gates FILE] [--current-profiles]`: judge a run.

The run is judged by the server profile its meta.json keeps (gates/run_profile.py), or with
`--current-profiles` by today's profile files; the verdict's notes say which, when it is not
the run's own.

Exit codes: 0 pass, 3 fail, 4 marginal, 5 invalid, 2 usage (bad arguments, run directory or
gate file, or verdict.json / junit.xml cannot be written).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gates.evaluator import evaluate_run
from gates.evidence.kept import checks_seen, tally
from gates.rundir import RunDirError, unwritable
from gates.spec import GateSpecError
from gates.verdict import EXIT_USAGE, Verdict


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() returns the usage code."""

    def error(self, message: str) -> NoReturn:
        raise GateUsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


class GateUsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvgate gate", description="Evaluate the release gates over a run directory.")
    p.add_argument("run_dir", type=Path, help="the run directory `kvgate run` wrote")
    p.add_argument(
        "--gates", type=Path, default=None, help="gate file (YAML); default: the built-in gates"
    )
    p.add_argument(
        "--current-profiles",
        action="store_true",
        help="judge by today's contract/profiles/ files, not the server profile the run kept "
        "in meta.json (the verdict notes say which profile it used)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    return p


def format_verdict(verdict: Verdict, quiet: bool = False, header: bool = True) -> str:
    """The verdict line, the run's problems and notes, what the evidence checks found, then one
    line per gate: status, id, value with interval and n, the threshold and any caveat; a gate
    that did not pass adds its message and evidence.

    `header=False` leaves out the verdict line, for callers that print their own.
    """
    lines = [f"verdict: {verdict.status} (score {verdict.score:g}) for {verdict.run_dir}"]
    lines = lines if header else []
    lines += [f"  run: {p}" for p in verdict.run_problems]
    lines += [f"  note: {n}" for n in verdict.notes]
    if quiet:
        return "\n".join(lines)
    if verdict.evidence:
        lines.append(f"  evidence checks: {tally(checks_seen(verdict.evidence))}")
    for gate in verdict.gates:
        key = " [key]" if gate.key else ""
        caveats = "".join(f"; {c}" for c in gate.caveats())
        lines.append(
            f"  {gate.status:<8} {gate.id}{key}: {gate.value_text()} "
            f"(threshold {gate.threshold}){caveats}"
        )
        if gate.status == "PASS":
            continue
        lines.append(f"           {gate.message}")
        for item in gate.evidence[:3]:
            lines.append(f"           evidence: {item}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except GateUsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        verdict = evaluate_run(args.run_dir, args.gates, current_profiles=args.current_profiles)
    except (RunDirError, GateSpecError) as exc:
        print(f"kvgate gate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the reader turns its own OSErrors into RunDirError: this is a write
        print(f"kvgate gate: {unwritable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    print(format_verdict(verdict, args.quiet))
    print(f"wrote {args.run_dir / 'verdict.json'} and {args.run_dir / 'junit.xml'}")
    return verdict.exit_code


if __name__ == "__main__":
    sys.exit(main())
