"""The benchmarks: `kvgate bench NAME`, each a module here, all run through `base.run`.

- server: one replica's token events per second and step lag; `--hostile` (hostile.py)
  hostile input against a deployment; `--release` (release.py) release after cancels and
  kills;
- client: our streaming client against Locust's, each variant in its own process
  (client_worker.py), against the replica and a control server (client_control.py);
- analysis: gates and reports over a large synthetic run directory;
- proxy: what the network fault proxy's toxics do to a connection;
- verdicts: one plan run N times, the distribution of its verdicts.

Each measures from outside, as kvgate does any target: the reference server is started as a
process and spoken to over HTTP. `kvgate bench scheduler` is the one that lives elsewhere
(server/scheduler/bench.py): it times the scheduler's own functions, which only the server
may import, so it runs as a process of the server's.
"""
