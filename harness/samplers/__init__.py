"""Samplers: NVML / simulated GPU memory, Prometheus scrapes, process stats, server event logs.

They run in their own process (`harness.samplers.process`), away from Locust's gevent loop.
"""
