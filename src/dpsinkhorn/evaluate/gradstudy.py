"""Bias and variance of the generator-gradient estimator G_p against p (paper Figure 4c).

G_p = ∇θ S_p(X(θ), Y): a training step's semi-debiased Sinkhorn gradient, WITHOUT clipping
or noise (the output is NOT differentially private); bias is against the mean of G_1."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.sample import load_generator, read_generator_file
from dpsinkhorn.fileio import check_samples, load_samples, write_json
from dpsinkhorn.ot.loss import (
    conditional_features,
    debias_size,
    feature_diameter,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.privacy.sampler import PoissonSampler

DEFAULT_P = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
NOTE = "non-private analysis of the training data; not a DP release"


def draw_seed(seed: int, p: float, batch: int) -> int:
    """Seed of draw ``batch`` for debiasing fraction ``p``: a hash of (seed, p to 1e-6,
    batch), so a draw does not depend on what else is studied."""
    key = np.random.SeedSequence([int(seed), round(float(p) * 1_000_000), int(batch)])
    return int(key.generate_state(1, np.uint64)[0] >> 1)  # 63 bits: any torch seed


class GradientEstimator:
    """Draws G_p = ∇θ S_p for one generator, real records (``images`` uint8 [N,H,W(,C)],
    ``labels`` [N]) and experiment spec: one training step's gradient with n' = floor(n p)
    debiasing rows, the generator in training mode, its buffers restored before every draw
    (draws do not depend on their order); ``restore()`` puts buffers and mode back."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: dict,
        images: np.ndarray,
        labels: np.ndarray,
        device: str | torch.device = "cpu",
    ):
        images, labels = np.asarray(images), np.asarray(labels)
        check_samples(images, labels, "gradient study data")
        self.spec = spec
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.model = model.to(self.device)
        self.n = int(spec["batch_size"])
        num_records = len(labels)
        if num_records < self.n:
            raise ValueError(f"the data hold {num_records} records, fewer than batch_size {self.n}")
        cfg = model.config
        real_images = data.to_unit_range(images).to(self.device)
        expected = (cfg.out_channels, cfg.image_size, cfg.image_size)
        if tuple(real_images.shape[1:]) != expected:
            raise ValueError(
                f"images are {tuple(real_images.shape[1:])} (C,H,W) but the generator "
                f"makes {expected}"
            )
        if labels.min() < 0 or labels.max() >= cfg.num_classes:
            raise ValueError(
                f"labels span {labels.min()}..{labels.max()} but the generator has "
                f"{cfg.num_classes} classes"
            )
        self.num_classes = cfg.num_classes
        alpha_c = spec["alpha_c"]
        label_t = torch.as_tensor(labels.astype(np.int64), device=self.device)
        self.real = conditional_features(real_images, label_t, self.num_classes, alpha_c)
        self.cost = spec["cost"]
        self.diameter = feature_diameter(real_images[0].numel(), alpha_c, self.cost)
        self.sampler = PoissonSampler(num_records, self.n / num_records, self.device)
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.num_parameters = sum(q.numel() for q in self.params)
        self._was_training = model.training
        self._buffers = [(b, b.detach().clone()) for b in model.buffers()]

    def gradient(self, p: float, generator: torch.Generator) -> torch.Tensor:
        """One draw of G_p: float32 [num_parameters], the parameters' gradients flattened
        and concatenated in ``model.parameters()`` order (units of S per unit of θ)."""
        spec = self.spec
        n_prime = debias_size(self.n, p)
        self.restore(training=True)
        z, gen_labels = self.model.sample_inputs(self.n + n_prime, generator, self.device)
        images = self.model(z, gen_labels)
        x = conditional_features(images, gen_labels, self.num_classes, spec["alpha_c"])
        indices, weights = self.sampler.sample(generator)
        _, grad_x = semi_debiased_sinkhorn_with_grad(
            x.detach(),
            self.real[indices],
            weights,
            self.n,
            p,
            spec["entropy_reg"],
            spec["m"],
            scaling=spec["sinkhorn_scaling"],
            diameter=self.diameter,
            cost=self.cost,
        )
        # ∇θ S = (∂X/∂θ)ᵀ ∇_X S, as the training step's images.backward(∇_images S).
        grads = torch.autograd.grad(x, self.params, grad_x, materialize_grads=True)
        return torch.cat([g.reshape(-1) for g in grads])

    def draws(self, p: float, batches: int, seed: int) -> Iterator[torch.Tensor]:
        """Yield ``batches`` independent draws of G_p (see ``gradient``); draw b uses a
        ``torch.Generator`` seeded with ``draw_seed(seed, p, b)``."""
        for b in range(batches):
            generator = torch.Generator(device=self.device).manual_seed(draw_seed(seed, p, b))
            yield self.gradient(p, generator)

    def restore(self, training: bool | None = None) -> None:
        """Put the generator's buffers back as they were given, and its train/eval mode
        (``training`` None: as given)."""
        with torch.no_grad():
            for buffer, saved in self._buffers:
                buffer.copy_(saved)
        self.model.train(self._was_training if training is None else training)


