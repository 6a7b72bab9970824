"""Know the sample size before the load: what each gate needs to PASS on a healthy system,
and what a plan's load is expected to give it (`kvgate plan check`, and `kvgate run` before
it starts anything). harness/README.md, "How long must a run be?", explains the figures.
"""

from harness.sampleplan.calibrate import CalibrationError, Measured, measure
from harness.sampleplan.report import (
    LoadTooShort,
    SamplePlan,
    announce,
    compact,
    sample_plan,
    table,
)

__all__ = [
    "CalibrationError",
    "LoadTooShort",
    "Measured",
    "SamplePlan",
    "announce",
    "compact",
    "measure",
    "sample_plan",
    "table",
]
