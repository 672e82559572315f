"""Benchmarks of the training step: ``dpsinkhorn bench`` and the measurements it reports."""
