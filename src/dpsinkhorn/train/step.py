"""The DP-Sinkhorn training step (paper Algorithm 1), one implementation for 1 or K runs.

Each run k draws z, labels and its Poisson sample from its own generator, generates
X_k = g_k(z, label) (K > 1: ``torch.func.vmap``), computes S_k and ∇_{X_k} S_k of all runs
in one solve (``ot.loss.semi_debiased_sinkhorn_with_grad_runs``), applies its privacy
mechanism (``privacy.factory.make_private``: the image gradient clipped and noised by
:func:`sanitize`, or the parameter gradient in ``Trainer.apply_update``), and takes its
optimiser step. The device work has fixed shapes and no host synchronisation
(:class:`GraphedStep` can replay it); host bookkeeping follows in :meth:`TrainingStep.__call__`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch.func import functional_call, vmap

from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.models import GeneratorPrecision
from dpsinkhorn.ot.loss import conditional_features, semi_debiased_sinkhorn_with_grad_runs
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, ParameterGradientSanitizer
from dpsinkhorn.privacy.sampler import PoissonSampler


class Trainer(Protocol):
    """What the step reads and calls of one run (``train.trainer.Trainer`` is one)."""

    settings: ExperimentSpec  # loss settings (λ, m, p, α_c, scaling), shared by a step's runs
    n: int  # generated cross rows = expected real batch
    n_prime: int  # debiasing rows
    model: torch.nn.Module  # the generator g(z, label)
    optimizer: torch.optim.Optimizer
    rng: torch.Generator  # every draw of the run: z, labels, Poisson uniforms, noise
    sampler: PoissonSampler
    sanitizer: ImageGradientSanitizer | ParameterGradientSanitizer | None
    precision: GeneratorPrecision
    real: torch.Tensor  # [N, D] real features on the device
    feature_classes: int  # one-hot label columns of the cost (0: unconditional)
    diameter: float  # the feature bound that fixes the solver's schedule
    compile_solver: bool

    def apply_update(self) -> None: ...  # parameter sanitiser (if any) + optimiser step

    def count_step(self) -> None: ...  # host bookkeeping: step counter and ledger


class GraphedStep:
    """Runs a step's device work from a CUDA graph: ``WARMUP_STEPS`` eager steps on a side
    stream, one capture, then replays. ``device_step``: fixed-shape device work, no host
    synchronisation, every draw from the ``trainers``' generators (registered with the
    graph, so each replay draws fresh z, labels, Poisson samples and noise). CUDA only.
    """

    WARMUP_STEPS = 3

    def __init__(self, device_step, trainers: Sequence[Trainer], device: torch.device):
        self.device_step, self.trainers, self.device = device_step, list(trainers), device
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self):
        """One step's device work; returns ``device_step``'s list of tensors (copies on replay)."""
        if self.eager_steps < self.WARMUP_STEPS:
            self.eager_steps += 1
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                out = self.device_step()
            torch.cuda.current_stream(self.device).wait_stream(side)
            return out
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return [t.clone() for t in self.output]

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        for trainer in self.trainers:
            graph.register_generator_state(trainer.rng)
            trainer.optimizer.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(graph):
                self.output = self.device_step()  # recorded, not run
        except RuntimeError as error:
            raise RuntimeError(
                f"could not capture the training step in a CUDA graph ({error}); "
                "train without cuda_graphs"
            ) from error
        self.graph = graph


def sanitize(runs: Sequence[Trainer], grads: torch.Tensor) -> torch.Tensor:
    """The image-gradient mechanism of every run: ``grads`` [K, rows, C, H, W] holds
    ∇_{X_k} S_k in rows [0, n + n'_k) of entry k (zero padding after). Run k's rows go
    through run k's ``ImageGradientSanitizer`` (its Δ, σ, clipping mode, n' and noise
    generator: G_k[0:n] clipped and noised, G_k[n:n+n'_k] clipped); runs without one
    (non-private, or ``perturbation: parameter``) pass unchanged. Returns [K, rows, ...]."""
    out = []
    for run, t in enumerate(runs):
        rows_k = t.n + t.n_prime
        grad = grads[run, :rows_k]
        if isinstance(t.sanitizer, ImageGradientSanitizer):
            grad = t.sanitizer(grad)  # clip + noise, before the generator's backward
        out.append(grad if rows_k == grads.shape[1] else torch.cat([grad, grads[run, rows_k:]]))
    return torch.stack(out)


class TrainingStep:
    """The step of a set of runs that share their data, n, the loss settings and the
    generator's architecture (a single run, or a sweep's members: ``config.identity``'s
    ``sweep_key``). Call it with the runs to advance (all, or a sweep's active subset);
    constants of each set of runs are built once and kept. ``fused_cost``: the solver's
    cost and gradients by ``ot.solver.fused_cost`` (``dpsinkhorn bench --fused-cost``).
    """

    fused_cost = False

    def __init__(self, trainers: Sequence[Trainer], device: torch.device, cuda_graphs: bool):
        self.trainers, self.device = list(trainers), device
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.template = self.trainers[0].model  # the module whose code all runs share
        self.param_names = [name for name, _ in self.template.named_parameters()]
        self._sets: dict[tuple[int, ...], _RunSet] = {}

    def __call__(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """One training step of each run in ``runs``; returns their losses (device
        scalars, no host sync). Counts the step in each run's ledger."""
        if self.cuda_graphs:
            run_set = self._run_set(runs)
            if run_set.graphed is None:
                run_set.graphed = GraphedStep(lambda: self.device_step(runs), runs, self.device)
            losses = run_set.graphed()
        else:
            losses = self.device_step(runs)
        for t in runs:
            t.count_step()
        return losses

    def device_step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """The device work of one step of each run (draws, loss, sanitised backward,
        optimiser steps); no host bookkeeping. What :class:`GraphedStep` records."""
        with runs[0].precision.step():
            losses = self.forward_backward(runs)
            for t in runs:
                t.apply_update()
        return losses

    def forward_backward(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """Draws, loss and the sanitised backward pass: leaves ∇_θ in each run's
        parameters' ``.grad`` (not yet sanitised for ``perturbation: parameter``);
        returns the runs' losses S_k."""
        first, run_set = runs[0], self._run_set(runs)
        n, rows, k = first.n, run_set.rows, len(runs)
        # 1. Per-run draws in a fixed order (z, labels, Poisson uniforms; the noise comes
        # in sanitize), each from the run's own generator into its slice of one buffer.
        z = torch.zeros(k, rows, self.template.config.latent_dim, device=self.device)
        labels = torch.zeros(k, rows, dtype=torch.long, device=self.device)
        uniforms = torch.empty(  # float64, as PoissonSampler draws them
            k, first.sampler.num_records, device=self.device, dtype=torch.float64
        )
        for run, t in enumerate(runs):
            rows_k = t.n + t.n_prime
            t.model.sample_inputs(
                rows_k, t.rng, self.device, (z[run, :rows_k], labels[run, :rows_k])
            )
            t.sampler.uniforms(t.rng, out=uniforms[run])
        indices, weights, overflow = first.sampler.select(uniforms)  # runs share N, q, capacity
        for run, t in enumerate(runs):
            t.sampler.overflows += overflow[run]

        # 2. The generated batches X_k [K, rows, C, H, W].
        with first.precision.forward():
            images = self._generate(runs, z, labels)

        # 3. S_k and ∇_{X_k} S_k, every run in one solve.
        settings = first.settings
        x = conditional_features(
            images.detach().float().flatten(0, 1),
            labels.flatten(),
            first.feature_classes,
            settings.alpha_c,
        )  # [K * rows, D]
        # The Poisson sample Y_k: the buffer's rows of weight 1. Rows of weight 0 (records
        # gathered into the fixed-shape buffer but not sampled) are zeroed here, so no
        # value of an unsampled record enters the solve (not even at weight 0).
        real = torch.where(weights[..., None] > 0, first.real[indices], 0.0)
        losses, grad_cross, grad_self = semi_debiased_sinkhorn_with_grad_runs(
            x.unflatten(0, (k, rows))[:, :n],
            x.index_select(0, run_set.self_rows).unflatten(0, (k, n)),  # X_k[n'_k : n'_k + n]
            real,
            weights,
            settings.entropy_reg,
            run_set.m,
            scaling=settings.sinkhorn_scaling,
            diameter=first.diameter,
            cost=settings.cost,
            compile=first.compile_solver,
            fused_cost=self.fused_cost,
        )
        # ∇_{X_k} S_k: rows 0..n-1 get ∇_{X_k[0:n]} S_k and rows n'_k..n'_k+n-1 add
        # ∇_{X_k[n'_k:n'_k+n]} S_k (as ot.loss.debiased_gradient does for one run).
        # The label columns are dropped last: the image block is then a view with row
        # stride D, whose norms (and so a single run's bits) are those of a K = 1 solve.
        grad = torch.zeros(k * rows, x.shape[1], device=self.device)
        grad.view(k, rows, -1)[:, :n] = grad_cross
        grad.index_add_(0, run_set.self_rows, grad_self.flatten(0, 1))
        grad_images = grad[:, : images[0, 0].numel()].reshape(images.shape)

        # 4. The privacy mechanism, then 5. the backward pass into the generators.
        sanitized = sanitize(runs, grad_images)
        for t in runs:
            t.optimizer.zero_grad(set_to_none=True)
        grad_out = sanitized.to(images.dtype)  # float32 -> bf16: post-processing
        if not images.is_contiguous():  # e.g. a channels-last generator: in its own layout
            grad_out = torch.empty_like(images).copy_(grad_out)
        images.backward(grad_out)
        return list(losses)

    def _generate(
        self, runs: Sequence[Trainer], z: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """X_k = g_k(z_k, labels_k) for every run -> [K, rows, C, H, W]."""
        if len(runs) == 1:
            return runs[0].model(z[0], labels[0]).unsqueeze(0)
        per_run = [dict(t.model.named_parameters()) for t in runs]
        params = {name: torch.stack([p[name] for p in per_run]) for name in self.param_names}
        return vmap(lambda p, z_k, y_k: functional_call(self.template, p, (z_k, y_k)))(
            params, z, labels
        )

    def _run_set(self, runs: Sequence[Trainer]) -> _RunSet:
        key = tuple(id(t) for t in runs)
        if key not in self._sets:
            self._sets[key] = _RunSet(runs, self.device)
        return self._sets[key]


class _RunSet:
    """What one set of runs stepped together needs on the device, built once per set.

    ``rows``: the largest n + n'_k (shorter runs are zero-padded); ``self_rows``: the
    rows X_k[n'_k : n'_k + n] of the self term in the runs' stacked [K * rows] batch;
    ``m``: each run's L1 weight [K]; ``graphed``: its CUDA graph, if any.
    """

    def __init__(self, runs: Sequence[Trainer], device: torch.device):
        n = runs[0].n
        self.rows = max(t.n + t.n_prime for t in runs)
        self.self_rows = torch.tensor(
            [run * self.rows + t.n_prime + i for run, t in enumerate(runs) for i in range(n)],
            device=device,
        )
        self.m = torch.tensor([t.settings.m for t in runs], device=device)
        self.graphed: GraphedStep | None = None
