"""Privacy accounting: the ledger of DP-Sinkhorn training and its ε.

Every training step is one Poisson-subsampled Gaussian mechanism with rate q and noise
multiplier z under add/remove-one adjacency (sensitivity and z: ``privacy.mechanism``);
T steps compose adaptively. dp-accounting's RDP (default) or PLD accountant composes
``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` once per step.
``paper_convention_epsilon`` reproduces the paper's numbers (TF-Privacy
``compute_rdp(q, σ, T·n)``) for comparison only: not a valid guarantee.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpsinkhorn.privacy.checks import check_count, check_delta, check_positive, check_rate

ACCOUNTANTS = ("rdp", "pld")


class _EachOrderOnce(logging.Filter):
    """dp-accounting warns, at every RDP computation, of each order whose series did not
    converge and which it leaves out of ε (then an upper bound still: ε is a minimum over
    the orders kept). A training computes ε at every log row: each warning shows once."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "failed to converge" not in message:
            return True
        new = message not in self.seen
        self.seen.add(message)
        return new


logging.getLogger("absl").addFilter(_EachOrderOnce())


def new_accountant(
    mechanisms: list[tuple[float, float, int]], kind: str = "rdp"
) -> dp_accounting.PrivacyAccountant:
    """dp-accounting's ``kind`` accountant with, for each (q, z, steps), ``steps``
    Poisson-subsampled Gaussian mechanisms (rate q, noise multiplier z) composed."""
    if kind not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")
    acc = rdp_lib.RdpAccountant() if kind == "rdp" else dp_accounting.pld.PLDAccountant()
    for q, z, steps in mechanisms:
        if steps:  # a run stopped before its first step drew no noise
            event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
            acc.compose(event, int(steps))
    return acc


def _epsilon(mechanisms: list[tuple[float, float, int]], delta: float, kind: str = "rdp") -> float:
    """ε at ``delta`` of :func:`new_accountant`'s composition (0 when no step was taken)."""
    if not any(steps for _, _, steps in mechanisms):
        return 0.0
    return float(new_accountant(mechanisms, kind).get_epsilon(delta))


#: Smallest noise multiplier the PLD accountant is asked about: its discretised privacy
#: loss grows as z falls (at q = 1/1200 and 160,000 steps, z = 0.1 takes GBs and a minute).
PLD_MIN_NOISE_MULTIPLIER = 0.2


@functools.lru_cache(maxsize=4096)
def compute_epsilon(z: float, q: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (rate q, noise multiplier z,
    add/remove-one adjacency). Cached per process (a pure function)."""
    check_positive("noise multiplier", z)
    if accountant == "pld" and z < PLD_MIN_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise multiplier {z:.4g} is below {PLD_MIN_NOISE_MULTIPLIER}, the smallest the "
            "PLD accountant handles in bounded memory; use accountant rdp"
        )
    return composed_epsilon([(q, z, steps)], delta, accountant)


# Orders of the classic TF-Privacy examples (paper convention).
PAPER_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def paper_convention_epsilon(q: float, sigma: float, steps: int, n: int, delta: float) -> float:
    """What the paper's numbers correspond to. NOT a valid guarantee for this mechanism.

    compute_rdp(q, σ, steps·n) over PAPER_ORDERS (σ used as the noise multiplier,
    composed steps·n times), then ε = min over orders of rdp − log(δ)/(order − 1).
    """
    check_rate(q)
    check_positive("sigma", sigma)
    check_delta(delta)
    check_count("steps", steps)
    check_count("batch size", n, minimum=1)
    rdp = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, PAPER_ORDERS) * steps * n
    return float(np.min(rdp - math.log(delta) / (PAPER_ORDERS - 1)))


class PrivacyAccountant:
    """Ledger of the privacy spent by training; ``state_dict`` travels in checkpoints.

    Every call to ``step()`` records one Poisson-subsampled Gaussian mechanism
    with this accountant's rate q and noise multiplier z. Segments with other
    (q, z) (e.g. a resume with another σ) are kept separately and composed.
    """

    def __init__(
        self, sample_rate: float, noise_multiplier: float, delta: float, kind: str = "rdp"
    ):
        check_rate(sample_rate)
        check_positive("noise multiplier", noise_multiplier)
        check_delta(delta)
        if kind not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")
        self.sample_rate, self.noise_multiplier = float(sample_rate), float(noise_multiplier)
        self.delta, self.kind = float(delta), kind
        self.segments: list[list[float]] = []  # [q, z, steps]

    def step(self, num_steps: int = 1) -> None:
        """Record ``num_steps`` more steps of the current mechanism."""
        seg = self.segments[-1] if self.segments else None
        if seg and seg[0] == self.sample_rate and seg[1] == self.noise_multiplier:
            seg[2] += num_steps
        else:
            self.segments.append([self.sample_rate, self.noise_multiplier, num_steps])

    @property
    def steps(self) -> int:
        return int(sum(s[2] for s in self.segments))

    def epsilon(self) -> float:
        """ε of everything recorded so far at the accountant's δ."""
        return _epsilon(self.segments, self.delta, self.kind)

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "delta": self.delta,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "segments": [list(s) for s in self.segments],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind or state["delta"] != self.delta:
            raise ValueError(
                f"checkpoint ledger uses accountant {state['kind']} at δ={state['delta']}, "
                f"this run uses {self.kind} at δ={self.delta}"
            )
        self.segments = [list(s) for s in state["segments"]]

    @staticmethod
    def describe() -> str:
        return f"dp-accounting {importlib.metadata.version('dp-accounting')}"


def composed_epsilon(
    mechanisms: list[tuple[float, float, int]], delta: float, kind: str = "rdp"
) -> float:
    """ε at ``delta`` of publishing several releases trained on the same private data.

    Each entry (q, z, steps) is one run: ``steps`` Poisson-subsampled Gaussian mechanisms
    (rate q, noise multiplier z, add/remove-one adjacency), as :class:`PrivacyAccountant`
    records them. All runs compose sequentially (independent noise keys) in the ``kind``
    accountant (rdp: their RDP curves add order by order, converted once to ε at δ).
    """
    check_delta(delta)
    for q, z, steps in mechanisms:
        check_rate(q)
        check_positive("noise multiplier", z)
        check_count("steps", steps)
    return _epsilon(mechanisms, delta, kind)
