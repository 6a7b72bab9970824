"""A replica of the reference server: OpenAI-compatible endpoints over the scheduler and the
`sim` engine (run it with `python -m server.replica`)."""
