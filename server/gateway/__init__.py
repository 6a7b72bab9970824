"""The gateway of the reference deployment: auth, global tenant ledger, routing, relay,
replica supervision and the admin API (started by `python -m server.serve`)."""
