"""Check kvgate's GPU memory sampler against a real GPU, through NVML.

    python3 tools/nvml_check.py            # on a machine with an NVIDIA GPU and nvidia-ml-py
    python3 tools/nvml_check.py --gib 16 --json

Everywhere else kvgate's memory gates read a simulated GPU; this is the check that the NVML
path (harness/samplers/nvml.py) reads a real one as the gates expect. A child process
allocates `--gib` GiB on GPU 0 (with PyTorch, else CuPy) and frees it; the harness's own
sampler reads NVML before, while the memory is held and after, and the checks are what the
gates rely on:

- `framebuffer`: DCGM_FI_DEV_FB_USED + FREE (+ RESERVED, where the driver reports it)
  add up to FB_TOTAL, the device's memory;
- `rise`: FB_USED rises by the allocation, plus at most the CUDA context's own memory (about
  0.6 GiB with PyTorch on an H200; allowed: 1 GiB and 1% of the allocation);
- `fall`: FB_USED falls back to within 1% of the device of where it started once the child
  has exited (what memory_back_to_idle reads after a load);
- `process`: the child's own row (`nvml_process_used_gpu_memory_mib`) shows the allocation,
  where NVML can see the child's PID (a PID namespace can hide it: reported, not failed).

Exit codes: 0 every check held, 1 a check failed, 2 no GPU or nothing to allocate with.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.samplers.nvml import NvmlSampler, describe_gpus, load_pynvml

HOLD = """
import sys, time
gib = float(sys.argv[1])
n = int(gib * 2**30)
try:
    import torch
    x = torch.ones(n // 4, dtype=torch.float32, device="cuda:0")
    torch.cuda.synchronize()
except ImportError:
    import cupy
    x = cupy.ones(n // 4, dtype=cupy.float32)
    cupy.cuda.Device(0).synchronize()
print("held", flush=True)
sys.stdin.readline()
"""
CONTEXT_MIB = 1024.0  # a CUDA context's own memory, on top of what the child allocates
RISE_TOLERANCE = 0.01
FALL_TOLERANCE = 0.01
SETTLE_S = 1.0


def gpu0(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {str(r["metric"]): float(r["value"]) for r in rows if r["target"] == "0"}


def read(sampler: NvmlSampler) -> list[dict[str, Any]]:
    return [dict(r) for r in sampler.sample()]


def run(gib: float) -> tuple[int, dict[str, Any]]:
    nvml = load_pynvml()
    if nvml is None:
        return 2, {"error": "no usable NVML here (no NVIDIA driver, or nvidia-ml-py missing)"}
    holder: subprocess.Popen[str] | None = None
    watched: set[int] = set()
    sampler = NvmlSampler(nvml, lambda: watched, lambda: [])
    before = gpu0(read(sampler))
    try:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(gib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdin is not None
        if holder.stdout.readline().strip() != "held":
            err = (holder.stderr.read() if holder.stderr else "")[-800:]
            return 2, {"error": f"the child could not allocate {gib} GiB: {err}"}
        watched.add(holder.pid)
        time.sleep(SETTLE_S)
        held_rows = read(sampler)
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
    time.sleep(SETTLE_S)
    during, after = gpu0(held_rows), gpu0(read(sampler))
    return judge(gib, before, during, after, held_rows, holder.pid if holder else -1, nvml)


def judge(
    gib: float,
    before: dict[str, float],
    during: dict[str, float],
    after: dict[str, float],
    held_rows: list[dict[str, Any]],
    pid: int,
    nvml: Any,
) -> tuple[int, dict[str, Any]]:
    mib = gib * 1024
    ceiling = mib * (1 + RISE_TOLERANCE) + CONTEXT_MIB
    total = before["DCGM_FI_DEV_FB_TOTAL"]
    parts = before["DCGM_FI_DEV_FB_USED"] + before["DCGM_FI_DEV_FB_FREE"]
    parts += before.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
    rise = during["DCGM_FI_DEV_FB_USED"] - before["DCGM_FI_DEV_FB_USED"]
    fall = after["DCGM_FI_DEV_FB_USED"] - before["DCGM_FI_DEV_FB_USED"]
    own = [
        float(r["value"])
        for r in held_rows
        if r["metric"] == "nvml_process_used_gpu_memory_mib" and r["target"] == str(pid)
    ]
    checks = {
        "framebuffer": abs(parts - total) <= 0.001 * total,
        "rise": mib <= rise <= ceiling,
        "fall": abs(fall) <= FALL_TOLERANCE * total,
        "process": (mib <= own[0] <= ceiling) if own else None,
    }
    report = {
        "gpus": describe_gpus(nvml),
        "allocated_mib": mib,
        "before_used_mib": before["DCGM_FI_DEV_FB_USED"],
        "during_used_mib": during["DCGM_FI_DEV_FB_USED"],
        "after_used_mib": after["DCGM_FI_DEV_FB_USED"],
        "reserved_mib": before.get("DCGM_FI_DEV_FB_RESERVED"),
        "process_used_mib": own[0] if own else None,
        "gpu_util_percent": during.get("DCGM_FI_DEV_GPU_UTIL"),
        "checks": checks,
    }
    failed = [name for name, ok in checks.items() if ok is False]
    report["failed"] = failed
    return (1 if failed else 0), report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=8.0, help="GiB to allocate on GPU 0 (8)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.gib <= 0:
        p.error("--gib must be above 0")
    code, report = run(args.gib)
    if args.json:
        print(json.dumps(report, indent=2))
    elif "error" in report:
        print(f"nvml check: {report['error']}")
    else:
        for name, ok in report["checks"].items():
            shown = "not visible" if ok is None else ("ok" if ok else "FAILED")
            print(f"nvml check: {name}: {shown}")
        print(
            f"nvml check: used {report['before_used_mib']:.0f} -> "
            f"{report['during_used_mib']:.0f} -> {report['after_used_mib']:.0f} MiB "
            f"for {report['allocated_mib']:.0f} MiB allocated"
        )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
