"""Socket actors, node agents and the gRPC link server: the rack's data plane (next issue)."""
