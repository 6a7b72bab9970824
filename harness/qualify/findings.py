"""What a qualification found, from the records of its runs: the detection matrix, each gate's
false-alarm rate on the policy under test and its margin in run-to-run spreads, and the exit
code. Pure functions over `runs.run_once` records; `cli.py` runs the plans.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from contract import MutantSpec
from gates.stats import CONFIDENCE, wilson
from harness.qualify.runs import gate_table, run_table, summarise
from reports.qualify import OUTCOME_TEXT, margin_text, rate_text

# A gate whose mean sits less than this many run-to-run standard deviations from its line
# will sooner or later fail on correct code.
FLAKE_SPREADS = 1.0
EXIT_QUALIFIED, EXIT_BROKEN, EXIT_UNSURE = 0, 3, 4
RESULTS = {EXIT_QUALIFIED: "PASS", EXIT_BROKEN: "FAIL", EXIT_UNSURE: "MARGINAL"}
# What became of a mutant: caught by a gate meant for it and the run FAILed (a release
# manager would have been stopped), caught by its gate while the run still read MARGINAL or
# INVALID (seen, but nobody stopped), caught only by other gates, not caught at all, or a run
# that produced no verdict (nothing can be said about its gates).
DETECTED, NOT_STOPPED, BY_ACCIDENT, MISSED, NO_VERDICT = (
    "detected",
    "not_stopped",
    "by_accident",
    "missed",
    "no_verdict",
)
# What qualify.json keeps of each run's record.
RUN_KEYS = (
    "run_dir",
    "status",
    "exit_code",
    "wall_s",
    "problems",
    "evidence_problems",
    "sim_lag_ms_p99",
)


def qualify(
    policy_records: Sequence[dict[str, Any]],
    mutant_records: Mapping[str, dict[str, Any]],
    mutants: Mapping[str, MutantSpec],
    word: str = "mutant",
) -> dict[str, Any]:
    """The qualify.json object (less the plan and its overrides), from the runs' records."""
    policy = summarise(list(policy_records))
    everything = [*policy_records, *mutant_records.values()]
    gate_ids = list(dict.fromkeys(g for r in everything for g in r["gates"]))
    found = {name: mutant_result(record, mutants[name]) for name, record in mutant_records.items()}
    gates = {g: _gate(g, policy, policy_records, everything, found) for g in gate_ids}
    exit_code, reasons = _decide(policy_records, found, word)
    return {
        "result": RESULTS[exit_code],
        "exit_code": exit_code,
        "reasons": reasons,
        "runs": len(policy_records),
        "confidence": CONFIDENCE,
        "flake_spreads": FLAKE_SPREADS,
        "policy_verdicts": policy["verdicts"],
        "gate_ids": gate_ids,
        "mutants": found,
        "word": word,  # what the broken variants are: mutants, or misconfigurations
        "gates": gates,
        "policy_runs": [_run(r) for r in policy_records],
    }


def _run(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in RUN_KEYS}


def mutant_result(record: dict[str, Any], spec: MutantSpec) -> dict[str, Any]:
    statuses = {g: v["status"] for g, v in record["gates"].items()}
    failed = [g for g, s in statuses.items() if s == "FAIL"]
    expected = list(spec.gates)
    if record["status"] == "ERROR":
        outcome = NO_VERDICT
    elif set(failed) & set(expected):
        outcome = DETECTED if record["status"] == "FAIL" else NOT_STOPPED
    else:
        outcome = BY_ACCIDENT if failed else MISSED
    return {
        "summary": spec.summary,
        "expected_gate": expected[0],
        "expected_gates": expected,
        "failed_gates": failed,
        "detected": outcome == DETECTED,
        "outcome": outcome,
        "verdict": record["status"],
        "statuses": statuses,
        # an expected gate that the run's gate file does not have can never catch the mutant
        "missing_gates": [g for g in expected if g not in statuses and outcome != NO_VERDICT],
        **{k: v for k, v in _run(record).items() if k != "status"},  # "verdict" has it
    }


def _rate(count: int, n: int) -> dict[str, Any]:
    if n == 0:
        return {"count": 0, "n": 0, "rate": None, "interval": None}
    lo, hi = wilson(count, n, CONFIDENCE)
    return {"count": count, "n": n, "rate": count / n, "interval": [lo, hi]}


