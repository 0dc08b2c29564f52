"""The Python client of a running rack: the connection to its orchestrator (address,
TLS, token) and what a failed call tells a user; clients of its job, rack-status and
admin services; and the training-loop entry point."""
