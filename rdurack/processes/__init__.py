"""rdurack's processes: one main per process (orchestrator, node agent, Ray
head), how each is told to stop, and the local rack that starts them all (`rdu up`)."""
