"""Configuration: load, validate and query experiment configs (torch-free).

This is the only package Snakemake imports while it parses the workflow, so nothing
here may import torch, torchvision or matplotlib (``tests/test_architecture.py``).
Import the public names from ``dpsinkhorn.config`` itself.
"""

from dpsinkhorn.config.core import *  # noqa: F401,F403
