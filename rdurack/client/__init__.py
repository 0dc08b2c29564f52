"""The Python client of a running rack: the admin client and the training-loop
entry point."""
