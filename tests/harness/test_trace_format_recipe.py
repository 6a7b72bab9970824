"""The recipe of docs/extending.md ("A trace format"): one module in workloads/sources/ is a
trace format. A plan names it, the harness replays what it reads open loop, and every
record carries its rule's traffic class, the trace's lengths and its planned send time,
with no other file touched.

The toy module is written to a temporary folder added to the package's path, as if it had
been dropped into workloads/sources/, and taken out of the registry afterwards.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import workloads.sources
from gates import schema
from gates.rundir import read_jsonl_table
from harness.loadgen import Distribution, LoadGenerator
from harness.plan import PlanError, plan_from_dict
from harness.rundir import TableWriter
from harness.sink import RecordSink
from harness.traffic import build_user_classes
from tests.workloads.fakes import fake_server
from workloads.sources import TRACE_FORMATS

pytestmark = pytest.mark.timeout(120)
TOY_MODULE = "workloads.sources.toy_lines"
TOY_FORMAT = '''
"""`toy_lines`: one request a line, "seconds input_tokens output_tokens", no blocks."""

from pathlib import Path

from contract.trace import Trace, TraceFormat, TraceRequest
from workloads.sources.registry import trace_format


@trace_format("toy_lines")
def read_toy_lines(path: Path, block_tokens: int | None) -> Trace:
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    requests = tuple(TraceRequest(float(t), int(i), int(o)) for t, i, o in rows)
    return Trace(requests, TraceFormat.AZURE, None, str(path))
'''


@pytest.fixture
def drop_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    folder = tmp_path / "sources"
    folder.mkdir()
    (folder / "toy_lines.py").write_text(TOY_FORMAT)
    monkeypatch.setattr(workloads.sources, "__path__", [*workloads.sources.__path__, str(folder)])
    yield
    TRACE_FORMATS.pop("toy_lines", None)
    sys.modules.pop(TOY_MODULE, None)


def toy_plan(trace: Path) -> dict[str, object]:
    return {
        "name": "toy",
        "seed": 3,
        "base_dir": str(trace.parent),
        "traffic": {
            "trace": {
                "path": trace.name,
                "format": "toy_lines",
                "drain_s": 1,
                "rules": [
                    {"traffic_class": "long_context", "min_input_tokens": 100},
                    {"traffic_class": "short_qa"},
                ],
            },
            "stop_timeout_s": 5,
        },
        "load": {"idle_before_s": 0, "stop_if_failing": None},
    }


def test_a_format_in_one_module_is_planned_replayed_and_recorded(
    drop_in: None, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("0.0 40 3\n0.0 120 2\n0.4 30 2\n0.9 200 4\n")
    with pytest.raises(PlanError, match=r"unknown trace format 'toy_lines'"):
        plan_from_dict(toy_plan(trace))
    importlib.import_module(TOY_MODULE)  # what importing the package does for a module in it
    plan = plan_from_dict(toy_plan(trace))
    with fake_server(tokens=2) as server:
        [replay] = build_user_classes(plan, server.url)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        writer = TableWriter(run_dir, schema.REQUESTS)
        loadgen = LoadGenerator(
            plan, [replay], None, server.url, RecordSink(writer), Distribution()
        )
        try:
            loadgen.run_load(plan.load.duration_s)
        finally:
            loadgen.close()
            writer.close()
    rows = read_jsonl_table(run_dir / f"{schema.REQUESTS}.jsonl", schema.REQUESTS).frame
    rows = rows.sort_values(["t_scheduled", "target_prompt_tokens"])
    assert list(rows["target_prompt_tokens"]) == [40, 120, 30, 200]
    assert list(rows["max_tokens"]) == [3, 2, 2, 4]
    assert list(rows["traffic_class"]) == ["short_qa", "long_context", "short_qa", "long_context"]
    offsets = (rows["t_scheduled"] - rows["t_scheduled"].min()).round(6).tolist()
    assert offsets == [0.0, 0.0, 0.4, 0.9]
    assert (rows["t_send"] >= rows["t_scheduled"]).all()  # never before its time
    assert rows["outcome"].eq("ok").all()
