"""The GPU memory sampler: NVML with pynvml replaced by fakes, and its simulated-GPU fallback."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from harness.samplers import nvml as nvml_mod
from harness.samplers.http import Response
from harness.samplers.nvml import MIB, NvmlSampler, load_pynvml
from harness.samplers.prometheus import Endpoint


class FakeNVMLError(Exception):
    pass


def fake_pynvml(v2: bool = True) -> Any:
    def memory_info(handle: int, version: int | None = None) -> Any:
        if version is not None:
            if not v2:
                raise FakeNVMLError("Not Supported")
            return SimpleNamespace(
                total=80 * 1024 * MIB, used=10 * MIB, free=70 * MIB, reserved=5 * MIB
            )
        return SimpleNamespace(total=80 * 1024 * MIB, used=10 * MIB, free=70 * MIB)

    procs = [
        SimpleNamespace(pid=111, usedGpuMemory=6 * MIB),
        SimpleNamespace(pid=222, usedGpuMemory=MIB),
    ]
    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlMemory_v2=0x02000028,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=42, memory=7),
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs if h == 0 else [],
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
    )


def by_metric(rows: list[dict[str, Any]], target: str) -> dict[str, float]:
    return {
        str(r["metric"]): float(r["value"])
        for r in rows
        if r["target"] == target and not r["labels"]
    }


def no_sim() -> list[Endpoint]:
    raise AssertionError("the simulated GPU must not be read when NVML works")


def test_nvml_path_reports_dcgm_fields_per_device_and_watched_processes() -> None:
    sampler = NvmlSampler(fake_pynvml(), pids=lambda: {111}, sim_endpoints=no_sim)
    rows = sampler.sample()
    gpu0 = by_metric(rows, "0")
    assert gpu0["DCGM_FI_DEV_FB_USED"] == 10.0
    assert gpu0["DCGM_FI_DEV_FB_FREE"] == 70.0
    assert gpu0["DCGM_FI_DEV_FB_TOTAL"] == 80 * 1024
    assert gpu0["DCGM_FI_DEV_FB_RESERVED"] == 5.0
    assert gpu0["DCGM_FI_DEV_GPU_UTIL"] == 42.0
    assert "DCGM_FI_DEV_FB_USED" in by_metric(rows, "1")
    procs = [r for r in rows if r["metric"] == "nvml_process_used_gpu_memory_mib"]
    assert [(p["target"], p["value"], p["labels"]) for p in procs] == [("111", 6.0, "gpu=0")]
    assert {r["source"] for r in rows} == {"nvml"}


def test_nvml_without_v2_memory_info_drops_reserved_only() -> None:
    rows = NvmlSampler(fake_pynvml(v2=False), pids=set, sim_endpoints=no_sim).sample()
    gpu0 = by_metric(rows, "0")
    assert "DCGM_FI_DEV_FB_RESERVED" not in gpu0 and gpu0["DCGM_FI_DEV_FB_USED"] == 10.0


def test_load_pynvml_returns_none_when_the_module_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import now raises ImportError
    assert load_pynvml() is None


def test_load_pynvml_returns_none_when_nvml_cannot_initialise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pynvml

    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    assert load_pynvml() is None


def test_fallback_announces_once_and_reads_the_replicas_virtual_gpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gib = 1024 * MIB
    body = {"total_bytes": 80 * gib, "used_bytes": 20 * gib, "by_category": {"weights": 16 * gib}}

    def fetch(url: str, token: str | None = None) -> Response:
        if url.startswith("http://r1"):
            raise OSError("connection refused")
        assert url == "http://r0/debug/gpu"
        return Response(200, {}, json.dumps(body).encode())

    endpoints = [Endpoint("r0", "http://r0"), Endpoint("r1", "http://r1")]
    sampler = NvmlSampler(None, pids=set, sim_endpoints=lambda: endpoints, fetch=fetch)
    with caplog.at_level("WARNING", logger=nvml_mod.__name__):
        first, second = sampler.sample(), sampler.sample()
    assert sum("NVML is unavailable" in m for m in caplog.messages) == 1
    assert [r["metric"] for r in first].count("nvml_unavailable") == 1
    assert "nvml_unavailable" not in [r["metric"] for r in second]
    r0 = by_metric(second, "r0")
    assert r0 == {
        "DCGM_FI_DEV_FB_TOTAL": 80 * 1024.0,
        "DCGM_FI_DEV_FB_USED": 20 * 1024.0,
        "DCGM_FI_DEV_FB_FREE": 60 * 1024.0,
    }
    weights = [r for r in second if r["metric"] == "sim_gpu_used_mib"]
    assert weights[0]["labels"] == "category=weights" and weights[0]["value"] == 16 * 1024.0
    errors = [r for r in second if r["target"] == "r1"]
    labels = errors[0]["labels"]
    assert errors[0]["metric"] == "sim_gpu_error"
    assert isinstance(labels, str) and "connection refused" in labels
    assert {r["source"] for r in second} == {"sim_gpu"}
