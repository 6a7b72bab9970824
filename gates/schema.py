"""The run directory's layout (docs/architecture.md): its files, tables, columns and their types.

The harness writes these tables, gates and reports read them. While a run is going each
table is an append-only JSON-lines file (`<table>.jsonl`, one object per line, flushed per
line); a long run sets each 200,000 rows aside as `<table>.part-NNNNN.parquet` (JSON lines
until a child process has converted it), and at the end the harness compacts everything into
`<table>.parquet`. Readers prefer Parquet, else read the parts in order and then the live
JSON lines, so a crashed run can still be judged. All cross-process
timestamps are epoch seconds (float); durations are seconds. The names every stage shares
(traffic classes, priorities, outcomes) and the columns of the requests and server_events
tables (contract.RequestRecord, contract.ServerEvent) come from `contract`.
"""

from __future__ import annotations

import contract
from contract import RequestRecord, ServerEvent
from contract.records import column_types

META_FILE = "meta.json"
# What the gates wrote (gates/verdict.py, Verdict.to_dict): status, exit_code, score,
# run_problems, notes (among them which profile the run was judged by, when not its own
# snapshot), gates_file, fail_score_below, profile ({"kind", "source": "meta.json" or the
# profile file}), and per gate its result (status, value, interval, n_samples, evidence, ...)
# with `spec`: the gate as it judged (GateSpec.resolved: params over the metric's defaults),
# which reports draw its charts with and `kvgate report --current-profiles` judges again by.
VERDICT_FILE = "verdict.json"
JUNIT_FILE = "junit.xml"

REQUESTS = "requests"
SERVER_EVENTS = "server_events"
SAMPLES = "samples"
FAULTS = "faults"
TABLES = (REQUESTS, SERVER_EVENTS, SAMPLES, FAULTS)

# One row per request the load generator sent (exactly one, whatever its ending), and the
# server's per-request events as collected from /debug/events (plus the replica lifecycle rows
# the harness observes): their columns and types are the contract's record dataclasses.
REQUEST_COLUMNS = contract.REQUEST_COLUMNS
SERVER_EVENT_COLUMNS = contract.SERVER_EVENT_COLUMNS

# Time series in long form: one row per (time, source, target, metric, labels) value.
SAMPLE_COLUMNS = (
    "t",  # float epoch s
    "source",  # nvml | prometheus | sim_gpu | process | harness
    "target",  # gpu index, replica id, "gateway", or a PID
    "metric",  # DCGM field name for NVML (DCGM_FI_DEV_FB_USED ...), metric name otherwise
    "labels",  # str: canonical "k=v,k=v" sorted by key, "" when none
    "value",  # float
)

FAULT_COLUMNS = (
    "fault_id",  # str
    "kind",  # the plan's fault kind (harness/faults/kinds/: one module each)
    # What the fault did to its target, as its kind declares it: one of contract.FaultEffect
    # (`none` when its action did not complete: a command that exited non-zero killed
    # nothing). The gates read this, never `kind`. Runs written before the column existed
    # have none; gates/legacy.py derives it for them from kind and params.
    "effect",
    "target",  # replica id, or a signal/command fault's `target` (pid:N, ...), or "proxy"
    "pid",  # int | None
    "t_start",  # float epoch s
    "t_end",  # float | None: when the rollback finished
    "params",  # str: JSON of the fault's parameters, plus what it learned (exit codes, ...)
    "outcome",  # ok | failed: <why>
    "rollback",  # str: what the rollback did (restarted, resumed, ...)
)

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    REQUESTS: REQUEST_COLUMNS,
    SERVER_EVENTS: SERVER_EVENT_COLUMNS,
    SAMPLES: SAMPLE_COLUMNS,
    FAULTS: FAULT_COLUMNS,
}

# Text columns that name one of a few values (a class, a tenant, an outcome, a metric), read
# as pandas categoricals: each row holds a small integer code, so comparing, selecting and
# grouping millions of rows is integer work instead of string work, and the text of each
# value is stored once. Their categories are kept in sorted order, so sorting and grouping
# by one orders its values as the text would. Request ids, prompt blocks and the faults'
# few rows stay plain text.
CATEGORY_COLUMNS: dict[str, frozenset[str]] = {
    REQUESTS: frozenset(
        {
            "traffic_class",
            "tenant",
            "priority",
            "api_key_name",
            "replica",
            "worker",
            "outcome",
            "error_code",
            "error_message",
            "finish_reason",
            "asked_priority",
            "probe",
            "probe_group",
        }
    ),
    SERVER_EVENTS: frozenset({"replica", "tenant", "priority", "event", "reason"}),
    SAMPLES: frozenset({"source", "target", "metric", "labels"}),
    FAULTS: frozenset(),
}


def _typed(kind: type) -> frozenset[str]:
    """The columns of the contract's records whose annotation stores `kind`."""
    return frozenset(
        name
        for record in (RequestRecord, ServerEvent)
        for name, stored in column_types(record).items()
        if stored is kind
    )


# Column types, so Parquet types never depend on the data and writer and readers agree;
# every other column is text. The records' come from their annotations; the other tables'
# number columns are named here.
INT_COLUMNS = _typed(int) | {"pid"}
FLOAT_COLUMNS = _typed(float) | {"t", "value", "t_start", "t_end"}
if INT_COLUMNS & FLOAT_COLUMNS:
    raise TypeError(
        f"columns {sorted(INT_COLUMNS & FLOAT_COLUMNS)} are int in one table and "
        "float in another; give each name one type"
    )

# meta.json's fields and their types are contract.runmeta.RunMeta: the harness builds one and
# writes its dump, the reader (gates/rundir.py) checks what it reads against it. These are the
# fields every run the harness writes has from its first write on.
META_KEYS = (
    "plan",
    "target",
    "target_profile",
    "harness_version",
    "t_start",
    "t_end",
    "cpu_warning",
    "windows",
)

# Files the reports write into the run directory (rollback files go to the candidate run).
REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"
REPORT_JSON = "report.json"
ROLLBACK_MD = "rollback.md"
ROLLBACK_JSON = "rollback.json"
# What `kvgate export` writes into the run directory unless given another file.
MOONCAKE_TRACE = "mooncake_trace.jsonl"
LLMD_REPORT = "llmd_benchmark_report.yaml"
