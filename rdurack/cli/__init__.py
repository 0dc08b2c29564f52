"""`rdu`: the command line. One module per group of commands, their shared options, the
views of jobs and the rack, progress bars; `main.build_app` puts the commands together."""
