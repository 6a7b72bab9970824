"""GPU memory sampler: NVML (`nvidia-ml-py`) when a GPU is there, else the simulated GPU.

Rows use the DCGM field names (DCGM_FI_DEV_FB_USED, ..._FREE, ..._TOTAL, ..._RESERVED,
DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL) and DCGM's units (framebuffer in MiB,
utilisation in percent), so a run on a real GPU and one read from DCGM compare directly.
Per-process memory of the target's PIDs is `nvml_process_used_gpu_memory_mib` (DCGM has no
per-process field). Without NVML the sampler says so once and reads each reference replica's
virtual GPU (`GET /debug/gpu`) under source `sim_gpu`, with the same field names (plus
`sim_gpu_used_mib{category}`, the breakdown the simulator reports).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from harness.samplers.http import Response, request
from harness.samplers.prometheus import Endpoint, Row, error_row

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def _row(t: float, source: str, target: str, metric: str, value: float, labels: str = "") -> Row:
    return {
        "t": t,
        "source": source,
        "target": target,
        "metric": metric,
        "labels": labels,
        "value": value,
    }


def load_pynvml() -> ModuleType | None:
    """pynvml, initialised; None (logged once by the caller) when there is no usable NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... all mean "no GPU here"
        return None
    module: ModuleType = pynvml  # pynvml publishes no types: to mypy it is Any
    return module


def describe_gpus(nvml: ModuleType | None) -> list[dict[str, Any]]:
    """Name and memory of each device, for meta.json (empty without NVML)."""
    if nvml is None:
        return []
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        devices.append(
            {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_total_mib": memory.total / MIB,
            }
        )
    return devices


class NvmlSampler:
    """Samples every NVML device; falls back to the simulated GPU when NVML is unavailable.

    Invariant: exactly one of `nvml` (an initialised pynvml module) or the fallback is used
    for the whole run, and the fallback is announced once (log line plus one
    `nvml_unavailable` sample), not on every tick.
    """

    def __init__(
        self,
        nvml: ModuleType | None,
        pids: Callable[[], set[int]],
        sim_endpoints: Callable[[], list[Endpoint]],
        fetch: Callable[..., Response] = request,
        token: str | None = None,  # the bearer key for /debug/gpu (the admin key)
    ) -> None:
        self.nvml = nvml
        self._pids = pids
        self._sim_endpoints = sim_endpoints
        self._fetch = fetch
        self._token = token
        self._announced = False
        self._v2_supported = True

    @property
    def source(self) -> str:
        return "nvml" if self.nvml is not None else "sim_gpu"

    def sample(self) -> list[Row]:
        if self.nvml is not None:
            return self._sample_nvml(self.nvml)
        rows: list[Row] = []
        if not self._announced:
            if self._sim_endpoints():
                log.warning("NVML is unavailable; sampling the reference replicas' simulated GPU")
            else:
                log.warning(
                    "NVML is unavailable and the target has no simulated GPU: no GPU memory"
                )
            rows.append(_row(time.time(), "nvml", "host", "nvml_unavailable", 1.0))
            self._announced = True
        return rows + self._sample_sim()

    def _memory(self, nvml: ModuleType, handle: Any) -> tuple[Any, float | None]:
        if self._v2_supported and hasattr(nvml, "nvmlMemory_v2"):
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                return info, float(info.reserved) / MIB
            except nvml.NVMLError:
                self._v2_supported = False  # older driver: v1 has no reserved field
        return nvml.nvmlDeviceGetMemoryInfo(handle), None

    def _sample_nvml(self, nvml: ModuleType) -> list[Row]:
        rows: list[Row] = []
        watched = self._pids()
        for index in range(nvml.nvmlDeviceGetCount()):
            t = time.time()
            gpu = str(index)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                info, reserved = self._memory(nvml, handle)
                rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_FB_TOTAL", info.total / MIB))
                rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_FB_USED", info.used / MIB))
                rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_FB_FREE", info.free / MIB))
                if reserved is not None:
                    rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_FB_RESERVED", reserved))
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_GPU_UTIL", float(util.gpu)))
                rows.append(_row(t, "nvml", gpu, "DCGM_FI_DEV_MEM_COPY_UTIL", float(util.memory)))
                rows.extend(self._processes(nvml, handle, t, gpu, watched))
            except nvml.NVMLError as exc:
                rows.append(error_row(t, "nvml", gpu, "nvml_error", str(exc)))
        return rows

    def _processes(
        self, nvml: ModuleType, handle: Any, t: float, gpu: str, watched: set[int]
    ) -> list[Row]:
        rows: list[Row] = []
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if proc.pid in watched and used is not None:
                metric = "nvml_process_used_gpu_memory_mib"
                rows.append(_row(t, "nvml", str(proc.pid), metric, used / MIB, f"gpu={gpu}"))
        return rows

    def _sample_sim(self) -> list[Row]:
        rows: list[Row] = []
        for endpoint in self._sim_endpoints():
            t = time.time()
            try:
                resp = self._fetch(endpoint.url.rstrip("/") + "/debug/gpu", token=self._token)
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                gpu = resp.json()
                total, used = float(gpu["total_bytes"]), float(gpu["used_bytes"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                rows.append(error_row(t, "sim_gpu", endpoint.name, "sim_gpu_error", str(exc)))
                continue
            name = endpoint.name
            rows.append(_row(t, "sim_gpu", name, "DCGM_FI_DEV_FB_TOTAL", total / MIB))
            rows.append(_row(t, "sim_gpu", name, "DCGM_FI_DEV_FB_USED", used / MIB))
            rows.append(_row(t, "sim_gpu", name, "DCGM_FI_DEV_FB_FREE", (total - used) / MIB))
            for category, value in (gpu.get("by_category") or {}).items():
                labels = f"category={category}"
                rows.append(_row(t, "sim_gpu", name, "sim_gpu_used_mib", value / MIB, labels))
        return rows
