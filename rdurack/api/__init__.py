"""The gRPC edge: the servicers of JobService, RackService, AdminService and
NodeAgentService, rdurack errors as gRPC status codes, the orchestrator's gateway to
node agents, the Prometheus endpoint, and the one way to build a server or a channel."""
