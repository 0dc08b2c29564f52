"""Tools that exercise a whole rack to measure or break it: `make bench` and
`make chaos`."""
