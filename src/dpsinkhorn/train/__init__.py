"""Training: the trainer, one run's files and signals, and K runs in one process (sweeps)."""
