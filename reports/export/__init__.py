"""`kvgate export`: a run's requests in formats other tools read. Mooncake JSONL
(`mooncake.py`), a trace that replays the run's load; the llm-d Benchmark Report (`llmd.py`),
the run's performance as llm-d's tools compare it. Both read the requests table column by
column (`columns.py`), never the whole table at once."""
