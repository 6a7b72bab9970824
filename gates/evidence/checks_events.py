"""Server events that contradict who held what: a release logged by a replica that never
admitted the request.

A replica frees only blocks in its own pool. When the `released` row of a request comes
from a replica other than the one that admitted it, either the row names the wrong replica
or the holder never let go; either way the holder's pool is where a leak would sit. The
release gate (gates/metrics_release.py, cancel_release_latency) counts only the holder's
own release, or its death, and this check says which rows it set aside, so a leak that such
a row used to hide is explained in the verdict.
"""

from __future__ import annotations

import numpy as np

from contract import EventKind
from gates.evidence.base import Effect, Finding, evidence_check, flagged
from gates.keys import members, pair_codes, text_codes
from gates.rundir import RunData

CHECK = "release_by_holder"
HOLDING = (str(EventKind.ADMITTED), str(EventKind.RESUMED))
SHOWN = ["request_id", "replica"]  # what the finding names of each row


@evidence_check(CHECK, order=130)
def release_by_holder(run: RunData) -> list[Finding]:
    """Each `released` row comes from a replica that admitted the request."""
    events = run.server_events
    mine = events["request_id"].notna().to_numpy()
    kind = events["event"]
    released = mine & kind.eq(EventKind.RELEASED).to_numpy()
    if not released.any():
        return []
    replicas = text_codes(events["replica"])
    keys = pair_codes(text_codes(events["request_id"]), replicas, int(replicas.max()) + 1)
    held = keys[mine & kind.isin(HOLDING).to_numpy()]
    seen = keys[mine & ~released]
    on = keys[released]
    never_held = ~members(on, held)
    # A request cancelled while queued is released with nothing held by the replica that
    # queued it: that row frees no blocks and hides nothing.
    freed_nothing = ~(events["blocks"].to_numpy(dtype=float)[released] > 0)
    queued_only = members(on, seen) & freed_nothing
    foreign = events[SHOWN].iloc[np.flatnonzero(released)[never_held & ~queued_only]]
    if foreign.empty:
        return []
    first = foreign.iloc[0]
    message = (
        f"{len(foreign)} `released` rows come from a replica that never admitted the request "
        f"(first: {first['request_id']} released by {first['replica']}); a replica frees only "
        "its own pool, so they count as no release: the release gate waits for the holder's "
        "own release or its death. Check what wrote these rows' `replica`"
    )
    return [
        flagged(CHECK, Effect.NOTE, message, "server_events", foreign.index.tolist(), "replica")
    ]
