"""A socket's emulated timeline as the outside world sees it, in wall time: pacing
(`pacing`: with a time scale, a call returns once wall time has caught up with its
emulated time) and hardware spans (`hardware_trace`: each operation stamped at the
job's wall start plus its emulated offset). Both anchor the job's emulated time to the
wall time it reserved the socket.
"""
