"""meta.json from the run's first write: the server profile the run uses, kept for whoever
judges the run later."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console

from contract import servers
from gates import run_profile, schema
from gates.rundir import load_run
from harness import orchestrator as orchestrator_module
from harness.live.console import Progress
from harness.loadgen import Distribution
from harness.orchestrator import Orchestrator
from harness.plan import load_plan
from harness.release_probe import ProbeSpec
from harness.target import RunningTarget
from workloads.block_ids import BLOCK_TOKENS

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"


def test_meta_json_keeps_the_profile_from_the_start_of_the_run(tmp_path: Path) -> None:
    plan = load_plan(PLANS / "external.yaml", ["target.kind=vllm"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    orchestrator = Orchestrator(plan, run_dir, Distribution(), Console(file=io.StringIO()))
    orchestrator._write_meta("running")  # what run() writes before it starts the target
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["target"]["kind"] == "vllm"  # the profile's kind, not the target type
    assert meta[run_profile.SNAPSHOT_KEY] == run_profile.snapshot(servers.profile("vllm"))
    run = load_run(run_dir)
    assert run.profile == servers.profile("vllm") and run.profile_source == "meta.json"
    assert run.profile_note is None


def test_the_release_probe_asks_for_its_output_allowance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe on an external vLLM: its requests carry the probe's max_tokens, a number."""
    plan = load_plan(PLANS / "external.yaml", ["target.kind=vllm", "target.model=m"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    console = Console(file=io.StringIO())
    orchestrator = Orchestrator(plan, run_dir, Distribution(), console)
    orchestrator.target = RunningTarget(base_url="http://127.0.0.1:9", kind="vllm")
    orchestrator.progress = Progress(
        console, orchestrator.sink, run_dir / "samples", 1.0, lambda: 0, lambda: ""
    )
    specs: list[ProbeSpec] = []

    def run_probes(spec: ProbeSpec, count: int) -> list[dict[str, object]]:
        specs.append(spec)
        return []

    monkeypatch.setattr(orchestrator_module, "run_probes", run_probes)
    orchestrator._release_probe()
    assert len(specs) == 1
    assert specs[0].max_tokens == 256
    assert specs[0].model == "m"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("target_meta", {"kind": "vllm", "replicas": 2}, "target.replicas"),
        ("target_meta", {"kind": "vllm", "modell": "m"}, "target"),  # misspelt
        ("aborted", {"gate": "no_oom", "at_s": "soon", "message": "m"}, "aborted.at_s"),
        ("gpus", [{"index": 0, "name": "H100", "memory": 81559}], "gpus.0"),
    ],
)
def test_a_meta_field_it_does_not_name_or_of_the_wrong_type_fails_when_written(
    tmp_path: Path, field: str, value: object, named: str
) -> None:
    """meta.json is built as contract.runmeta.RunMeta: a wrong value fails the writer, and
    nothing is written that a reader would refuse a week later."""
    plan = load_plan(PLANS / "external.yaml", ["target.kind=vllm"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    orchestrator = Orchestrator(plan, run_dir, Distribution(), Console(file=io.StringIO()))
    setattr(orchestrator, field, value)
    with pytest.raises(ValidationError) as caught:
        orchestrator._write_meta("completed")
    assert named in {".".join(map(str, e["loc"])) for e in caught.value.errors()}
    assert not (run_dir / schema.META_FILE).exists()


def test_meta_json_gives_the_block_size_once_a_record_carries_blocks(tmp_path: Path) -> None:
    plan = load_plan(PLANS / "external.yaml", ["target.kind=vllm"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    orchestrator = Orchestrator(plan, run_dir, Distribution(), Console(file=io.StringIO()))
    orchestrator._write_meta("running")
    assert "prompt_block_tokens" not in json.loads((run_dir / schema.META_FILE).read_text())
    row = dict.fromkeys(schema.REQUEST_COLUMNS) | {"request_id": "a", "prompt_blocks": "1f 2e"}
    orchestrator.sink.add(row)
    orchestrator._write_meta("running")
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["prompt_block_tokens"] == BLOCK_TOKENS == 512
