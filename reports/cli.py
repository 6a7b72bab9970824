"""`kvgate report RUN_DIR [--current-profiles]`: write report.html, summary.md, report.json.

Exit codes: 0 written; 2 bad input (arguments, run directory, gate file) or an output that
cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gates.rundir import RunDirError, load_run, unwritable
from gates.spec import GateSpecError
from gates.verdict import EXIT_USAGE
from reports.build import judge_again, write_reports

CURRENT_PROFILES = (
    "read the run by today's contract/profiles/ files, not the server profile it kept in "
    "meta.json (the report then judges it again, by the gates its verdict.json keeps, and "
    "leaves verdict.json as it was)"
)


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() can return the usage exit code."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed args, or the exit code when parsing ended the command (--help or bad usage)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return 0 if exc.code in (0, None) else EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="kvgate report", description="Write the HTML, Markdown and JSON reports of a run."
    )
    parser.add_argument("run_dir", type=Path, help="the run directory `kvgate run` wrote")
    parser.add_argument("--current-profiles", action="store_true", help=CURRENT_PROFILES)
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        run = load_run(args.run_dir, current_profiles=args.current_profiles)
        # Judged again only when asked for today's profiles: the run's verdict was judged by
        # its own, and stays as it is.
        verdict = judge_again(args.run_dir, run) if args.current_profiles else None
        paths = write_reports(args.run_dir, run=run, verdict=verdict)
    except (RunDirError, GateSpecError) as exc:
        print(f"kvgate report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the reader turns its own OSErrors into RunDirError: this is a write
        print(f"kvgate report: {unwritable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if run.profile_note:
        print(f"kvgate report: {run.profile_note}")
    for path in paths.values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
