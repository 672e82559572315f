"""Optimal transport: the batched Sinkhorn solver and the semi-debiased Sinkhorn loss."""
