"""rdurack's processes: one main per process (orchestrator, node agent, Ray head), how
each reads its settings (flags, then RDURACK_* variables) and is told to stop, and the
local rack that starts them all (`rdu up`): its child processes and its record."""
