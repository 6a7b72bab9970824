"""A release counts only from the replica that held the request: a `released` row from
another replica must not hide a leak on the holder."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder
from tests.gates.conftest import gate
from tests.gates.evidence.conftest import findings

Judge = Callable[[RunBuilder], Verdict]


def released_on(b: RunBuilder, n: int, prefix: str, releaser: str) -> RunBuilder:
    """`n` requests admitted on r0, cancelled, and released 0.1 s later by `releaser`."""
    for i in range(n):
        rid, t = f"{prefix}{i}", 20 + i * 0.1
        b.request(rid, t=t, traffic_class="cancel_storm", outcome="cancelled", cancel_at=t + 1)
        b.event("admitted", t + 0.05, "r0", request_id=rid, blocks=4)
        b.event("released", t + 1.1, releaser, request_id=rid, blocks=4)
    return b


def test_a_release_logged_by_another_replica_leaves_the_holders_leak_failing(
    judge: Judge,
) -> None:
    b = released_on(RunBuilder(), 400, "ok", "r0")
    released_on(b, 10, "leak", "r1")
    # cancelled while queued on r1: released there with nothing held, which hides nothing
    b.request("queued", t=70, outcome="cancelled", cancel_at=70.5, http_status=None)
    b.event("queued", 70.1, "r1", request_id="queued")
    b.event("released", 70.6, "r1", request_id="queued", blocks=0)
    verdict = judge(b)
    result = gate(verdict, "cancel_release_p99")
    assert result.status == Status.FAIL and result.value == np.inf
    assert result.censored == 10
    assert result.evidence[0]["request_id"].startswith("leak")
    assert any("other than the one that last admitted" in n for n in result.notes)
    (finding,) = findings(verdict, "release_by_holder")
    assert finding["effect"] == "note" and finding["n_rows"] == 10
    assert (finding["table"], finding["column"]) == ("server_events", "replica")
    assert "leak0 released by r1" in finding["message"]
    assert verdict.status == Status.FAIL


def test_the_holders_death_still_frees_what_another_replica_claimed_to_release(
    judge: Judge,
) -> None:
    b = released_on(RunBuilder(), 400, "ok", "r0")
    released_on(b, 10, "moved", "r1")
    b.fault(70, target="r0", effect="kills")
    result = gate(judge(b), "cancel_release_p99")
    assert result.value is not None and np.isfinite(result.value)
    freed = [e for e in result.evidence if e["request_id"].startswith("moved")]
    assert freed and all(e["detail"] == "freed by the death of its replica" for e in freed)
