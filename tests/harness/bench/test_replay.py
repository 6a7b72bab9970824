"""`kvgate bench replay`: bad options exit 2 before anything runs; a small replay gives
every figure, each sane (never how fast it is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench import replay


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main(["--rate", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_small_replay_reports_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = replay.main(["--rate", "10", "--duration-s", "3", "--out", str(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["requests"], result["sent"], result["unsent"]) == (30, 30, 0)
    assert 0 <= result["schedule_error_ms_p50"] <= result["schedule_error_ms_p99"]
    assert result["schedule_error_ms_p99"] <= result["schedule_error_ms_max"]
    assert len(result["schedule_error_ms_p99_by_tenth"]) == 10
    assert result["outcomes"] == {"ok": 30}
