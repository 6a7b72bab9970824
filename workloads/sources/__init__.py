"""Traffic sources beside the traffic classes: a production trace replayed open loop.

`TRACE_FORMATS` maps a format's name to its reader. Nothing lists the formats: importing
this package imports every module of it, and each reader registers itself with
`@trace_format` (registry.py), so a new format is one module here.
"""

from __future__ import annotations

import importlib
import pkgutil

from workloads.sources.registry import TRACE_FORMATS, TraceReader, trace_format

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["TRACE_FORMATS", "TraceReader", "trace_format"]
