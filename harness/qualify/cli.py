"""`kvgate qualify PLAN`: do the release gates have teeth, and how often do they bite good code?

Runs the plan N times with the policy under test (the plan as given, plus --set), then once
per selected mutant (the reference server carrying that bug: `--set target.mutant=NAME`),
each as its own `kvgate run` process (runs.py). Writes qualify.json, qualify.md and
qualify.html into the output folder; `--json` prints qualify.json's object as the last line.

Exit codes: 0 every mutant caught by a gate meant for it and every policy run PASS; 3 a
mutant missed or a policy run FAILed; 4 anything else (a policy run MARGINAL or INVALID, a
mutant caught only by other gates, a run without a verdict); 2 bad input; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import contract
from gates.spec import GateSpecError, load_gate_file
from harness.plan import ExternalTarget, Plan, PlanError, ReferenceTarget, load_plan
from harness.qualify import findings
from harness.qualify.runs import default_out, describe, run_once
from reports.qualify import write_html

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130
PROG = "kvgate qualify"


class UsageError(Exception):
    """Input that makes the qualification impossible; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Job:
    """One `kvgate run` of the qualification: the policy under test, or one mutant."""

    label: str  # "policy 3/10" or "mutant slow_release"
    run_dir: Path
    overrides: tuple[str, ...]
    mutant: str | None = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run a plan N times with the policy under test and once per mutant: the "
        "detection matrix, each gate's false-alarm rate and its margin in run-to-run spreads.",
        epilog="Exit codes: 0 qualified, 3 a mutant missed or a policy run failed, "
        "4 anything else that is not clean, 2 bad input.",
    )
    p.add_argument("plan", help="plan YAML with a reference target (see harness/plans/)")
    p.add_argument("--runs", type=int, default=10, help="runs of the policy under test (10)")
    p.add_argument(
        "--mutants",
        default="all",
        help=f"all, or a comma-separated list of: {', '.join(contract.MUTANTS)}",
    )
    p.add_argument("--out", type=Path, default=None, help="folder for the runs and the reports")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true", help="print qualify.json as the last line")
    return p


@dataclass(frozen=True, slots=True)
class Teeth:
    """What a qualification breaks on purpose: the reference server's built-in mutants, or a
    real engine's misconfigurations as its plan declares them; each with the overrides that
    make it and the gates meant to catch it."""

    word: str  # "mutant" or "misconfiguration"
    specs: Mapping[str, contract.MutantSpec]
    overrides: Mapping[str, tuple[str, ...]]


def teeth_of(plan: Plan) -> Teeth:
    if isinstance(plan.target, ReferenceTarget):
        return Teeth(
            "mutant", contract.MUTANTS, {m: (f"target.mutant={m}",) for m in contract.MUTANTS}
        )
    declared = plan.misconfigurations
    return Teeth(
        "misconfiguration",
        {name: contract.MutantSpec(tuple(m.gates), m.summary) for name, m in declared.items()},
        {name: tuple(m.set) for name, m in declared.items()},
    )


def select_mutants(spec: str, teeth: Teeth | None = None) -> list[str]:
    """`all` or `a,b`: the mutants (or misconfigurations) to run, in their declared order when
    `all`."""
    known = list((teeth.specs if teeth else contract.MUTANTS).keys())
    word = teeth.word if teeth else "mutant"
    if spec.strip() == "all":
        if not known:
            raise UsageError(
                f"the plan declares no {word}s; list them under `misconfigurations:` "
                "(harness/plans/vllm.yaml has examples)"
            )
        return known
    names = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(
            f"--mutants {spec!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
            f"give all, or some of: {', '.join(known) or f'(no {word}s declared)'}"
        )
    return names


def load_policy(plan_path: str, overrides: Sequence[str]) -> Plan:
    try:
        return load_plan(plan_path, list(overrides))
    except PlanError as exc:
        raise UsageError(str(exc)) from None


def check_plan(
    plan_path: str, overrides: Sequence[str], mutants: Sequence[str], teeth: Teeth | None = None
) -> Plan:
    """The policy plan, once it and every mutant's variant of it are known to be runnable."""
    try:
        plan = load_plan(plan_path, list(overrides))
        teeth = teeth or teeth_of(plan)
        if isinstance(plan.target, ExternalTarget) and not teeth.specs:
            raise UsageError(
                f"{plan_path}: the target is a server kvgate cannot break on purpose "
                f"({plan.target.url}); declare its misconfigurations under `misconfigurations:` "
                "(each: summary, set, gates), or qualify a reference target, which carries "
                "its mutants"
            )
        if isinstance(plan.target, ReferenceTarget) and plan.target.mutant is not None:
            raise UsageError(
                f"{plan_path}: the policy under test carries mutant {plan.target.mutant!r}; "
                "remove target.mutant (qualify adds each mutant itself)"
            )
        plan.check_files()
        gate_ids = {g.id for g in load_gate_file(plan.resolve(plan.gates)).gates}
        for name in mutants:
            load_plan(plan_path, [*overrides, *teeth.overrides[name]])
            unknown = [g for g in teeth.specs[name].gates if g not in gate_ids]
            if unknown:
                raise UsageError(
                    f"{plan_path}: {teeth.word} {name} names gates the gate file does not "
                    f"have: {', '.join(unknown)}"
                )
    except (PlanError, GateSpecError) as exc:
        raise UsageError(str(exc)) from None
    return plan


