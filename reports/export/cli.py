"""`kvgate export RUN_DIR --format mooncake|llmd [--out FILE]`: a run's requests as a trace
to replay (Mooncake JSONL) or its performance as an llm-d Benchmark Report.

Writes FILE (default: `mooncake_trace.jsonl` or `llmd_benchmark_report.yaml` in the run
directory; an llm-d report whose name ends in `.json` is JSON) through a temporary file
beside it, so an export cut short leaves no half file. Prints what it wrote and what it left
out, with counts. Exit codes: 0 written; 2 bad input (arguments, run directory, a run with
no request to export, an output that cannot be written); 1 a report the llm-d package
refuses (a bug of kvgate's mapping).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO, TypeVar

from llmd_benchmark_report.schema_v0_2 import VERSION as LLMD_VERSION

from contract.runmeta import RunMeta
from contract.trace import MOONCAKE_BLOCK_TOKENS
from gates import schema
from gates.rundir import RunDirError, read_meta, unwritable
from reports.cli import Parser, parse
from reports.export import columns, llmd, mooncake

EXIT_USAGE: Final = 2
EXIT_INTERNAL: Final = 1
FORMATS: Final = {"mooncake": schema.MOONCAKE_TRACE, "llmd": schema.LLMD_REPORT}
PROG: Final = "kvgate export"
T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog=PROG, description="Export a run's requests in another tool's format.")
    parser.add_argument("run_dir", type=Path, help="the run directory `kvgate run` wrote")
    parser.add_argument(
        "--format",
        required=True,
        choices=sorted(FORMATS),
        help="mooncake: a trace of the requests sent, to replay; llmd: the llm-d Benchmark "
        "Report (v0.2.1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the file to write (default: in the run directory, "
        + ", ".join(f"{name} for {fmt}" for fmt, name in FORMATS.items())
        + "); an llm-d report named *.json is written as JSON, else YAML",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    out: Path = args.out or args.run_dir / FORMATS[args.format]
    try:
        meta = _read_run(args.run_dir)
        _check_out(out)
        lines = _export(args.format, args.run_dir, meta, out)
    except (RunDirError, OutputError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except columns.NothingToExport as exc:
        print(f"{PROG}: nothing written: {args.run_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the reader turns its own OSErrors into RunDirError: this is a write
        print(f"{PROG}: {unwritable(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except llmd.ReportInvalid as exc:
        print(
            f"{PROG}: the llm-d package refused the report kvgate built, so nothing was "
            f"written; this is a kvgate bug, please report it with this message: {exc}",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    for line in lines:
        print(f"{PROG}: {line}")
    return 0


class OutputError(Exception):
    """An output path that cannot be a file."""


def _read_run(run_dir: Path) -> RunMeta:
    if not run_dir.exists():
        raise RunDirError(f"run directory {run_dir} does not exist; pass one `kvgate run` made")
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory; pass one `kvgate run` made")
    return RunMeta.read(read_meta(run_dir))


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise OutputError(f"--out {out} is a directory; give the name of the file to write")
    if not out.parent.is_dir():
        raise OutputError(f"--out {out}: its directory {out.parent} does not exist; create it")


def _export(fmt: str, run_dir: Path, meta: RunMeta, out: Path) -> list[str]:
    aside = columns.set_aside(run_dir)
    if fmt == "mooncake":
        lines = _write(out, lambda f: _mooncake(run_dir, meta, f, out))
    else:
        lines = _llmd(run_dir, meta, out)
    if aside:
        lines.append(
            f"not read, set aside as damaged: {', '.join(aside)} (their requests are missing)"
        )
    return lines


def _write(out: Path, write: Callable[[TextIO], T]) -> T:
    """Runs `write` on a temporary file beside `out`, then puts it in `out`'s place."""
    part = out.with_name(f".{out.name}.part")
    try:
        with part.open("w", encoding="utf-8") as f:
            result = write(f)
        os.replace(part, out)
    except OSError as exc:  # named as the file asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(out)) from exc
    finally:
        if part.is_file():  # an export cut short; anything else in the way is not ours
            part.unlink()
    return result


def _progress(written: int, total: int) -> None:
    print(f"{PROG}: {written:,} of {total:,} requests written", file=sys.stderr, flush=True)


def _mooncake(run_dir: Path, meta: RunMeta, f: TextIO, out: Path) -> list[str]:
    done = mooncake.export_mooncake(run_dir, meta.prompt_block_tokens, f, _progress)
    repeats = done.blocks - done.distinct_blocks
    lines = [
        f"wrote {out} (Mooncake JSONL): {done.written:,} of the run's {done.requests:,} "
        f"requests, {done.blocks:,} hash_ids in blocks of {done.block_tokens} tokens, "
        f"{repeats:,} of them ({repeats / max(done.blocks, 1):.1%}) repeating an earlier block"
    ]
    lines += [f"left out {n:,} {reason}" for reason, n in done.left_out.items()]
    if done.without_blocks:
        lines.append(
            f"{done.without_blocks:,} requests recorded no prompt blocks (a run from before "
            "kvgate recorded them): written with ids of their own, shared with nothing"
        )
    if done.mismatched_blocks:
        lines.append(
            f"{done.mismatched_blocks:,} requests recorded blocks that do not cover their input "
            f"at {done.block_tokens} tokens a block: written with ids of their own"
        )
    if done.block_tokens != MOONCAKE_BLOCK_TOKENS:
        lines.append(
            f"its hash_ids are blocks of {done.block_tokens} tokens, not Mooncake's "
            f"{MOONCAKE_BLOCK_TOKENS}: give that block size to whatever reads it"
        )
    return lines


def _llmd(run_dir: Path, meta: RunMeta, out: Path) -> list[str]:
    requests = columns.read_columns(run_dir, llmd.COLUMNS)
    if not requests.num_rows:
        raise columns.NothingToExport(columns.NO_REQUESTS)
    report = llmd.build_report(meta, requests)
    text = report.get_json_str() if out.suffix.lower() == ".json" else report.get_yaml_str()
    _write(out, lambda f: f.write(text))
    counts = report.dump()["results"]["request_performance"]["aggregate"]["requests"]
    return [
        f"wrote {out} (llm-d Benchmark Report {LLMD_VERSION}, validated by "
        f"llmd-benchmark-report): {counts['total']:,} requests, {counts['failures']:,} "
        f"refused or failed, {counts['incomplete']:,} cancelled by the client"
    ]
