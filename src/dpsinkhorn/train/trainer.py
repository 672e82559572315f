"""DP-Sinkhorn training (paper Algorithm 1): the explicit training step, one readable file.

One step:
    1. draw n + n' latent codes and uniform labels; X = g(z, label)
    2. draw the real batch Y by Poisson sampling (rate q = B / N) as a fixed-shape
       buffer of ``capacity`` rows with 0/1 weights (see ``privacy.sampler.PoissonSampler``)
    3. S = 2 W(X[0:n], Y) − W(X[0:n], X[n':n+n'])  on [image, α_c · onehot]
       (cost ``mixed`` | ``l2`` | ``l1``, see ``ot.solver.mixed_cost``)
    4. ∇_X S in closed form from the fixed-schedule solver (``ot``); with
       ``perturbation: image`` (default) it is clipped and noised
       (``privacy.mechanism.ImageGradientSanitizer``) before the generator's backward pass;
       with ``perturbation: parameter`` the whole parameter gradient ∇_θ S is
       clipped and noised after the backward pass
       (``privacy.mechanism.ParameterGradientSanitizer``, the paper's Table 2 baseline)
    5. optimiser step on the generator; the accountant records one step

Everything the step touches lives on the device; the step has fixed shapes and
never synchronises with the host (the private loss is read only with
``log_private_loss``). Files, checkpoints and the CLI of a run: ``train.run``; K runs
advanced by one batched step: ``train.sweep``.

Randomness. z, labels, Poisson draws and noise come from one generator per run,
keyed with 256 bits from the operating system (``privacy.noise.secret_noise_key``), never
written to a released file; ``reproducible: true`` keys it from the config's seed and
the experiment's name instead (tests, CI; privacy.json then says there is no
guarantee). The config ``seed`` still sets the generator's initial weights.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.data import datasets as data
from dpsinkhorn.data.catalog import dataset_info
from dpsinkhorn.models import GeneratorConfig, GeneratorPrecision, build_generator
from dpsinkhorn.ot.loss import (
    conditional_features,
    debias_size,
    feature_diameter,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.privacy.accounting import PrivacyAccountant, paper_convention_epsilon
from dpsinkhorn.privacy.budget import budget_of
from dpsinkhorn.privacy.mechanism import ImageGradientSanitizer, ParameterGradientSanitizer
from dpsinkhorn.privacy.noise import (
    NO_GUARANTEE_PUBLIC_SEED,
    keyed_generator,
    public_noise_key,
    rng_state_bytes,
    rng_state_tensor,
    secret_noise_key,
)
from dpsinkhorn.privacy.sampler import PoissonSampler
from dpsinkhorn.train import memory


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 (hex) of the training data: shapes, dtypes and bytes of images and labels.

    Part of the checkpoint's ``spec_hash``, so a resume on other data is refused. Kept
    in the private workspace only (it identifies the private dataset)."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(images), np.ascontiguousarray(labels)):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


class GraphedStep:
    """Runs a step's device work from a CUDA graph: eager warm-up, one capture, then replays.

    A step of the paper's MNIST model is ~460 small operations (``dpsinkhorn bench``
    reports ``ops_per_step``); on a GPU their launches, not their arithmetic, bound the
    step rate. Replaying a graph launches them all at once. ``device_step`` must do only
    device work with fixed shapes, no host synchronisation and every random draw from
    the ``trainers``' generators (true of ``Trainer.device_step`` and the sweep's step;
    ``tests/test_bench.py`` checks the absence of synchronisation); the generators are
    registered with the graph, so each replay draws fresh z, labels, Poisson samples and
    noise. Host bookkeeping (step counters, privacy ledgers) stays outside the graph:
    the caller counts each call as one step. The first ``WARMUP_STEPS`` calls run
    eagerly on a side stream, as capture requires; they are ordinary training steps.
    CUDA only.
    """

    WARMUP_STEPS = 3

    def __init__(self, device_step, trainers: list[Trainer], device: torch.device):
        self.device_step, self.trainers, self.device = device_step, trainers, device
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self):
        """One step's device work; returns what ``device_step`` returns (copied on replay)."""
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
        if isinstance(self.output, torch.Tensor):
            return self.output.clone()
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


