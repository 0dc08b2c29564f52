"""The control-plane edge: the `rdu` CLI, gRPC servicers and clients, proto<->domain
conversion, process entrypoints and benchmarks."""
