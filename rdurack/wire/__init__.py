"""proto <-> domain conversion, both directions, one module per message family."""
