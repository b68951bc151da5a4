"""Pure domain of ito-training: no I/O, imports nothing else of ours."""
