"""Transport security and access control, shared by every gRPC server of the rack.

Below both the gRPC edge (`api`: the orchestrator's and node agents' servers, the
clients) and `node_agent` (the sockets' link servers), so either may use it:
certificates (certs.py), TLS credentials and the rack-membership check (tls.py), request
guards (guard.py) and bearer tokens with tenants (auth.py). It imports neither of them,
nor Ray or generated code.
"""
