"""Runs of runs: the same plan run many times, each as its own `kvgate run` process.

- runs: one run and its record, and the distribution of a series of them (each gate's
  statuses, values and margin in run-to-run spreads); `kvgate bench verdicts` reports it;
- findings: what a qualification found from its records: the detection matrix, each gate's
  false-alarm rate, and the exit code (pure functions);
- cli: `kvgate qualify PLAN`: the policy under test N times, then once per mutant.

qualify.html is drawn by reports/qualify.py, beside the other pages and their templates.
"""
