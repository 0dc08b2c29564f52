"""One training rank inside a socket actor.

The built-in DDP loops: the torch.distributed-style process group over the socket's
links (`backend`), the model whose passes take the timing model's time on the socket's
emulated clock (`timed`), the job loop that runs a rank in segments of steps (`runner`),
the spans it leaves (`recorder` gathers them, `spans` holds their types and bound), and
what a rank needs of its socket (`host`).

A torchrun-style script or a client's function (`script`): torch.distributed's "rdu"
backend over the links (`process_group`), its operators priced on the emulated clock
(`script_time`), its tensors held on the socket's memory (`script_memory`), and the
article's mistakes looked for as it runs (`script_checks`).

Only `spans` is imported where a socket starts; the rest loads the training stack
(workloads/training/, torch), which a socket imports only when a job trains
(node_agent/socket.py, `Socket.train`).
"""
