"""Sweeps: K independent training runs in one process on one device.

``dpsinkhorn train-sweep --config ... --experiments A B C --out-root results/<run>``
trains each experiment into ``<out-root>/<name>/`` with exactly the files, checkpoints
and privacy ledger of ``dpsinkhorn train`` (a sweep member can be resumed by either).

What is shared and what is not, per step:
    * each run keeps its own ``train.trainer.Trainer``: parameters, optimiser (its own lr,
      betas, SGD/Adam), RNG stream (its own secret key, or in reproducible mode a key
      from its seed and name: members never share noise), Poisson sampler, sanitiser
      (σ, Δ, clipping) and accountant. Every random draw of run k (z, labels, Poisson
      sample, noise) comes from run k's generator in the same order as a single run,
      so a sweep member follows the single run's trajectory up to float rounding.
    * the generators run as one batched call: ``torch.func.vmap`` over the runs'
      stacked parameters (a grouped convolution), rows padded to the largest
      n + n'_k (padded rows get zero gradient and are never sanitised or released);
    * the Sinkhorn loss of all runs, both terms, is one batched solve of the
      fixed-schedule solver (``loss.semi_debiased_sinkhorn_with_grad_runs``), with
      each run's m; it returns ∇_{X_k} S_k for every run (runs share no term);
    * privacy: ∇_{X_k} S_k is clipped and noised with run k's own mechanism before it
      flows into run k's generator, for all runs at once
      (``privacy.mechanism.StackedImageGradientSanitizer``: run k's Δ, σ, clipping mode and n',
      noise from run k's generator). ``perturbation: parameter`` runs are sanitised on
      their own parameter gradient after the backward pass. The mechanism,
      sensitivity and noise multiplier are those of the single run (``privacy.mechanism``).
    * what remains per run is what must be: its draws (one operation each, into its
      slice of a shared buffer) and its optimiser step (one fused kernel). The Poisson
      selection, the gradient assembly and the clipping are batched over the runs.

Runs may differ in anything that keeps step shapes compatible (seed, lr, optimizer,
σ, Δ, p, m, steps, ε target, clipping, perturbation); ``sweep_key`` lists what must be
equal (``specs.sweep_key``). A finished run leaves the batch; the others go on.
``precision`` may be fp32 or tf32, not bf16: vmap does not apply autocast on every device.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call, vmap
from tqdm import tqdm

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.identity import SWEEP_SHARED_KEYS, sweep_key
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.ot.loss import conditional_features, semi_debiased_sinkhorn_with_grad_runs
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, StackedImageGradientSanitizer
from dpsinkhorn.train.cli import add_training_arguments, run_training_cli
from dpsinkhorn.train.run import load_train_data
from dpsinkhorn.train.signals import StopSignal
from dpsinkhorn.train.trainer import GraphedStep, Trainer, data_fingerprint
from dpsinkhorn.train.workspace import RunFiles, released_on_error


class SweepTrainer:
    """K ``train.trainer.Trainer`` runs advanced together by one batched step."""

    def __init__(
        self,
        specs: Sequence[dict],
        train_images,
        train_labels,
        device: torch.device,
        compile_solver: bool = False,
        cuda_graphs: bool = False,
        precision: str = "fp32",
    ):
        if not specs:
            raise ValueError("a sweep needs at least one experiment")
        if precision == "bf16":
            raise ValueError(config_lib.SWEEP_BF16_ERROR)
        keys = {sweep_key(spec) for spec in specs}
        if len(keys) > 1:
            differing = [
                k for k in SWEEP_SHARED_KEYS if len({json.dumps(s.get(k)) for s in specs}) > 1
            ]
            raise ValueError(
                f"experiments {[s['name'] for s in specs]} cannot share a sweep: "
                f"they differ in {differing}"
            )
        self.trainers: list[Trainer] = []
        fingerprint = data_fingerprint(train_images, train_labels)  # hashed once
        for spec in specs:
            # Each run keys its own generator (a fresh secret, or in reproducible mode one
            # from its seed and name): no two members share noise or Poisson draws.
            trainer = Trainer(
                spec,
                train_images,
                train_labels,
                device,
                cuda_graphs,
                compile_solver,
                precision,
                fingerprint,
                # one copy of the real features on the device
                real_features=self.trainers[0].real if self.trainers else None,
            )
            self.trainers.append(trainer)
        self.device = device
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.template = self.trainers[0].model  # the module whose code all runs share
        self.param_names = [name for name, _ in self.template.named_parameters()]
        self._run_set: _RunSet | None = None

    def _runs(self, runs: Sequence[Trainer]) -> _RunSet:
        """The constants of this set of runs; rebuilt only when the set changes."""
        if self._run_set is None or self._run_set.key != tuple(id(t) for t in runs):
            self._run_set = _RunSet(runs, self.device)
        return self._run_set

    def _forward(self, params: dict, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return functional_call(self.template, params, (z, labels))

    def step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """One training step of each trainer in ``runs``; returns their losses (device).

        With ``cuda_graphs`` the device work is replayed from a CUDA graph
        (``train.trainer.GraphedStep``), captured anew whenever the set of runs changes.
        """
        if not self.cuda_graphs:
            losses = self.device_step(runs)
        else:
            run_set = self._runs(runs)
            if run_set.graphed is None:
                run_set.graphed = GraphedStep(
                    lambda: self.device_step(runs), list(runs), self.device
                )
            losses = run_set.graphed()
        for t in runs:
            t.count_step()
        return losses

    def device_step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        """The device work of one step of each run in ``runs`` (no host bookkeeping)."""
        with runs[0].precision.step():
            return self._device_step(runs)

    def _device_step(self, runs: Sequence[Trainer]) -> list[torch.Tensor]:
        first, run_set = runs[0], self._runs(runs)
        n, rows, k = first.n, run_set.rows, len(runs)
        # Per-run draws, in a single run's order (z, labels, Poisson uniforms; the noise
        # comes later), each from the run's own generator into its slice of one buffer.
        z = torch.zeros(k, rows, self.template.config.latent_dim, device=self.device)
        labels = torch.zeros(k, rows, dtype=torch.long, device=self.device)
        uniforms = torch.empty(  # float64, as PoissonSampler.sample draws them
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

        per_run = [dict(t.model.named_parameters()) for t in runs]
        params = {name: torch.stack([p[name] for p in per_run]) for name in self.param_names}
        with first.precision.forward():
            images = vmap(self._forward)(params, z, labels)  # [K, rows, C, H, W]

        settings = first.settings
        x = conditional_features(
            images.detach().float().flatten(0, 1),
            labels.flatten(),
            first.num_classes,
            settings.alpha_c,
        )  # [K * rows, D]
        losses, grad_cross, grad_self = semi_debiased_sinkhorn_with_grad_runs(
            x.unflatten(0, (k, rows))[:, :n],
            x.index_select(0, run_set.self_rows).unflatten(0, (k, n)),  # X_k[n'_k : n'_k + n]
            first.real[indices],
            weights,
            settings.entropy_reg,
            run_set.m,
            scaling=settings.sinkhorn_scaling,
            diameter=first.diameter,
            cost=first.cost,
            compile=first.compile_solver,
        )
        # ∇_{X_k} S_k for every run (block k of ∇_X Σ_j S_j: S_j does not depend on X_k
        # for j ≠ k), as loss.debiased_gradient assembles it for one run.
        numel = images[0, 0].numel()
        grad = torch.zeros(k * rows, numel, device=self.device)
        grad.view(k, rows, numel)[:, :n] = grad_cross[..., :numel]
        grad.index_add_(0, run_set.self_rows, grad_self[..., :numel].flatten(0, 1))
        sanitized = run_set.sanitizer(grad.view(images.shape))  # each run's own mechanism
        for t in runs:
            t.optimizer.zero_grad(set_to_none=True)
        images.backward(sanitized.to(images.dtype))  # float32 -> bf16: post-processing
        for t in runs:
            t.apply_update()
        return list(losses)


class _RunSet:
    """What one set of runs stepped together needs on the device, built once per set.

    ``rows``: the largest n + n'_k (shorter runs are zero-padded); ``self_rows``: the
    rows X_k[n'_k : n'_k + n] of the self term in the runs' stacked [K * rows] batch;
    ``m``: each run's L1 weight [K]; ``sanitizer``: the runs' image-gradient mechanisms
    (``privacy.mechanism.StackedImageGradientSanitizer``); ``graphed``: its CUDA graph, if any.
    """

    def __init__(self, runs: Sequence[Trainer], device: torch.device):
        self.key = tuple(id(t) for t in runs)
        n = runs[0].n
        self.rows = max(t.n + t.n_prime for t in runs)
        self.self_rows = torch.tensor(
            [run * self.rows + t.n_prime + i for run, t in enumerate(runs) for i in range(n)],
            device=device,
        )
        self.m = torch.tensor([t.settings.m for t in runs], device=device)
        self.sanitizer = StackedImageGradientSanitizer(
            [
                t.sanitizer if isinstance(t.sanitizer, ImageGradientSanitizer) else None
                for t in runs
            ],
            n,
            self.rows,
            device,
        )
        self.graphed: GraphedStep | None = None


def train_sweep(
    specs: Sequence[dict],
    out_dirs: Sequence[Path],
    data_dir: Path | None = None,
    device: str = "auto",
    stop_after: int | None = None,
    progress: bool = True,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    precision: str = "fp32",
) -> list[dict]:
    """Train ``specs`` together, run k into ``out_dirs[k]``; returns their privacy records.

    Same files, resumption and ``stop_after`` / signal behaviour as ``train.run.train``;
    each run's outputs are written as soon as that run finishes. ``cuda_graphs``,
    ``compile_solver`` and ``precision`` as in ``train.run.train``.
    """
    if len(specs) != len(out_dirs):
        raise ValueError(f"{len(specs)} experiments but {len(out_dirs)} output folders")
    datasets = {spec["dataset"] for spec in specs}
    if len(datasets) > 1:
        raise ValueError(f"a sweep trains on one dataset, got {sorted(datasets)}")
    images, labels = load_train_data(specs[0], data_dir, train_data)
    sweep = SweepTrainer(
        specs, images, labels, resolve_device(device), compile_solver, cuda_graphs, precision
    )
    runs: list[RunFiles] = []
    with released_on_error(runs):  # one folder refused: give back those already taken
        for t, out in zip(sweep.trainers, out_dirs, strict=True):
            runs.append(RunFiles(t, out))
    # Workspaces go when the whole sweep is done: until then, a finished member's final
    # checkpoint tells a rerun (after preemption) that it needs no more steps.
    records = {i: run.finish(remove_workspace=False) for i, run in enumerate(runs) if run.done}
    bar = tqdm(
        total=sum(t.total_steps for t in sweep.trainers),
        initial=sum(run.start_step for run in runs),
        desc=f"sweep of {len(runs)}",
        disable=not progress,
        mininterval=1.0,
    )
    taken = 0
    with StopSignal() as stop, released_on_error(runs):
        while len(records) < len(runs):
            active = [i for i in range(len(runs)) if i not in records]
            losses = sweep.step([sweep.trainers[i] for i in active])
            taken += 1
            bar.update(len(active))
            epsilons = []  # the bar shows ε only: nothing computed on the private data
            for i, loss in zip(active, losses, strict=True):
                row = runs[i].after_step(loss)
                if row is not None:
                    epsilons.append(row["epsilon"])
                if runs[i].done:
                    records[i] = runs[i].finish(remove_workspace=False)
            if epsilons:
                bar.set_postfix(runs=len(active), eps_max=f"{max(epsilons):.3g}")
            unfinished = [runs[i] for i in active if i not in records]
            if unfinished and stop.should_stop(taken, stop_after):
                for run in unfinished:
                    run.checkpoint()
                bar.close()
                paths = ", ".join(str(run.ckpt_path) for run in unfinished)
                raise stop.preempted(stop_after, f"checkpoints after {taken} steps in {paths}")
    bar.close()
    for run in runs:
        run.remove_workspace()
    return [records[i] for i in range(len(runs))]


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-sweep", help="train several experiments together in one process (one device)"
    )
    p.add_argument("--experiments", nargs="+", required=True)
    p.add_argument("--out-root", required=True, help="run folder: <out-root>/<experiment>/")
    add_training_arguments(p)
    p.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)  # loaded and validated once per command
    specs = [config_lib.trained_experiment(cfg, e, "nothing to train") for e in args.experiments]
    outs = [Path(args.out_root) / spec["name"] for spec in specs]
    return run_training_cli("train-sweep", args, cfg, train_sweep, specs, outs)
