"""Following a JSON-lines file another process appends to: the live tables of a run (the live
page reads them) and a managed vLLM's scheduler recorder (the sampler reads it). Standard
library only, so that tools/vllm_setup.py can load what imports it by path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class JsonlTail:
    """Follows a JSON-lines file another process appends to. Invariant: `offset` is the byte
    just past the last complete line returned; a partial last line waits for the next poll.
    A file not there yet reads as empty; one shorter than `offset` (replaced) is read anew."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.bad_lines = 0  # complete lines that were not a JSON object (a writer's crash)

    def poll(self) -> list[dict[str, Any]]:
        """The objects of the lines completed since the last poll."""
        try:
            with self.path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.offset:
                    self.offset = 0
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                obj = json.loads(line) if line.strip() else None
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                rows.append(obj)
            elif line.strip():
                self.bad_lines += 1
        return rows
