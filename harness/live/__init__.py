"""What a person sees while the load runs, apart from the run's own sequence (the
orchestrator starts each, and reads back only a stop and its reason):

- console: the progress lines on the terminal (rich), a greenlet in the Locust process;
- web: the kvgate page beside Locust's web UI (`--web`), and its state as JSON;
- watch: the running evaluation in a child process: interim reports, each gate's decision
  so far by its anytime-valid bound, and the stop when a gate with `abort_on_fail` has
  clearly failed.
"""