def _check_study_args(p_values: Sequence[float], batches: int, seed: int) -> list[float]:
    ps = [float(p) for p in p_values]
    for p in ps:
        if not (0.0 <= p <= 1.0) or math.isnan(p):
            raise ValueError(f"p must be in [0, 1], got {p}")
    if 0.0 not in ps or 1.0 not in ps:
        raise ValueError(
            f"p values must include 0 (variance reference) and 1 (bias reference), got {ps}"
        )
    keys = [round(p * 1_000_000) for p in ps]
    if len(set(keys)) != len(keys):
        raise ValueError(f"p values must be distinct, got {ps}")
    if int(batches) != batches or batches < 2:
        raise ValueError(f"batches must be an integer >= 2 (sample variance), got {batches}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return ps


def gradient_study(
    model: torch.nn.Module,
    spec: dict,
    images: np.ndarray,
    labels: np.ndarray,
    p_values: Sequence[float],
    batches: int,
    seed: int,
    device: str | torch.device,
    *,
    progress: bool = False,
) -> dict:
    """Bias and variance of G_p for each p in ``p_values`` (must contain 0 and 1): per p,
    ``batches`` draws (:class:`GradientEstimator`) reduced by Welford's algorithm in float64.
    Returns a JSON-ready dict; the lists follow ``p``:

    - ``bias``: ||mean G_p − mean G_1||₂ (units of ∇θ S); 0 at p = 1 by definition
    - ``bias_relative``: bias / ||mean G_1||₂ (None if that norm is 0)
    - ``variance``: (1 / (batches − 1)) Σ_b ||G_p,b − mean G_p||², the trace of the
      sample covariance (units of (∇θ S)²)
    - ``variance_normalised``: variance / variance at p = 0 (None if that is 0)
    - ``bias_noise_floor``: sqrt((variance_p + variance_1) / batches), the bias expected
      from sampling noise alone when G_p is unbiased (draws are independent across p);
      0 at p = 1
    """
    ps = _check_study_args(p_values, batches, seed)
    estimator = GradientEstimator(model, spec, images, labels, device)
    size, dev = estimator.num_parameters, estimator.device
    means, variances = [], []
    bar = tqdm(total=len(ps) * batches, desc="grad-study", disable=not progress, mininterval=1.0)
    try:
        for p in ps:
            mean = torch.zeros(size, dtype=torch.float64, device=dev)
            m2 = torch.zeros((), dtype=torch.float64, device=dev)  # Σ_coords Σ_b dev²
            for k, grad in enumerate(estimator.draws(p, batches, seed), start=1):
                g = grad.detach().to(torch.float64)
                delta = g - mean
                mean += delta / k
                m2 += torch.dot(delta, g - mean)
                bar.update(1)
            means.append(mean)
            variances.append(float(m2) / (batches - 1))
        if int(estimator.sampler.overflows) > 0:  # probability < 1e-12
            raise RuntimeError(
                f"a Poisson sample exceeded the buffer capacity {estimator.sampler.capacity}; "
                "rerun with another seed"
            )
    finally:
        bar.close()
        estimator.restore()

    ref_mean, ref_var = means[ps.index(1.0)], variances[ps.index(1.0)]
    var0 = variances[ps.index(0.0)]
    ref_norm = float(torch.linalg.vector_norm(ref_mean))
    bias = [float(torch.linalg.vector_norm(mean - ref_mean)) for mean in means]
    floor = [
        0.0 if p == 1.0 else math.sqrt((var + ref_var) / batches)
        for p, var in zip(ps, variances, strict=True)
    ]
    return {
        "experiment": spec["name"],
        "trained_p": spec["p"],
        "p": ps,
        "n_prime": [debias_size(estimator.n, p) for p in ps],
        "batch_size": estimator.n,
        "bias": bias,
        "bias_relative": [b / ref_norm if ref_norm > 0 else None for b in bias],
        "variance": variances,
        "variance_normalised": [v / var0 if var0 > 0 else None for v in variances],
        "bias_noise_floor": floor,
        "batches": int(batches),
        "seed": int(seed),
        "num_parameters": size,
        "note": NOTE,
    }


# ------------------------------------------------------------------------------- CLI


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    g = subparsers.add_parser(
        "grad-study",
        help="bias/variance of the generator gradient against p (Figure 4c; not private)",
    )
    g.add_argument("--config", nargs="+", required=True, help="config YAML file(s)")
    g.add_argument("--experiment", required=True)
    g.add_argument("--generator", required=True, help="generator.pt of that experiment")
    g.add_argument("--data", required=True, help="<data_dir>/<dataset>/train.npz")
    g.add_argument("--p", nargs="+", type=float, default=list(DEFAULT_P), help="must hold 0, 1")
    g.add_argument("--batches", type=int, default=300, help="draws per p")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True, help="result JSON")
    g.add_argument("--device", help="override the config's device (auto, cpu, cuda, cuda:N)")
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(handler=_cli)


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)
    spec = config_lib.trained_experiment(cfg, args.experiment, "it has no generator")
    ps = _check_study_args(args.p, args.batches, args.seed)
    images, labels = load_samples(Path(args.data))
    device = resolve_device(args.device or cfg["device"])
    model = load_generator(Path(args.generator), device)
    stored = read_generator_file(Path(args.generator))
    if stored.get("experiment") not in (None, args.experiment):
        raise ValueError(
            f"{args.generator} was trained for experiment {stored['experiment']!r}, "
            f"not {args.experiment!r}"
        )
    try:
        result = gradient_study(
            model,
            spec,
            images,
            labels,
            ps,
            args.batches,
            args.seed,
            device,
            progress=not args.no_progress,
        )
    except ValueError as err:
        raise ValueError(f"{args.generator} with {args.data}: {err}") from None
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("experiment", "p", "bias_relative")}))
    return 0
