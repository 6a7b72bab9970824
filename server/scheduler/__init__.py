"""The shipped KV-cache scheduler: admission, quotas, pressure ladder, eviction, prefix sharing."""
