"""The gates have teeth: the same plan judged under `seed` and under `naive`, end to end.

One replica, long-context traffic from eight teams whose 32K-token prompts together need
more KV than the virtual GPU holds. `seed` must keep the replica alive (explicit rejections
instead); `naive` must run it out of memory, fail the zero-OOM gate, and `kvgate compare`
of the two runs must decide ROLLBACK to the seed baseline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.rundir import load_run
from reports.compare_cmd import main as compare_main
from tests.harness.test_run_e2e import ROOT, kvgate_run

TEETH = ROOT / "tests" / "harness" / "plans" / "teeth.yaml"
EXIT_FAIL = 3


def gate_status(run_dir: Path) -> dict[str, str]:
    verdict = json.loads((run_dir / "verdict.json").read_text())
    return {g["id"]: g["status"] for g in verdict["gates"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    out: dict[str, tuple[int, Path]] = {}
    for policy in ("seed", "naive"):
        run_dir = tmp_path_factory.mktemp(policy) / "run"
        proc = kvgate_run(
            str(TEETH), "--out", str(run_dir), "--set", f"target.policy={policy}", timeout=150
        )
        assert (run_dir / "verdict.json").exists(), proc.stdout + proc.stderr
        out[policy] = (proc.returncode, run_dir)
    return out


@pytest.mark.e2e
def test_seed_survives_the_long_context_flood(runs: dict[str, tuple[int, Path]]) -> None:
    _, run_dir = runs["seed"]
    status = gate_status(run_dir)
    assert status["no_oom"] == "PASS"
    assert status["tenant_share_cap"] == "PASS"
    assert status["cancel_release_p99"] == "PASS"
    requests = load_run(run_dir).requests
    refused = requests[requests["outcome"] == "rejected"]
    assert len(refused) > 0, "seed must refuse some of the flood explicitly"
    assert refused["http_status"].isin([429, 503]).all()
    assert (refused["retry_after_s"] > 0).all()


@pytest.mark.e2e
def test_naive_runs_out_of_memory_and_fails(runs: dict[str, tuple[int, Path]]) -> None:
    code, run_dir = runs["naive"]
    assert gate_status(run_dir)["no_oom"] == "FAIL"
    assert code == EXIT_FAIL
    summary = (run_dir / "summary.md").read_text()
    assert "FAIL" in summary and "OOM" in summary


@pytest.mark.e2e
def test_compare_naive_against_seed_says_rollback(
    runs: dict[str, tuple[int, Path]], tmp_path: Path
) -> None:
    code = compare_main([str(runs["naive"][1]), str(runs["seed"][1]), "--out", str(tmp_path)])
    assert code == EXIT_FAIL
    decision = json.loads((tmp_path / "rollback.json").read_text())
    assert decision["decision"] == "ROLLBACK"
    seed_meta = json.loads((runs["seed"][1] / "meta.json").read_text())
    assert decision["rollback_to"] == seed_meta["target"]["scheduler_config_digest"]