def prepare_out(out: Path) -> Path:
    """A new (or empty) writable folder: every run needs a directory of its own."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not a folder" if not out.is_dir() else "is not empty"
        raise UsageError(f"--out {out} {what}; choose a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(
            f"--out {out}: cannot write there ({exc.strerror or exc}); choose another folder"
        ) from None
    return out


def jobs(
    out: Path,
    runs: int,
    overrides: Sequence[str],
    mutants: Sequence[str],
    teeth: Teeth | None = None,
) -> list[Job]:
    teeth = teeth or Teeth(
        "mutant", contract.MUTANTS, {m: (f"target.mutant={m}",) for m in contract.MUTANTS}
    )
    policy = [
        Job(f"policy {i}/{runs}", out / f"policy-{i:02d}", tuple(overrides))
        for i in range(1, runs + 1)
    ]
    return policy + [
        Job(f"{teeth.word} {m}", out / f"mutant-{m}", (*overrides, *teeth.overrides[m]), m)
        for m in mutants
    ]


def _caught(result: dict[str, Any]) -> str:
    """How a mutant's run ended, for its progress line."""
    if result["outcome"] == findings.DETECTED:
        caught = [g for g in result["failed_gates"] if g in result["expected_gates"]]
        return f"caught by {', '.join(caught)}"
    if result["outcome"] == findings.NOT_STOPPED:
        caught = [g for g in result["failed_gates"] if g in result["expected_gates"]]
        return f"caught by {', '.join(caught)}, but the run reads {result['verdict']}"
    if result["outcome"] == findings.BY_ACCIDENT:
        return f"caught only by accident, by {', '.join(result['failed_gates'])}"
    if result["outcome"] == findings.MISSED:
        return f"MISSED (expected {', '.join(result['expected_gates'])} to fail)"
    return "no verdict"


def execute(
    plan_path: str, work: Sequence[Job], specs: Mapping[str, contract.MutantSpec] | None = None
) -> list[dict[str, Any]] | int:
    """Run every job, printing one line as each finishes; an exit code when one stops it all."""
    records = []
    for i, job in enumerate(work, 1):
        record = run_once(plan_path, job.overrides, job.run_dir)
        records.append(record)
        line = f"run {i}/{len(work)} {job.label}: {describe(record)}"
        if job.mutant is not None:
            result = findings.mutant_result(record, (specs or contract.MUTANTS)[job.mutant])
            line += f": {_caught(result)}"
        print(line, flush=True)
        if record["exit_code"] == EXIT_USAGE:
            # the plan was checked before starting, so this is input only `kvgate run` sees
            print(
                f"{PROG}: kvgate run refused its input; see {job.run_dir}.log and fix the plan",
                file=sys.stderr,
            )
            return EXIT_USAGE
    return records


def write(q: dict[str, Any], out: Path, title: str, records: Sequence[dict[str, Any]]) -> None:
    (out / "qualify.json").write_text(json.dumps(q, indent=1) + "\n")
    (out / "qualify.md").write_text(findings.markdown(q, title, records))
    write_html(q, out / "qualify.html")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        if args.runs < 1:
            raise UsageError(f"--runs {args.runs}: give at least 1 run of the policy under test")
        teeth = teeth_of(load_policy(args.plan, args.overrides))
        mutants = select_mutants(args.mutants, teeth)
        plan = check_plan(args.plan, args.overrides, mutants, teeth)
        out = prepare_out(args.out or default_out("qualify"))
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    work = jobs(out, args.runs, args.overrides, mutants, teeth)
    minutes = len(work) * plan.planned_seconds() / 60
    print(
        f"{PROG}: {len(work)} runs of {args.plan}: {args.runs} of the policy under test, then "
        f"{len(mutants)} {teeth.word}s ({', '.join(mutants)}); at least {minutes:.0f} min; "
        f"into {out}",
        flush=True,
    )
    try:
        records = execute(args.plan, work, teeth.specs)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the finished runs are in {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(records, int):
        return records
    by_mutant = {j.mutant: r for j, r in zip(work, records, strict=True) if j.mutant is not None}
    q = {
        "plan": args.plan,
        "overrides": list(args.overrides),
        **findings.qualify(records[: args.runs], by_mutant, teeth.specs, teeth.word),
    }
    title = " ".join([args.plan, *(f"--set {o}" for o in args.overrides)])
    try:
        write(q, out, title, records)
    except OSError as exc:
        print(
            f"{PROG}: cannot write the reports into {out}: {exc.strerror or exc}", file=sys.stderr
        )
        return EXIT_USAGE
    print(f"{PROG}: {q['result']} (exit {q['exit_code']})")
    for reason in q["reasons"]:
        print(f"  - {reason}")
    for name in ("qualify.html", "qualify.md", "qualify.json"):
        print(f"{PROG}: wrote {out / name}")
    if args.json:
        print(json.dumps(q))
    return int(q["exit_code"])
