"""One DDP rank inside a socket actor: the torch.distributed-style process group over
the socket's links (`backend`), the model whose passes take the timing model's time on
the socket's emulated clock (`timed`), the job loop that runs a rank in segments of
steps (`runner`, with a client's own training function in `user_loop`), the spans it
leaves (`recorder` gathers them, `spans` holds their types and bound), and what a rank
needs of its socket (`host`).

Only `spans` is imported where a socket starts; the rest loads the training stack
(workloads/training/), which a socket imports only when a job trains
(node_agent/socket.py, `Socket.train`).
"""
