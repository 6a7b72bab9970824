"""The system under test: the shipped KV-cache scheduler and the reference GPU server."""
