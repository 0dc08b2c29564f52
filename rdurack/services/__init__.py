"""The control-plane edge: the `rdu` CLI and benchmarks; gRPC servicers and clients later."""
