"""`load.until: decided`: the one rule that says when such a load stops, and its record.

The running check (harness/live/watch.py) judges the gates that can block a release every few
seconds and hands each look to `UntilDecided.look`; the load loop asks `tick` whether to stop
now. The gates that hold the load open are the key gates, always, and every other blocking
gate once it has data: a blocking gate without its samples makes the verdict MARGINAL, which
more load would have settled, while one the load has not provoked at all (no preemption, no
probe) is left to the verdict's own rule for missing data, since waiting would only run the
load to its maximum. A look settles the load when every gate it holds is settled at it
(gates/standing.py: decided by its anytime-valid bound, or, for a count or a maximum, observed
with its minimum samples), on records that hold everything the decision is about:

- a constant load, or a soak, stops on the first look begun at min_duration_s or later that
  settles it (every fault has fired by then); a soak then runs its cooldown;
- a shape with phases stops only at a boundary (the end of a whole peak/trough cycle, of a
  ramp step: workloads/shapes.py), so no phase is cut short. A look that settles the load
  asks the shape to end at its next boundary not before min_duration_s; the shape holds its
  users there, and a look begun at the boundary decides: settled, the load stops; else the
  shape resumes for another whole cycle (or step), and so on until max_duration_s.

A blocking gate decided FAIL, at any look, is a decision too: it stops the load once
min_duration_s has passed, at once, since no more evidence would change it and the run fails
anyway. At max_duration_s the load stops whatever the gates say (the load generator's
deadline), and the record says which were still undecided (or that the last look had
decided them all, where the boundary the load was to end at was the maximum itself). The
verdict still judges everything collected by its fixed-n intervals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from gates.spec import GateSpec

log = logging.getLogger(__name__)


class Boundaries(Protocol):
    """What the rule needs of a load shape (workloads/shapes.py's RecordingShape)."""

    @property
    def parked(self) -> bool: ...

    @property
    def confirms_at_boundary(self) -> bool: ...

    def end_at_boundary(self, not_before_s: float = 0.0) -> float: ...

    def resume(self) -> None: ...


class UntilDecided:
    """Owns the decision to stop a load that runs until the gates that can block a release
    are decided.

    Invariants: it never stops the load before `min_s`; it stops a shape with phases only
    once the shape holds at a boundary and a look begun there settled the load (a FAIL
    excepted); it decides on one look's results as a whole, never on gates settled at
    different looks."""

    def __init__(
        self,
        gates: Sequence[GateSpec],
        min_s: float,
        max_s: float,
        shape: Boundaries | None = None,
    ) -> None:
        assert min_s <= max_s, "the plan's validation keeps min_duration_s <= max_duration_s"
        self.key = [g.id for g in gates if g.key]
        # the other gates whose FAIL fails the run: they hold the load once they have data
        self.blocking = [g.id for g in gates if g.blocking and not g.key]
        self.held = self.key + self.blocking
        if not self.held:
            log.warning(
                "load.until decided: the gate file has no key or blocking gate; stops at the "
                "minimum"
            )
        self.min_s, self.max_s = min_s, max_s
        self.shape = shape
        self.gates: dict[str, dict[str, Any]] = {}  # the last look, by held gate id
        self.looks = 0
        self.looked_at_s: float | None = None
        self.decided_at_s: float | None = None
        self.reason: str | None = None  # why the load is to stop, once decided
        self.failed = False
        self.resumed = 0  # boundaries at which a gate was still undecided
        self.stopped_at_s: float | None = None
        self.stopped_because: str | None = None
        self._boundary_asked = False  # a look settled the load: the shape ends at a boundary
        self._boundary_s: float | None = None  # that boundary, on the shape's clock
        self._parked_at: float | None = None  # when the shape began to hold there

    @property
    def _at_boundaries(self) -> bool:
        """Whether the shape's boundaries lie ahead: the look taken there decides."""
        return self.shape is not None and self.shape.confirms_at_boundary

    @property
    def wants_look(self) -> bool:
        """A look is due now: the shape holds at its boundary, waiting for one."""
        return self._parked_at is not None and self.reason is None

    def look(
        self, at_s: float, results: Sequence[dict[str, Any]], began_s: float | None = None
    ) -> None:
        """One check's results (harness/live/watch.py), begun `began_s` and answered `at_s`
        seconds into the load. Once decided, later looks only refresh what the console and
        the live page show."""
        began = at_s if began_s is None else began_s
        seen = {str(r.get("id")): r for r in results}
        self.gates = {gid: seen[gid] for gid in self.held if gid in seen}
        self.looks += 1
        self.looked_at_s = at_s
        if self.reason is not None:
            return
        failed = [gid for gid, r in self.gates.items() if r.get("decision") == "FAIL"]
        settled = all(gid in self.gates for gid in self.key) and all(
            r.get("settled") for gid, r in self.gates.items() if self._holds(gid, r)
        )
        if failed:
            self.failed = True
            kind = "key gate" if all(gid in self.key for gid in failed) else "blocking gate"
            self._decide(at_s, f"{kind} {', '.join(failed)} decided FAIL at +{at_s:.0f} s")
        elif not self._at_boundaries:
            if settled and began >= self.min_s:  # its records hold every fault
                self._decide(at_s, f"every key and blocking gate decided at +{at_s:.0f} s")
        elif self._parked_at is not None and began >= self._parked_at:
            self._at_boundary(at_s, settled)
        elif settled:
            self._boundary_asked = True

    def _holds(self, gate_id: str, result: dict[str, Any] | None) -> bool:
        """Whether a gate holds the load open: a key gate always; another blocking gate once
        it has examined a record (one the load never provoked is left to its missing-data
        rule)."""
        if gate_id in self.key:
            return True
        return result is not None and int(result.get("n") or 0) > 0

    def _settled_at_last_look(self) -> bool:
        """Whether the last look settled every gate that holds the load."""
        return all(gid in self.gates for gid in self.key) and all(
            r.get("settled") for gid, r in self.gates.items() if self._holds(gid, r)
        )

    def _decide(self, at_s: float, reason: str) -> None:
        self.decided_at_s, self.reason = at_s, reason

    def _at_boundary(self, at_s: float, settled: bool) -> None:
        """The look begun at the boundary: it decides, or the shape goes on a whole cycle."""
        if settled:
            self._decide(
                at_s, f"every key and blocking gate decided at the boundary at +{at_s:.0f} s"
            )
            return
        assert self.shape is not None
        self.shape.resume()
        self.resumed += 1
        self._boundary_asked, self._boundary_s, self._parked_at = False, None, None

    def tick(self, elapsed_s: float) -> str | None:
        """Why the load must stop now, or None. Polled by the load loop every fraction of a
        second: asks the shape to end at its boundary once a look has settled the load."""
        if self.failed or (self.reason is not None and self.shape is None):
            return self.stop_reason if elapsed_s >= self.min_s else None
        shape = self.shape
        if shape is None:
            return None
        if self._at_boundaries:
            if self._boundary_asked and self._parked_at is None:
                self._boundary_s = shape.end_at_boundary(self.min_s)
                if shape.parked:
                    self._parked_at = elapsed_s
            return self.stop_reason if self.reason is not None else None
        if self.reason is None:
            return None
        shape.end_at_boundary(self.min_s)  # a soak: its cooldown, then it holds at zero
        return self.stop_reason if shape.parked else None

    @property
    def stop_reason(self) -> str:
        """The load generator's `stopped_early` when this rule stops the load."""
        return f"{self.reason} (load.until: decided)"

    def stopped(self, at_s: float, because: str | None, shape_ended: bool = False) -> None:
        """The load has stopped, `at_s` seconds in (its users stopped: the stress window's
        end); `because`: why it stopped early (this rule's reason, an abort's, ...), None
        when it ran to its end: the deadline, or its shape's own end (`shape_ended`)."""
        self.stopped_at_s = at_s
        if because is not None:
            self.stopped_because = self.reason if because == self.stop_reason else because
        elif self.reason is not None:  # decided, and the end came first
            self.stopped_because = self.reason
        elif shape_ended:
            self.stopped_because = (
                "its shape ended by itself (no further whole cycle or step fits before "
                "max_duration_s, or a ramp found its knee) with gates undecided"
            )
        elif self._boundary_asked and self._settled_at_last_look():
            # the boundary it was to end at was the maximum, so no look could confirm there
            looked = self.looked_at_s if self.looked_at_s is not None else at_s
            self._decide(
                looked,
                f"every key and blocking gate decided at its last look (+{looked:.0f} s); the "
                "boundary where it was to end was max_duration_s",
            )
            self.stopped_because = self.reason
        else:
            self.stopped_because = "it reached max_duration_s with gates undecided"

    def record(self) -> dict[str, Any]:
        """meta.json's `until` (contract/runmeta.py's Until)."""
        return {
            "rule": "decided",
            "min_duration_s": self.min_s,
            "max_duration_s": self.max_s,
            "decided": self.decided_at_s is not None,
            "decided_at_s": self.decided_at_s,
            "looked_at_s": self.looked_at_s,
            "looks": self.looks,
            "resumed": self.resumed,
            "stopped_at_s": self.stopped_at_s,
            "stopped_because": self.stopped_because,
            "gates": self.progress(),
        }

    def progress(self) -> list[dict[str, Any]]:
        """Each held gate's way to a decision, for the record, the console and the live page:
        the key gates, then the blocking gates that have data."""
        return [
            _gate_record(gid, self.gates.get(gid), key=gid in self.key)
            for gid in self.held
            if self._holds(gid, self.gates.get(gid))
        ]

    def label(self) -> str:
        """One line for the console: how many held gates are settled, and what the others
        have and need."""
        gates = self.progress()
        if self.looks == 0:
            return f"{len(self.key)} key and {len(self.blocking)} blocking gates, not judged yet"
        done = sum(bool(g["settled"]) for g in gates)
        text = f"{done}/{len(gates)} settled"
        if self.reason is not None:
            return f"{text}; {self.reason}"
        waiting = [
            f"{g['id']} n={g['n']}" + (f"/{g['needs_n']}" if g["needs_n"] is not None else "")
            for g in gates
            if not g["settled"]
        ]
        if waiting:
            return f"{text}; waiting: {', '.join(waiting)}"
        if self._parked_at is not None:
            return f"{text}; holding at the boundary for the look that decides"
        if self._boundary_s is not None:
            return f"{text}; ends at the boundary at +{self._boundary_s:.0f} s if still settled"
        return f"{text}; a look begun after +{self.min_s:.0f} s decides"


def _gate_record(gate_id: str, result: dict[str, Any] | None, key: bool) -> dict[str, Any]:
    """One held gate as meta.json's UntilGate keeps it (not judged yet: UNDECIDED at n 0)."""
    result = result or {}
    return {
        "id": gate_id,
        "key": key,
        "decision": result.get("decision") or "UNDECIDED",
        "settled": bool(result.get("settled")),
        "settled_by": result.get("settled_by"),
        "n": int(result.get("n") or 0),
        "needs_n": result.get("needs_n"),
        "bound": result.get("bound_text") or None,
    }