class Trainer:
    """Holds the state of one training run and performs single steps.

    ``spec``: a validated experiment dict (``config.experiment``), read once into
    ``settings`` (:class:`ExperimentSpec`); the dict stays what ``spec_hash`` hashes.
    ``fingerprint`` and ``real_features`` let a sweep hash the data and put its
    features on the device once for all its runs.
    """

    def __init__(
        self,
        spec: dict,
        train_images,
        train_labels,
        device: torch.device,
        cuda_graphs: bool = False,
        compile_solver: bool = False,
        precision: str = "fp32",
        fingerprint: str | None = None,
        real_features: torch.Tensor | None = None,
    ):
        self.spec, self.device = spec, device
        self.settings = settings = ExperimentSpec.from_dict(spec)
        # Replay the step from a CUDA graph (GraphedStep); CUDA only, ignored elsewhere.
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.compile_solver = compile_solver  # torch.compile the Sinkhorn iterations
        self.precision = GeneratorPrecision(precision, device)  # the generator's arithmetic
        self.n = settings.batch_size
        self.n_prime = debias_size(self.n, settings.p)
        num_records = len(train_labels)
        self.q = self.n / num_records
        if self.n > num_records:
            raise memory.TooLargeError(
                "batch_size",
                f"batch_size {self.n} is larger than the {num_records} training records of "
                f"{settings.dataset}: the sampling rate q = batch_size / N must be at most 1",
            )
        # From the dataset's definition, never from the private labels (a label held by
        # one record would change the embedding's shape).
        self.num_classes = dataset_info(settings.dataset).num_classes
        if len(train_labels) and (train_labels.min() < 0 or train_labels.max() >= self.num_classes):
            raise ValueError(
                f"experiment {settings.name}: training labels must lie in "
                f"[0, {self.num_classes}) for dataset {settings.dataset}"
            )
        self.private = settings.private
        self.reproducible = settings.reproducible
        self.fingerprint = fingerprint or data_fingerprint(train_images, train_labels)

        # Real data: conditional features resident on the device.
        images = data.to_unit_range(train_images).to(device)
        labels = torch.as_tensor(train_labels, device=device)
        self.image_shape = tuple(images.shape[1:])
        if real_features is None:
            real_features = conditional_features(images, labels, self.num_classes, settings.alpha_c)
        self.real = real_features
        self.cost = settings.cost
        self.diameter = feature_diameter(images[0].numel(), settings.alpha_c, self.cost)

        torch.manual_seed(settings.seed)
        self.model_config = GeneratorConfig(
            num_classes=self.num_classes,
            latent_dim=settings.latent_dim,
            embed_dim=settings.embed_dim,
            channels=settings.channels,
            out_channels=self.image_shape[0],
            # CelebA (Table 3/6): generator kind from the config; size from the data.
            architecture=settings.generator,
            image_size=self.image_shape[1],
        )
        self.model = build_generator(self.model_config).to(device)
        # How the optimiser executes, not what it computes: one fused kernel for all
        # parameters where PyTorch has one (instead of ~10 operations per parameter
        # tensor), and the step count on the device when the step is a CUDA graph.
        self.optimizer_flags = {"fused": device.type in ("cpu", "cuda") or None}
        if settings.optimizer == "adam":
            self.optimizer_flags["capturable"] = self.cuda_graphs
            self.optimizer = torch.optim.Adam(
                self.model.parameters(),
                lr=settings.lr,
                betas=settings.betas,
                weight_decay=settings.weight_decay,
                **self.optimizer_flags,
            )
        else:
            self.optimizer = torch.optim.SGD(
                self.model.parameters(),
                lr=settings.lr,
                weight_decay=settings.weight_decay,
                **self.optimizer_flags,
            )
        # Draws of z, labels, Poisson samples and noise: a secret key per run, or, in
        # reproducible mode, a public one from (seed, experiment name).
        key = (
            public_noise_key(settings.seed, settings.name)
            if self.reproducible
            else secret_noise_key()
        )
        self.rng = keyed_generator(key, device)
        del key
        self.sampler = PoissonSampler(num_records, self.q, device)
        self.memory_bytes = memory.step_bytes(  # refused below if the device cannot hold it
            self.n,
            self.n_prime,
            self.sampler.capacity,
            num_records,
            self.real.shape[1],
            memory.activation_bytes_per_row(self.model),
        )
        memory.check_fits(
            self.memory_bytes, device, f"batch_size {self.n} (q = {self.q:.4g}, {settings.name})"
        )

        self.perturbation = settings.perturbation
        self.epsilon_convention = settings.epsilon_convention
        if self.private:
            if self.perturbation == "parameter" and settings.clipping != "batch":
                raise ValueError(
                    f"experiment {settings.name}: perturbation parameter clips the whole "
                    f"parameter gradient as one vector; clipping must be batch, "
                    f"not {settings.clipping}"
                )
            sigma, self.total_steps = budget_of(spec, num_records)
            if self.perturbation == "image":
                self.sanitizer = ImageGradientSanitizer(
                    self.n, self.n_prime, settings.clip, sigma, settings.clipping, self.rng
                )
            elif self.perturbation == "parameter":
                self.sanitizer = ParameterGradientSanitizer(settings.clip, sigma, self.rng)
            else:
                raise ValueError(
                    f"experiment {settings.name}: perturbation must be image or parameter, "
                    f"got {self.perturbation!r}"
                )
            self.accountant = PrivacyAccountant(
                self.q, self.sanitizer.noise_multiplier, settings.delta, settings.accountant
            )
        else:
            if settings.steps is None:
                raise ValueError(f"experiment {settings.name}: non-private training needs steps")
            self.total_steps, self.sanitizer, self.accountant = int(settings.steps), None, None
        self.step_count = 0
        self.graphed = GraphedStep(self.device_step, [self], device) if self.cuda_graphs else None

    def step(self) -> torch.Tensor:
        """One training step; returns the loss as a device tensor (no host sync)."""
        loss = self.graphed() if self.graphed is not None else self.device_step()
        self.count_step()
        return loss

    def device_step(self) -> torch.Tensor:
        """The device work of one step (draws, loss, sanitised backward, optimiser step).

        Fixed shapes, no host synchronisation, every random draw from ``self.rng``:
        what :class:`GraphedStep` records. Returns the loss (device scalar).
        """
        with self.precision.step():
            loss = self.forward_backward()
            self.apply_update()
        return loss

    def forward_backward(self) -> torch.Tensor:
        """Draws, loss and the sanitised backward pass: leaves ∇_θ in the parameters'
        ``.grad`` (not yet sanitised for ``perturbation: parameter``); returns the loss."""
        settings = self.settings
        z, labels = self.model.sample_inputs(self.n + self.n_prime, self.rng, self.device)
        with self.precision.forward():
            images = self.model(z, labels)
        x = conditional_features(
            images.detach().float(), labels, self.num_classes, settings.alpha_c
        )
        indices, weights = self.sampler.sample(self.rng)
        loss, grad_x = semi_debiased_sinkhorn_with_grad(
            x,
            self.real[indices],
            weights,
            self.n,
            settings.p,
            settings.entropy_reg,
            settings.m,
            scaling=settings.sinkhorn_scaling,
            diameter=self.diameter,
            cost=self.cost,
            compile=self.compile_solver,
        )
        grad_images = grad_x[:, : images[0].numel()].reshape(images.shape)  # ∇_X S
        if isinstance(self.sanitizer, ImageGradientSanitizer):
            grad_images = self.sanitizer(grad_images)  # clip + noise before backprop
        self.optimizer.zero_grad(set_to_none=True)
        images.backward(grad_images.to(images.dtype))  # float32 -> bf16: post-processing
        return loss

    def apply_update(self) -> None:
        """After backward: sanitise the parameter gradient (``perturbation: parameter``)
        and take the optimiser step (device work only)."""
        if isinstance(self.sanitizer, ParameterGradientSanitizer):
            self.sanitizer.apply(self.model.parameters())
        self.optimizer.step()

    def count_step(self) -> None:
        """Record one step taken: the step counter and the privacy ledger (host only)."""
        if self.accountant is not None:
            self.accountant.step()
        self.step_count += 1

    def epsilon(self) -> float:
        return self.accountant.epsilon() if self.accountant is not None else math.inf

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state_bytes(self.rng),  # bytes: immune to torch.load's map_location
            "accountant": self.accountant.state_dict() if self.accountant else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        self.model.load_state_dict(state["model"])
        # A saved optimiser brings its execution flags along; keep this process's
        # (a run may resume with or without CUDA graphs, or from an older checkpoint).
        optimizer = {**state["optimizer"]}
        optimizer["param_groups"] = [
            {**group, **self.optimizer_flags} for group in optimizer["param_groups"]
        ]
        self.optimizer.load_state_dict(optimizer)
        self.rng.set_state(rng_state_tensor(state["rng"]))  # a CPU ByteTensor, any device
        if self.accountant is not None:
            self.accountant.load_state_dict(state["accountant"])
            if self.accountant.steps != self.step_count:
                raise ValueError(
                    f"checkpoint ledger counts {self.accountant.steps} steps "
                    f"but the model has taken {self.step_count}"
                )

    def privacy_record(self) -> dict:
        """Content of privacy.json."""
        base = {
            "experiment": self.settings.name,
            "method": self.settings.method,
            "q": self.q,
            "batch_size": self.n,
            "n_prime": self.n_prime,
            "steps": self.step_count,
            "poisson_capacity": self.sampler.capacity,
            "reproducible": self.reproducible,
        }
        if self.sanitizer is None:
            return {
                **base,
                "private": False,
                "epsilon": None,
                "epsilon_paper_convention": None,
                "guarantee": None,
            }
        s = self.sanitizer
        if self.perturbation == "parameter":
            mechanism = (
                "Gaussian mechanism on the generator's parameter gradient (all parameters "
                "as one vector, clipped to L2 norm clip and noised), Poisson sampling, "
                "add/remove-one adjacency"
            )
        else:
            mechanism = (
                "Gaussian mechanism on the gradient w.r.t. generated images "
                "(rows 0:n clipped and noised; rows n:n+n' clipped only), Poisson sampling, "
                "add/remove-one adjacency"
            )
        epsilon = self.epsilon()
        overflow = self.sampler.overflow_probability
        # (ε, δ + (1 + e^ε)·T·p)-DP: the coupling bound in PoissonSampler's docstring.
        delta_overflow = (1 + math.exp(min(epsilon, 700))) * self.step_count * overflow
        delta_total = self.accountant.delta + delta_overflow
        if self.reproducible:
            guarantee = NO_GUARANTEE_PUBLIC_SEED
        else:
            guarantee = (
                f"(epsilon, delta)-DP with epsilon = {epsilon:.6g}, delta = {delta_total:.6g} "
                "for generator.pt and everything computed from it, under add/remove-one "
                "adjacency, N public, a secret noise key, and the Gaussian noise sampled "
                "exactly (float32 noise is a known limitation)"
            )
        return {
            **base,
            "private": True,
            "guarantee": guarantee,
            "perturbation": self.perturbation,
            "mechanism": mechanism,
            "clipping": s.clipping,
            "clip": s.clip,
            "sigma": s.sigma,
            "noise_std": s.noise_std,
            "sensitivity": s.sensitivity,
            "noise_multiplier": s.noise_multiplier,
            "delta": self.accountant.delta,
            "poisson_overflow_probability_per_step": overflow,
            "delta_poisson_overflow": delta_overflow,
            "delta_total": delta_total,
            "delta_total_note": "delta of the accountant plus (1 + e^epsilon) x steps x the "
            "per-step probability that the Poisson sample exceeded the buffer (then it is "
            "truncated); epsilon holds at delta_total",
            "target_epsilon": self.settings.target_epsilon,
            "epsilon_convention": self.epsilon_convention,
            "epsilon_convention_note": "convention under which target_epsilon solved sigma "
            "or steps; epsilon is always the sound accountant's",
            "epsilon": epsilon,
            "epsilon_paper_convention": paper_convention_epsilon(
                self.q, s.sigma, self.step_count, self.n, self.accountant.delta
            ),
            "epsilon_paper_convention_note": "compute_rdp(q, sigma, steps*n) as in the paper; "
            "not a valid guarantee for this mechanism",
            "accountant": f"{self.accountant.kind} ({PrivacyAccountant.describe()})",
        }


def spec_hash(spec: dict, fingerprint: str = "") -> str:
    """Identifies what a checkpoint computes: the settings (bookkeeping keys aside) and
    the training data's :func:`data_fingerprint`."""
    content = config_lib.experiment_spec_of(spec) + "|data:" + fingerprint
    return hashlib.sha256(content.encode()).hexdigest()[:16]
