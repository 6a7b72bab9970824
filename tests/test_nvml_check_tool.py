"""tools/nvml_check.py's verdict on made-up NVML readings, and its answer on a machine
without a GPU (its real use is on one: the README's GPU section has the figures)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_check", ROOT / "tools" / "nvml_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
TOTAL = 143_771.0


def reading(used: float, reserved: float = 500.0) -> dict[str, float]:
    return {
        "DCGM_FI_DEV_FB_TOTAL": TOTAL,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_FREE": TOTAL - used - reserved,
        "DCGM_FI_DEV_FB_RESERVED": reserved,
    }


def own(pid: int, mib: float) -> list[dict[str, Any]]:
    return [{"metric": "nvml_process_used_gpu_memory_mib", "target": str(pid), "value": mib}]


class NoDevices:
    @staticmethod
    def nvmlDeviceGetCount() -> int:
        return 0


def test_an_allocation_seen_rising_and_falling_passes_every_check() -> None:
    code, report = TOOL.judge(
        8.0, reading(600), reading(600 + 8192 + 480), reading(610), own(7, 8672), 7, NoDevices
    )
    assert code == 0 and report["failed"] == []
    assert report["checks"] == {"framebuffer": True, "rise": True, "fall": True, "process": True}


@pytest.mark.parametrize(
    ("during", "after", "failed"),
    [
        (600 + 4096, 600, ["rise"]),  # NVML saw half of what was held
        (600 + 8192 + 2048, 600, ["rise"]),  # more than the allocation and a context
        (600 + 8192 + 480, 600 + 8192, ["fall"]),  # the memory never came back
    ],
)
def test_a_reading_the_gates_could_not_trust_fails_its_check(
    during: float, after: float, failed: list[str]
) -> None:
    code, report = TOOL.judge(
        8.0, reading(600), reading(during), reading(after), own(7, 8672), 7, NoDevices
    )
    assert code == 1 and report["failed"] == failed


def test_a_small_allocation_carries_the_whole_context_on_top() -> None:
    """PyTorch's context on an H200 took 0.6 GiB beside each of 2, 8 and 64 GiB."""
    code, report = TOOL.judge(
        2.0, reading(0), reading(2048 + 619), reading(0), own(7, 2658), 7, NoDevices
    )
    assert code == 0 and report["failed"] == []


def test_a_child_nvml_cannot_see_is_reported_not_failed() -> None:
    code, report = TOOL.judge(8.0, reading(600), reading(9272), reading(600), [], 7, NoDevices)
    assert code == 0 and report["checks"]["process"] is None


def test_without_nvml_it_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(TOOL, "load_pynvml", lambda: None)
    assert TOOL.main([]) == 2
    assert "no usable NVML here" in capsys.readouterr().out
