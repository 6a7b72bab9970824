"""The fault kinds, found by harness.faults.registry (no list to edit): a module per kind,
or per family of kinds that share their workings (replica.py: kill, pause, kill_during_storm).

A module here defines its plan entry's model (a `FaultSpec` that declares the fault's
effect) and its action, registered with `@fault_kind(Model)`; docs/extending.md has the
recipe. Every module here is imported when the plan loads, so none may import harness.plan
or start anything at import.
"""
