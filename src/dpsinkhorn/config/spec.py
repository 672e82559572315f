"""One experiment's settings as a frozen, typed :class:`ExperimentSpec` (torch-free), read
once from the validated experiment dict, which stays what identifies the experiment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExperimentSpec:
    """What training reads from one experiment (units as in ``config/schema.json``)."""

    name: str
    dataset: str
    method: str  # dp_sinkhorn | dpmerf | sinkhorn (non-private)
    # Sampling and the privacy mechanism
    batch_size: int  # n = B: expected real batch and generated cross rows
    sigma: float | None  # noise scale σ (noise std 2Δσ); None: solved from target_epsilon
    clip: float  # Δ, L2 norm
    clipping: str  # batch | per_sample
    perturbation: str  # image | parameter
    steps: int | None  # None: the most steps within target_epsilon
    target_epsilon: float | None
    epsilon_convention: str  # sound | paper: how target_epsilon is counted
    delta: float
    accountant: str  # rdp | pld
    # Optimiser
    optimizer: str  # adam | sgd
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    # Loss
    p: float  # debiasing fraction: n' = floor(n p)
    m: float  # L1 weight of the mixed cost
    cost: str  # mixed | l2 | l1
    entropy_reg: float
    sinkhorn_scaling: float
    alpha_c: float  # weight of the one-hot label features
    conditional: bool  # False: one class, no label term in the cost, real labels never read
    # Generator
    generator: str  # dcgan | biggan | merf
    latent_dim: int
    embed_dim: int
    channels: tuple[int, ...]
    seed: int  # initial weights (and the noise key in reproducible mode)
    reproducible: bool  # noise key from seed and name: no privacy guarantee
    # DP-MERF (method dpmerf): random features D, kernel b (pixels² in [0, 1]), lr decay/epoch
    rff_features: int
    rff_bandwidth: float
    lr_decay: float
    # Bookkeeping
    checkpoint_every: int
    log_every: int
    keep_private_workspace: bool
    log_private_loss: bool

    @property
    def private(self) -> bool:
        """Trained with a DP mechanism (``method: dp_sinkhorn`` or ``dpmerf``)."""
        return self.method in ("dp_sinkhorn", "dpmerf")

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> ExperimentSpec:
        """From a validated experiment dict (keys beyond the fields are ignored); a missing
        setting is a ValueError naming it."""
        missing = [k for k in cls.__dataclass_fields__ if k not in spec and k != "generator"]
        if missing:
            raise ValueError(
                f"experiment {spec.get('name', '?')}: settings {missing} missing; build it with "
                "config.experiment or config.make_experiment (they fill the defaults)"
            )
        # Numbers are kept as validated (an int stays an int, a bool a bool): privacy.json
        # writes some. The schema gives ``generator`` no default (CelebA names its own).
        settings = {key: spec[key] for key in cls.__dataclass_fields__ if key in spec}
        return cls(
            **{
                **settings,
                "p": float(spec["p"]),
                "betas": tuple(spec["betas"]),
                "generator": spec.get("generator", "dcgan"),
                "rff_bandwidth": float(spec["rff_bandwidth"]),
                "lr_decay": float(spec["lr_decay"]),
                "channels": tuple(spec["channels"]),
            }
        )
