"""The gates README's table of gates per target, checked cell by cell against what decides
it: each built-in gate's `needs`, each server profile, and gates/applicability.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gates
from contract import servers
from gates import applicability
from gates.applicability import not_applicable
from gates.rundir import RunData, load_run
from gates.spec import load_gate_file
from tests.gates.builder import RunBuilder

README = Path(gates.__file__).with_name("README.md")
CLIENT_ONLY = "client records"  # the needs cell of a gate that reads nothing else


def readme_targets() -> tuple[list[str], dict[str, dict[str, str]]]:
    """The gates README's table of gates per target: its target columns, and each gate's
    cells by column."""
    text = README.read_text()
    start = text.index("\n## Gates per target\n")
    section = text[start : text.index("\n## ", start + 1)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:2] == ["gate", "needs"]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        (name,) = re.findall(r"`([a-z0-9_]+)`", cells["gate"])
        assert name not in rows, f"{name} appears twice in the README's gates-per-target table"
        rows[name] = cells
    return header[2:], rows


def run_of(tmp_path: Path, kind: str) -> RunData:
    """A run against a `kind` server, judged by today's profile of it, whose tables show
    no data of any kind."""
    b = RunBuilder()
    b.meta["target"] = {"kind": kind, "model": "m"}
    return load_run(b.write(tmp_path / kind))


def test_the_table_has_a_column_per_profile_and_a_row_per_built_in_gate() -> None:
    targets, rows = readme_targets()
    assert sorted(targets) == sorted(servers.kinds())
    assert list(rows) == [g.id for g in load_gate_file().gates]


def test_each_gates_needs_are_the_gate_files() -> None:
    _, rows = readme_targets()
    for spec in load_gate_file().gates:
        shown = rows[spec.id]["needs"]
        if not spec.needs:
            assert shown.startswith(CLIENT_ONLY), spec.id
            continue
        said = ", ".join(" or ".join(k.replace("_", " ") for k in n.split("|")) for n in spec.needs)
        assert shown.lower() == said, spec.id


@pytest.mark.parametrize("kind", servers.kinds())
def test_each_cell_says_what_applicability_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """`yes`: the profile gives what the gate needs, so it applies to any run of the target.
    `N/A: why`: the profile lacks it, so the gate is N/A whatever the run shows, and `why`
    is in the reason the verdict gives. Anything else (a plain N/A, or the condition under
    which a run shows the data): the profile does not give it, so the gate applies exactly
    when the run's tables show it."""
    _, rows = readme_targets()
    specs = load_gate_file().gates
    bare = run_of(tmp_path / "bare", kind)
    without = {spec.id: not_applicable(bare, spec.needs) for spec in specs}
    for seen in servers.DATA_KINDS:  # now a run whose tables show every kind of data
        monkeypatch.setitem(applicability.SEEN, seen, lambda run: True)
    full = run_of(tmp_path / "full", kind)
    for spec in specs:
        cell = rows[spec.id][kind]
        where = f"{spec.id} on {kind}: {cell!r}"
        shown = not_applicable(full, spec.needs)
        if without[spec.id] is None:
            assert cell == "yes", f"{where}: it applies to every run of this target"
        elif shown is not None:
            assert cell.startswith("N/A: "), f"{where}: N/A whatever a run shows ({shown})"
            assert cell.removeprefix("N/A: ").lower() in shown.lower(), f"{where}: {shown}"
        else:
            assert cell != "yes" and not cell.startswith("N/A: "), (
                f"{where}: its profile does not give it, so it applies only to a run that shows it"
            )