def _gate(
    gate_id: str,
    policy: dict[str, Any],
    policy_records: Sequence[dict[str, Any]],
    everything: Sequence[dict[str, Any]],
    found: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    seen = [r["gates"][gate_id] for r in policy_records if gate_id in r["gates"]]
    definition = next(r["gates"][gate_id] for r in everything if gate_id in r["gates"])
    statuses = Counter(g["status"] for g in seen)
    judged = len(seen) - statuses["N/A"]  # an N/A gate is neither passed nor failed
    margin = policy["gates"][gate_id]["margin_spreads"] if seen else None
    return {
        "key": definition["key"],
        "threshold": definition["threshold"],
        "policy_statuses": dict(statuses),
        # a FAIL on the code under test: the gate would have stopped a good release
        "false_alarm": _rate(statuses["FAIL"], judged),
        # anything but PASS (FAIL, MARGINAL, INVALID): a release a person had to look at
        "not_pass": _rate(judged - statuses["PASS"], judged),
        "margin_spreads": margin,
        "will_flake": None if margin is None else float(margin) < FLAKE_SPREADS,
        "expected_for": [m for m, f in found.items() if gate_id in f["expected_gates"]],
        "caught": [m for m, f in found.items() if gate_id in f["failed_gates"]],
        "across_runs": policy["gates"].get(gate_id),  # summarise's entry
    }


def _decide(
    policy_records: Sequence[dict[str, Any]], found: Mapping[str, dict[str, Any]], word: str
) -> tuple[int, list[str]]:
    """The exit code and, worst first, why it is not 0."""
    by_outcome: dict[str, list[str]] = {}
    for name, m in found.items():
        by_outcome.setdefault(m["outcome"], []).append(name)
    verdicts = Counter(r["status"] for r in policy_records)
    n = len(policy_records)
    broken, unsure = [], []
    for name in by_outcome.get(MISSED, []):
        broken.append(f"{word} {name} was missed: no gate failed ({_absent(found[name])})")
    if verdicts["FAIL"]:
        broken.append(f"{verdicts['FAIL']} of {n} policy runs FAILed: false alarms")
    for name in by_outcome.get(BY_ACCIDENT, []):
        m = found[name]
        unsure.append(
            f"{word} {name} was caught only by accident, by {', '.join(m['failed_gates'])}; "
            f"its own gates did not fail ({_absent(m)})"
        )
    for name in by_outcome.get(NOT_STOPPED, []):
        m = found[name]
        caught = ", ".join(g for g in m["failed_gates"] if g in m["expected_gates"])
        unsure.append(
            f"{word} {name} failed {caught}, but its run's verdict is {m['verdict']}, not FAIL: "
            "the release would not have been stopped"
        )
    for name in by_outcome.get(NO_VERDICT, []):
        unsure.append(f"{word} {name}: its run gave no verdict (see {found[name]['run_dir']}.log)")
    other = {s: k for s, k in verdicts.items() if s not in ("PASS", "FAIL")}
    if other:
        counts = ", ".join(f"{s} {k}" for s, k in sorted(other.items()))
        unsure.append(f"{sum(other.values())} of {n} policy runs did not PASS ({counts})")
    exit_code = EXIT_BROKEN if broken else EXIT_UNSURE if unsure else EXIT_QUALIFIED
    return exit_code, broken + unsure


def _absent(mutant: dict[str, Any]) -> str:
    """`cancel_release_p99 PASS, memory_back_to_idle not in the gate file`."""
    statuses = mutant["statuses"]
    return ", ".join(
        f"{g} {statuses[g]}" if g in statuses else f"{g} not in the gate file"
        for g in mutant["expected_gates"]
    )


def markdown(q: dict[str, Any], title: str, records: Sequence[dict[str, Any]]) -> str:
    """qualify.md: the result, the detection matrix, false alarms, then the tables of runs.py."""
    lines = [f"# Qualification of {title}: {q['result']} (exit {q['exit_code']})", ""]
    lines += [f"- {r}" for r in q["reasons"]] or [
        f"Every {q.get('word', 'mutant')} was caught by a gate meant for it, and every policy "
        "run passed."
    ]
    lines += ["", "## Detection matrix", "", *_matrix(q), ""]
    counts = ", ".join(f"{k} {v}" for k, v in q["policy_verdicts"].items())
    lines += [f"## False alarms: {q['runs']} runs of the policy under test ({counts})", ""]
    lines += _false_alarms(q)
    policy_gates = {g: v["across_runs"] for g, v in q["gates"].items() if v["across_runs"]}
    lines += ["", "## Each gate across the policy runs", "", *gate_table(policy_gates)]
    lines += ["", "## Runs", "", *run_table(records)]
    return "\n".join(lines) + "\n"


def _matrix(q: dict[str, Any]) -> list[str]:
    gate_ids = q["gate_ids"]
    lines = [
        f"| {q.get('word', 'mutant')} | outcome | verdict | " + " | ".join(gate_ids) + " |",
        "|---|---|---|" + "---|" * len(gate_ids),
    ]
    for name, m in q["mutants"].items():
        # the gates meant to catch the mutant are in bold
        cells = [
            (
                f"**{m['statuses'].get(g, '-')}**"
                if g in m["expected_gates"]
                else m["statuses"].get(g, "-")
            )
            for g in gate_ids
        ]
        outcome = OUTCOME_TEXT[m["outcome"]]
        lines.append(f"| {name} | {outcome} | {m['verdict']} | " + " | ".join(cells) + " |")
    missing = sorted({g for m in q["mutants"].values() for g in m["missing_gates"]})
    if missing:
        lines += ["", f"Expected but not in the gate file: {', '.join(missing)}."]
    distrusted = {n: m for n, m in q["mutants"].items() if _evidence_problems(m)}
    if distrusted:
        word = q.get("word", "mutant")
        lines += ["", f"{word.capitalize()} runs whose evidence checks made them INVALID:", ""]
        lines += [f"- {n}: {'; '.join(_evidence_problems(m))}" for n, m in distrusted.items()]
    return lines


def _evidence_problems(mutant: Mapping[str, Any]) -> list[str]:
    """Why the evidence checks distrusted a mutant's INVALID run (none for another verdict)."""
    if mutant["verdict"] != "INVALID":
        return []
    return [str(p).replace("\n", " ") for p in mutant.get("evidence_problems") or []]


def _false_alarms(q: dict[str, Any]) -> list[str]:
    level = f"{100 * q['confidence']:g}%"
    lines = [
        f"| gate | key | FAIL rate [{level}] | not PASS [{level}] | margin (spreads) | |",
        "|---|---|---|---|---|---|",
    ]
    for gate_id, g in q["gates"].items():
        margin = g["margin_spreads"]
        flag = f"**will flake** (< {q['flake_spreads']:g} spread)" if g["will_flake"] else ""
        lines.append(
            f"| {gate_id} | {'yes' if g['key'] else ''} | {rate_text(g['false_alarm'])} | "
            f"{rate_text(g['not_pass'])} | {margin_text(margin)} | {flag} |"
        )
    return lines
