"""`rdu`: the command line, its commands and their views of jobs and the rack."""
