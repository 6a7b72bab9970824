"""While the load runs: abort on a clearly failed gate, and interim reports.

Both read the run directory as it grows (meta.json rewritten as "running" first; the table
readers drop a torn last line), each in a child process (`python -m harness.live.watch
check|report RUN_DIR`) so that loading a large run never stalls the load generator's event
loop; the children run at the lowest CPU priority (`BACKGROUND_NICE`), so that on a small
host a look (1-2 CPU-seconds for a run of a few thousand requests) takes no CPU from the
server under test or the load generator, whose timings the gates judge. Each check judges
the gates twice: as the end of the run would (the fixed-n intervals, `status`), and by
their anytime-valid bounds (gates/sequential.py, `decision`), which keep their error rate
however often the check looks. A gate with `abort_on_fail` that has clearly failed
(`clearly_failed`: decided FAIL by its anytime bound), `abort_grace_s` or more into the
load, stops the load; the run is then torn down, judged and reported as usual, and its
verdict is FAIL with the reason (gates/evaluator.py reads meta.json's `aborted`). A load
that runs until its gates are decided (`load.until: decided`) hands each look, which then
judges every key and blocking gate, to its stop rule (harness/live/until.py). The live page
shows each gate's decision so far.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gates.spec import GateSpec, load_gate_file

if TYPE_CHECKING:  # the load generator's process imports this module: keep it light
    from harness.live.until import UntilDecided

CHECK_EVERY_S = 10.0
BACKGROUND_NICE = 19  # a look or an interim report runs only on CPU nothing else wants


def _background() -> None:
    """In the child, before it runs: the lowest CPU priority."""
    os.nice(BACKGROUND_NICE)


class RunWatch:
    """Polled from the load loop; never blocks it (its work runs in child processes)."""

    def __init__(
        self,
        run_dir: Path,
        gates_file: Path | None,
        report_every_s: float | None,
        write_meta: Callable[[], None],
        all_gates: bool = False,  # judge every gate, for the live page (`latest`)
        until: UntilDecided | None = None,  # load.until: decided, judging the blocking gates too
    ) -> None:
        self.run_dir = run_dir
        self.gates_file = gates_file
        self.abort_gates: dict[str, GateSpec] = {
            g.id: g for g in load_gate_file(gates_file).gates if g.abort_on_fail
        }
        self.report_every_s = report_every_s
        self.write_meta = write_meta
        self._check: subprocess.Popen[str] | None = None
        self._report: subprocess.Popen[str] | None = None
        self._next_check = CHECK_EVERY_S
        self._next_report = report_every_s or 0.0
        self.aborted: dict[str, Any] | None = None
        self.all_gates = all_gates
        self.until = until
        self.latest: list[dict[str, Any]] = []  # the last check's results
        self._check_began = 0.0  # seconds into the load when the running check began

    @property
    def needed(self) -> bool:
        checking = bool(self.abort_gates) or self.all_gates or self.until is not None
        return checking or self.report_every_s is not None

    def tick(self, elapsed_s: float) -> str | None:
        """Why the load must stop now (a gate with abort_on_fail failed, or the gates of a
        load that runs until decided are decided), or None."""
        reason = self._read_check(elapsed_s)
        if reason:
            return reason
        checking = bool(self.abort_gates) or self.all_gates or self.until is not None
        due = elapsed_s >= self._next_check or (self.until is not None and self.until.wants_look)
        if checking and self._check is None and due:
            self._next_check = elapsed_s + CHECK_EVERY_S
            self.write_meta()
            self._check_began = elapsed_s
            self._check = self._spawn("check")
        if self.report_every_s and self._report is None and elapsed_s >= self._next_report:
            self._next_report = elapsed_s + self.report_every_s
            self.write_meta()
            self._report = self._spawn("report")
        if self._report is not None and self._report.poll() is not None:
            self._report = None
        return self.until.tick(elapsed_s) if self.until is not None else None

    def _read_check(self, elapsed_s: float) -> str | None:
        if self._check is None or self._check.poll() is None:
            return None
        out, _ = self._check.communicate()
        self._check = None
        try:
            results = json.loads(out or "[]")
        except ValueError:
            return None  # a half-written table: the next check reads it whole
        self.latest = results
        for result in results:
            gate = self.abort_gates.get(result.get("id"))
            if gate is None or elapsed_s < gate.abort_grace_s or not clearly_failed(result, gate):
                continue
            self.aborted = {
                "gate": gate.id,
                "at_s": round(elapsed_s, 1),
                "message": result["message"],
            }
            return f"aborted at +{elapsed_s:.0f} s by gate {gate.id}: {result['message']}"
        if self.until is not None:
            self.until.look(elapsed_s, results, began_s=self._check_began)
        return None

    def _spawn(self, what: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "harness.live.watch", what, str(self.run_dir)]
        cmd.append(str(self.gates_file) if self.gates_file is not None else "builtin")
        if what == "check" and self.all_gates:
            cmd.append("--all")
        elif what == "check" and self.until is not None:
            cmd.append("--blocking")
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=_background,
        )

    def close(self) -> None:
        for proc in (self._check, self._report):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def clearly_failed(result: dict[str, Any], gate: GateSpec) -> bool:
    """A FAIL that more evidence would not turn, however often the check has looked: the
    gate's anytime-valid bound is wholly past its line, and it has its minimum samples. A
    fixed-n interval past the line is not enough: checked every 10 s, some check would put
    one there by chance. The end-of-run verdict still judges everything."""
    return (
        result.get("status") == "FAIL"
        and result.get("decision") == "FAIL"
        and int(result.get("n_samples") or 0) >= gate.min_samples
    )


def _check(
    run_dir: Path, gates_file: Path | None, every: bool, blocking: bool = False
) -> list[dict[str, Any]]:
    """Each gate with abort_on_fail (`blocking`: and each gate that blocks, key gates among
    them; `every`: every gate) judged on the run so far: its fixed-n status and its anytime
    standing (gates/standing.py)."""
    from gates.evaluator import judge_observed
    from gates.rundir import load_run
    from gates.standing import standing

    run = load_run(run_dir)
    gates = [
        g
        for g in load_gate_file(gates_file).gates
        if every or g.abort_on_fail or (blocking and (g.key or g.blocking))
    ]
    checked = []
    for gate in gates:
        r, obs = judge_observed(run, gate)
        checked.append(
            {
                "id": r.id,
                "status": str(r.status),
                "straddles": r.straddles,
                "n_samples": r.n_samples,
                "message": r.message,
                "value_text": r.value_text(),
                "threshold": r.threshold,
                "key": gate.key,
                **standing(gate, obs),
            }
        )
    return checked


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("check", "report"):
        print(
            "usage: python -m harness.live.watch check|report RUN_DIR GATES|builtin "
            "[--all|--blocking]",
            file=sys.stderr,
        )
        return 2
    run_dir = Path(argv[1])
    gates_file = None if argv[2] == "builtin" else Path(argv[2])
    if argv[0] == "check":
        options = argv[3:]
        every, blocking = "--all" in options, "--blocking" in options
        print(json.dumps(_check(run_dir, gates_file, every, blocking)))
        return 0
    from reports import write_reports

    write_reports(run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
