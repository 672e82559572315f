"""Evaluation: synthetic datasets from a generator, FID, the three classifiers, gradient study."""
