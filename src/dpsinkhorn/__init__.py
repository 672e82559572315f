"""dpsinkhorn: reproducible DP-Sinkhorn (Cao et al., NeurIPS 2021)."""

__version__ = "0.1.0"
