"""Fault injectors (Chaos Toolkit style: each fault has a rollback that runs in finally).

Faults run as greenlets in the Locust process; every wait is cooperative (gevent's patched
sockets for HTTP, polls with gevent sleeps for commands, a thread for the process scan), so
the users keep running. Each kind is one module of `kinds/`, which registers itself and
declares what the fault does to its target (`contract.FaultEffect`); `registry` finds them:

- kinds/replica: kill, pause, kill_during_storm, through the reference gateway's admin API;
- kinds/signal: a signal to any process (pid, pidfile or command line), CONT or a restart after;
- kinds/command: the user's shell command and its rollback command;
- kinds/network: a toxic on kvgate's proxy between the load generator and the target.

The rest is what the kinds share: `base` (the spec, action and record types), `scheduler`
(fires them and journals each in the faults table), `admin` (the reference gateway's admin
API), `proxy` (kvgate's proxy in the traffic's path) and `shell` (the user's commands). This
package imports none of them itself: the plan loads the registry before Locust patches
sockets, and the scheduler needs pandas and pyarrow.
"""
