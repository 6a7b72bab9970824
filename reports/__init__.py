"""Reports: HTML, Markdown and JSON from a run directory and its verdict; rollback decisions.

`write_reports` loads lazily so importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["write_reports"]


def __getattr__(name: str) -> Any:
    if name != "write_reports":
        raise AttributeError(f"module 'reports' has no attribute {name!r}")
    from reports.build import write_reports

    return write_reports
