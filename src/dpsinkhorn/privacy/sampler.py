"""Poisson subsampling of the private records, part of the mechanism (``privacy.mechanism``).

Each step includes every record independently with probability q = B / N; the draw is
returned in a fixed shape (a buffer of ``capacity`` rows with 0/1 weights), so the step's
shapes never depend on the private data. An overflow of the buffer is charged to δ.
"""

from __future__ import annotations

import math

import torch
from scipy.stats import binom

#: Per-step probability p that a Poisson sample overflows the buffer (at most); its charge
#: to δ is (1 + e^ε)·T·p (see PoissonSampler; docs/PRIVACY.md, "Exact Poisson sampling").
OVERFLOW_TAIL = 1e-18
#: Per-step probability that selection "compact" sees more sampled records than its buffer
#: holds (then it keeps the lowest-indexed ones; an overflow anyway).
COMPACT_TAIL = 1e-100
#: How ``PoissonSampler.select`` finds the smallest uniforms: a float64 top-k over all N,
#: or the sampled records found by a prefix count and a sort of those few.
SELECTIONS = ("topk", "compact")


def overflow_capacity(num_records: int, rate: float, tail: float) -> int:
    """Smallest c ≤ N with P(Binomial(N + 1, rate) > c) ≤ ``tail``, by upward search
    (scipy's ``binom.isf`` loses precision below a tail of about 1e-16)."""
    c = int(min(num_records, math.floor(rate * (num_records + 1))))
    while c < num_records and binom.sf(c, num_records + 1, rate) > tail:
        c += 1
    return c


class PoissonSampler:
    """Poisson sampling (each record independently with probability q) in fixed shape.

    One draw u ~ U(0,1)^N in float64 (P(u < q) = q to 1e-16) selects the records with
    u < q; the ``capacity`` smallest u are returned, in increasing u, with weight 1 where
    u < q, else 0. Capacity is the smallest c with P(Binomial(N + 1, q) > c) ≤
    ``OVERFLOW_TAIL`` (N + 1: the larger neighbour under add/remove adjacency). On overflow
    the batch is a uniform subset of ``capacity`` sampled records. The step zeroes the
    features of weight-0 rows (``train.step``), so nothing of an unsampled record is
    computed on. ``selection`` (:data:`SELECTIONS`) is how the smallest u are found: both
    return the same sampled rows in the same order unless more than ``compact_rows`` ≥
    ``capacity`` records are sampled, an overflow, so the bound below holds for both.

    Overflows (counted on the device) cost δ: coupled through the same draws with the ideal
    Poisson-subsampled Gaussian M (differing only if some step overflows, probability
    ≤ T·p, p = ``overflow_probability``), the trained mechanism is
    (ε, δ + (1 + e^ε)·T·p)-DP (docs/PRIVACY.md; charged in ``train.release.privacy_record``).
    """

    def __init__(
        self, num_records: int, rate: float, device: torch.device, selection: str = "topk"
    ):
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        self.num_records, self.rate, self.selection = num_records, rate, selection
        self.capacity = overflow_capacity(num_records, rate, OVERFLOW_TAIL)
        # The compacted buffer of selection "compact": it holds every sampled record
        # unless more than its rows are sampled (probability ≤ COMPACT_TAIL per step).
        self.compact_rows = overflow_capacity(num_records, rate, COMPACT_TAIL)
        self.overflows = torch.zeros((), dtype=torch.long, device=device)
        self.device = device

    @property
    def overflow_probability(self) -> float:
        """P(more than ``capacity`` records sampled) in one step, for the larger
        neighbour (N + 1 records): binom.sf(capacity; N + 1, q)."""
        return float(binom.sf(self.capacity, self.num_records + 1, self.rate))

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (indices [capacity] int64, weights [capacity] float 0/1)."""
        indices, weights, overflow = self.select(self.uniforms(generator))
        self.overflows += overflow
        return indices, weights

    def uniforms(self, generator: torch.Generator, out: torch.Tensor | None = None) -> torch.Tensor:
        """One draw u ~ U(0,1)^N [N] float64 from ``generator`` (into ``out`` if given, e.g.
        a sweep run's row of a shared buffer): the randomness of one Poisson sample."""
        if out is not None:
            return torch.rand(self.num_records, generator=generator, out=out)
        return torch.rand(
            self.num_records, generator=generator, device=self.device, dtype=torch.float64
        )

    def select(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sample that uniforms ``u`` [..., N] (one row per draw) make: indices
        [..., capacity], weights [..., capacity] and overflow [...] (1 where more than
        ``capacity`` records were sampled, else 0). Batched over the leading dimensions,
        as a sweep draws for all its runs; ``sample`` is the single draw."""
        sampled = u < self.rate
        if self.selection == "topk":
            values, indices = torch.topk(u, self.capacity, dim=-1, largest=False, sorted=True)
            count = sampled.sum(-1)
        else:
            prefix_count = sampled.cumsum(-1)  # [..., N]: records sampled up to each index
            values, indices = self._compact(u, prefix_count)
            count = prefix_count[..., -1]
        return indices, (values < self.rate).float(), (count > self.capacity).long()

    def _compact(self, u: torch.Tensor, prefix_count: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(values, indices) [..., capacity] of the smallest u among the sampled records:
        the r-th sampled record (r ≤ ``compact_rows``) is where ``prefix_count`` reaches r
        (``searchsorted``), and those few are sorted by u (missing ones: u = 2, index 0).
        Equals top-k on the sampled rows whenever at most ``compact_rows`` records are
        sampled. Fixed shapes, no host synchronisation."""
        rows = min(max(self.compact_rows, self.capacity), u.shape[-1])
        ranks = torch.arange(1, rows + 1, device=u.device).expand(*u.shape[:-1], rows)
        owners = torch.searchsorted(prefix_count, ranks.contiguous())
        found = owners < u.shape[-1]
        owners = torch.where(found, owners, 0)
        values, order = torch.where(found, u.gather(-1, owners), 2.0).sort(stable=True)
        order = order[..., : self.capacity]
        return values[..., : self.capacity], owners.gather(-1, order)
