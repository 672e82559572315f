"""DP-Sinkhorn training (paper Algorithm 1): config in, checkpoints and generator out.

One step:
    1. draw n + n' latent codes and uniform labels; X = g(z, label)
    2. draw the real batch Y by Poisson sampling (rate q = B / N) as a fixed-shape
       buffer of ``capacity`` rows with 0/1 weights (see ``PoissonSampler``)
    3. S = 2 W(X[0:n], Y) − W(X[0:n], X[n':n+n'])  on [image, α_c · onehot]
       (cost ``mixed`` | ``l2`` | ``l1``, see ``loss.mixed_cost``)
    4. ∇_X S in closed form from the fixed-schedule solver (``ot``); with
       ``perturbation: image`` (default) it is clipped and noised
       (``privacy.ImageGradientSanitizer``) before the generator's backward pass;
       with ``perturbation: parameter`` the whole parameter gradient ∇_θ S is
       clipped and noised after the backward pass
       (``privacy.ParameterGradientSanitizer``, the paper's Table 2 baseline)
    5. optimiser step on the generator; the accountant records one step

Everything the step touches lives on the device; the step has fixed shapes and
never synchronises with the host (the private loss is read only with
``log_private_loss``). A checkpoint (model, optimiser, RNG, privacy ledger, log) is
written atomically every ``checkpoint_every`` steps and on SIGTERM / SIGUSR1 (exit 75,
resubmit) / SIGINT (exit 130, stop); rerunning resumes from it, bit-identical on CPU to
an uninterrupted run at the same number of threads (``torch.get_num_threads()``, in
privacy.json).

Release and workspace. ``<out>/`` receives only what depends on the private data
through the sanitised gradient: generator.pt, privacy.json and train_log.csv (step,
ε spent, steps/s, elapsed time). Checkpoints (with the secret RNG state) and the
optional private-loss log live in ``<out>/private_workspace/`` (:data:`WORKSPACE`),
which is deleted when the run completes unless ``keep_private_workspace: true``.

Randomness. z, labels, Poisson draws and noise come from one generator per run,
keyed with 256 bits from the operating system (``privacy.secret_noise_key``), never
written to a released file; ``reproducible: true`` keys it from the config's seed and
the experiment's name instead (tests, CI; privacy.json then says there is no
guarantee). The config ``seed`` still sets the generator's initial weights.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io as _io
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binom
from tqdm import tqdm

from dpsinkhorn import config as config_lib
from dpsinkhorn.data import datasets as data
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.fileio import (
    NoSpaceError,
    check_samples,
    remove_stale_temps,
    torch_bytes,
    write_all,
    write_bytes,
    write_text,
)
from dpsinkhorn.models import (
    PRECISIONS,
    GeneratorConfig,
    GeneratorPrecision,
    build_generator,
)
from dpsinkhorn.ot.loss import (
    conditional_features,
    debias_size,
    feature_diameter,
    semi_debiased_sinkhorn_with_grad,
)
from dpsinkhorn.privacy.core import (
    NO_GUARANTEE_PUBLIC_SEED,
    ImageGradientSanitizer,
    ParameterGradientSanitizer,
    PrivacyAccountant,
    keyed_generator,
    paper_convention_epsilon,
    public_noise_key,
    resolve_budget,
    rng_state_bytes,
    rng_state_tensor,
    secret_noise_key,
)
from dpsinkhorn.train import memory
from dpsinkhorn.train.runlock import OutputLock

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: checkpoint written, rerun to resume
# A stop that retrying cannot fix (SIGINT, bad input) leaves this note in the output
# folder; a workflow retry (``--attempt`` > 1) finds it and ends at once.
STOPPED_NAME = ".dpsinkhorn.stopped"
# SIGINT (the user's Ctrl-C): checkpoint written, but the user asked to stop, so the
# workflow must not resubmit it (128 + SIGINT, the shell's convention; see
# ``retry_training`` and workflow/rules/train.smk).
INTERRUPTED_EXIT_CODE = 130
#: train_log.csv (released): nothing computed on the private data.
LOG_COLUMNS = ["step", "epsilon", "steps_per_s", "elapsed_s"]
#: private_workspace/private_loss.csv (``log_private_loss: true``): the un-noised loss S.
PRIVATE_LOG_COLUMNS = ["step", "loss"]
#: The folder, inside a run's output folder, that must never be shared.
WORKSPACE = "private_workspace"
WORKSPACE_README = """PRIVATE: DO NOT SHARE OR PUBLISH THIS FOLDER.

It holds training checkpoints (with the secret state of the random generator that drew
the privacy noise and the Poisson samples) and, with log_private_loss, the un-noised
loss on private data. None of it is covered by the (epsilon, delta) guarantee in
../privacy.json. dpsinkhorn deletes it when training completes, unless the config sets
keep_private_workspace: true.
"""


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 (hex) of the training data: shapes, dtypes and bytes of images and labels.

    Part of the checkpoint's ``spec_hash``, so a resume on other data is refused. Kept
    in the private workspace only (it identifies the private dataset)."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(images), np.ascontiguousarray(labels)):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


#: Per-step probability that a Poisson sample overflows the buffer (at most). Its charge to
#: δ is (1 + e^ε)·T·p (see PoissonSampler): at ε = 10 and T = 1.7e6 steps that is 4e-8
#: at 1e-18, against δ ≥ 1e-6; the buffer grows from 108 to 123 rows at B = 50, N = 60k.
OVERFLOW_TAIL = 1e-18


def overflow_capacity(num_records: int, rate: float, tail: float) -> int:
    """Smallest c ≤ N with P(Binomial(N + 1, rate) > c) ≤ ``tail``, by upward search
    (scipy's ``binom.isf`` loses precision below a tail of about 1e-16)."""
    c = int(min(num_records, math.floor(rate * (num_records + 1))))
    while c < num_records and binom.sf(c, num_records + 1, rate) > tail:
        c += 1
    return c


class PoissonSampler:
    """Poisson sampling (each record independently with probability q) in fixed shape.

    One vectorised draw u ~ U(0,1)^N in float64 selects the records with u < q
    (float64, so P(u < q) = q to 1e-16; float32 uniforms would raise the rate to
    q·(1 + 7e-5) at q = 1/1200). The ``capacity`` smallest u are returned with weight
    1 where u < q, else 0, so the real batch is exactly the Poisson sample as long as
    it has at most ``capacity`` records. Capacity is the smallest c with
    P(Binomial(N + 1, q) > c) ≤ ``OVERFLOW_TAIL`` (N + 1: the larger of two neighbouring
    datasets under add/remove adjacency). An overflow is handled, not fatal: the batch
    is then a uniformly random subset of ``capacity`` of the sampled records.

    Privacy cost of overflows (charged in :meth:`Trainer.privacy_record`). Couple the
    trained mechanism M' with the ideal Poisson-subsampled Gaussian M through the same
    draws: they differ only if some step overflows, an event E with P(E) ≤ η = T·p
    (``overflow_probability`` p per step, for either neighbour). For any output set S,
    P[M'(D) ∈ S] ≤ P[M(D) ∈ S] + η ≤ e^ε P[M(D') ∈ S] + δ + η
    ≤ e^ε P[M'(D') ∈ S] + δ + (1 + e^ε)·η, so M' is (ε, δ + (1 + e^ε)·T·p)-DP.
    Overflows are counted on the device.
    """

    def __init__(
        self, num_records: int, rate: float, device: torch.device, tail: float = OVERFLOW_TAIL
    ):
        self.num_records, self.rate = num_records, rate
        self.capacity = overflow_capacity(num_records, rate, tail)
        self.overflows = torch.zeros((), dtype=torch.long, device=device)
        self.device = device

    @property
    def overflow_probability(self) -> float:
        """P(more than ``capacity`` records sampled) in one step, for the larger
        neighbour (N + 1 records): binom.sf(capacity; N + 1, q)."""
        return float(binom.sf(self.capacity, self.num_records + 1, self.rate))

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (indices [capacity] int64, weights [capacity] float 0/1)."""
        u = torch.rand(
            self.num_records, generator=generator, device=self.device, dtype=torch.float64
        )
        indices, weights, overflow = self.select(u)
        self.overflows += overflow
        return indices, weights

    def select(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sample that uniforms ``u`` [..., N] (one row per draw) make: indices
        [..., capacity], weights [..., capacity] and overflow [...] (1 where more than
        ``capacity`` records were sampled, else 0). Batched over the leading dimensions,
        as a sweep draws for all its runs; ``sample`` is the single draw."""
        values, indices = torch.topk(u, self.capacity, dim=-1, largest=False, sorted=True)
        overflow = ((u < self.rate).sum(-1) > self.capacity).long()
        return indices, (values < self.rate).float(), overflow


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
    """Holds the state of one training run and performs single steps."""

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
    ):
        self.spec, self.device = spec, device
        # Replay the step from a CUDA graph (GraphedStep); CUDA only, ignored elsewhere.
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.compile_solver = compile_solver  # torch.compile the Sinkhorn iterations
        self.precision = GeneratorPrecision(precision, device)  # the generator's arithmetic
        self.n = int(spec["batch_size"])
        self.n_prime = debias_size(self.n, float(spec["p"]))
        num_records = len(train_labels)
        self.q = self.n / num_records
        if self.n > num_records:
            raise memory.TooLargeError(
                "batch_size",
                f"batch_size {self.n} is larger than the {num_records} training records of "
                f"{spec['dataset']}: the sampling rate q = batch_size / N must be at most 1",
            )
        # From the dataset's definition, never from the private labels (a label held by
        # one record would change the embedding's shape).
        self.num_classes = data.dataset_info(spec["dataset"]).num_classes
        if len(train_labels) and (train_labels.min() < 0 or train_labels.max() >= self.num_classes):
            raise ValueError(
                f"experiment {spec['name']}: training labels must lie in "
                f"[0, {self.num_classes}) for dataset {spec['dataset']}"
            )
        self.private = spec["method"] == "dp_sinkhorn"
        self.reproducible = bool(spec.get("reproducible", False))
        self.fingerprint = fingerprint or data_fingerprint(train_images, train_labels)

        # Real data: conditional features resident on the device.
        images = data.to_unit_range(train_images).to(device)
        labels = torch.as_tensor(train_labels, device=device)
        self.image_shape = tuple(images.shape[1:])
        self.real = conditional_features(images, labels, self.num_classes, spec["alpha_c"])
        self.cost = spec.get("cost", "mixed")
        self.diameter = feature_diameter(images[0].numel(), spec["alpha_c"], self.cost)

        torch.manual_seed(int(spec["seed"]))
        self.model_config = GeneratorConfig(
            num_classes=self.num_classes,
            latent_dim=int(spec["latent_dim"]),
            embed_dim=int(spec["embed_dim"]),
            channels=tuple(spec["channels"]),
            out_channels=self.image_shape[0],
            # CelebA (Table 3/6): generator kind from the config; size from the data.
            architecture=spec.get("generator", "dcgan"),
            image_size=self.image_shape[1],
        )
        self.model = build_generator(self.model_config).to(device)
        # How the optimiser executes, not what it computes: one fused kernel for all
        # parameters where PyTorch has one (instead of ~10 operations per parameter
        # tensor), and the step count on the device when the step is a CUDA graph.
        self.optimizer_flags = {"fused": device.type in ("cpu", "cuda") or None}
        if spec["optimizer"] == "adam":
            self.optimizer_flags["capturable"] = self.cuda_graphs
            self.optimizer = torch.optim.Adam(
                self.model.parameters(),
                lr=spec["lr"],
                betas=tuple(spec["betas"]),
                weight_decay=spec["weight_decay"],
                **self.optimizer_flags,
            )
        else:
            self.optimizer = torch.optim.SGD(
                self.model.parameters(),
                lr=spec["lr"],
                weight_decay=spec["weight_decay"],
                **self.optimizer_flags,
            )
        # Draws of z, labels, Poisson samples and noise: a secret key per run, or, in
        # reproducible mode, a public one from (seed, experiment name).
        key = (
            public_noise_key(int(spec["seed"]), spec["name"])
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
            self.memory_bytes, device, f"batch_size {self.n} (q = {self.q:.4g}, {spec['name']})"
        )

        self.perturbation = spec.get("perturbation", "image")
        self.epsilon_convention = spec.get("epsilon_convention", "sound")
        if self.private:
            if self.perturbation == "parameter" and spec["clipping"] != "batch":
                raise ValueError(
                    f"experiment {spec['name']}: perturbation parameter clips the whole "
                    f"parameter gradient as one vector; clipping must be batch, "
                    f"not {spec['clipping']}"
                )
            sigma, self.total_steps = resolve_budget(
                sigma=spec["sigma"],
                steps=spec["steps"],
                target_epsilon=spec["target_epsilon"],
                q=self.q,
                batch_size=self.n,
                delta=spec["delta"],
                clipping=spec["clipping"],
                accountant=spec["accountant"],
                convention=self.epsilon_convention,
            )
            if self.perturbation == "image":
                self.sanitizer = ImageGradientSanitizer(
                    self.n, self.n_prime, spec["clip"], sigma, spec["clipping"], self.rng
                )
            elif self.perturbation == "parameter":
                self.sanitizer = ParameterGradientSanitizer(spec["clip"], sigma, self.rng)
            else:
                raise ValueError(
                    f"experiment {spec['name']}: perturbation must be image or parameter, "
                    f"got {self.perturbation!r}"
                )
            self.accountant = PrivacyAccountant(
                self.q, self.sanitizer.noise_multiplier, spec["delta"], spec["accountant"]
            )
        else:
            if spec["steps"] is None:
                raise ValueError(f"experiment {spec['name']}: non-private training needs steps")
            self.total_steps, self.sanitizer, self.accountant = int(spec["steps"]), None, None
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
        spec = self.spec
        z, labels = self.model.sample_inputs(self.n + self.n_prime, self.rng, self.device)
        with self.precision.forward():
            images = self.model(z, labels)
        x = conditional_features(images.detach().float(), labels, self.num_classes, spec["alpha_c"])
        indices, weights = self.sampler.sample(self.rng)
        loss, grad_x = semi_debiased_sinkhorn_with_grad(
            x,
            self.real[indices],
            weights,
            self.n,
            spec["p"],
            spec["entropy_reg"],
            spec["m"],
            scaling=spec["sinkhorn_scaling"],
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
            "experiment": self.spec["name"],
            "method": self.spec["method"],
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
            "target_epsilon": self.spec["target_epsilon"],
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


class _StopSignal:
    """Turns SIGTERM, SIGUSR1 (SLURM's warning before a time limit) and SIGINT (Ctrl-C)
    into a flag checked between steps, so the step in flight completes and is checkpointed."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None

    def __enter__(self):
        self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def should_stop(self, new_steps: int, stop_after: int | None) -> bool:
        """A signal arrived, or this process has taken ``stop_after`` new steps."""
        return self.received is not None or (stop_after is not None and new_steps >= stop_after)

    def reason(self, stop_after: int | None, where: str) -> str:
        """Why training stopped, and ``where`` its checkpoints are (for ``Preempted``)."""
        why = f"signal {self.received}" if self.received is not None else f"stop_after={stop_after}"
        if self.received == signal.SIGINT:
            why = "interrupted (SIGINT)"
        return f"{why}: {where}; rerun to resume"

    def preempted(self, stop_after: int | None, where: str) -> Preempted:
        """The ``Preempted`` to raise; ``interrupted`` when the signal was SIGINT."""
        return Preempted(self.reason(stop_after, where), self.received == signal.SIGINT)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Preempted(Exception):
    """Training stopped early (signal or ``stop_after``) after writing a checkpoint.

    ``interrupted``: the signal was SIGINT, a user's stop (not a scheduler's).
    """

    def __init__(self, message: str, interrupted: bool = False):
        super().__init__(message)
        self.interrupted = interrupted


@contextlib.contextmanager
def released_on_error(runs: list[RunFiles]):
    """Release the runs' output-folder locks if the block raises (``finish`` releases
    them otherwise), so a stopped run in this process does not block the next one."""
    try:
        yield
    except BaseException:
        for run in runs:
            run.release()
        raise


def _save_checkpoint(
    path: Path, trainer: Trainer, log_rows: list[dict], private_rows: list[dict], digest: str
) -> None:
    state = {
        **trainer.state_dict(),
        "log": log_rows,
        "private_log": private_rows,
        "spec_hash": digest,
    }
    # Serialised in memory, then written: a full disk is an OSError naming the file
    # (io.NoSpaceError), not torch's "basic_ios::clear: iostream error".
    write_bytes(path, torch_bytes(state))


class CheckpointError(ValueError):
    """checkpoint.pt cannot be read (truncated, corrupt, not ours); the message names it."""


def _load_checkpoint(path: Path, device: torch.device) -> dict:
    """Read a checkpoint, or raise ``CheckpointError`` naming the file and what to do."""
    try:
        state = torch.load(path, map_location=device, weights_only=False)
        if not isinstance(state, dict) or not {"step", "model", "spec_hash"} <= set(state):
            raise ValueError("not a dpsinkhorn training checkpoint")
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"checkpoint {path} is damaged and cannot be resumed ({type(err).__name__}: "
            f"{reason}); delete it to train this run again from step 0, or put back a "
            "good copy"
        ) from err
    return state


def _write_log(path: Path, rows: list[dict], columns: list[str] = LOG_COLUMNS) -> None:
    buf = _io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())


OUTPUT_FILES = ("generator.pt", "privacy.json", "train_log.csv")


class RunFiles:
    """One run's files: the release in ``out_dir``, checkpoints in its private workspace.

    ``out_dir`` gets generator.pt, privacy.json and train_log.csv (no private-data value
    outside the mechanism). ``out_dir/private_workspace/`` (:data:`WORKSPACE`) holds
    checkpoint.pt (model, optimiser, secret RNG state, ledger, logs, ``spec_hash`` with the
    data fingerprint) and, with ``log_private_loss``, private_loss.csv; it is deleted by
    :meth:`finish` unless ``keep_private_workspace``. Shared by :func:`train` (one run)
    and ``dpsinkhorn.train.sweep`` (K runs in one process), so a run writes the same files, and
    resumes from the same checkpoint, either way.
    """

    def __init__(self, trainer: Trainer, out_dir: Path):
        self.trainer, self.spec = trainer, trainer.spec
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # One writer per output folder (runlock): refused here, before anything is read.
        self.lock = OutputLock(self.out_dir).acquire()
        if self.lock.taken_over:
            print(f"{self.out_dir}: taking over the lock of {self.lock.taken_over}, gone")
        self.workspace = self.out_dir / WORKSPACE
        self.workspace.mkdir(parents=True, exist_ok=True)
        readme = self.workspace / "README.txt"
        if not readme.exists():
            write_text(readme, WORKSPACE_README)
        legacy = self.out_dir / "checkpoint.pt"  # where versions before the workspace kept it
        if legacy.exists():  # holds the RNG state: out of the release folder, deleted at the end
            legacy.replace(self.workspace / "legacy_checkpoint.pt")
            print(f"moved {legacy} (not resumable: older format) into {self.workspace}")
        self.ckpt_path = self.workspace / "checkpoint.pt"
        self.digest = spec_hash(self.spec, trainer.fingerprint)
        self.log_private_loss = bool(self.spec.get("log_private_loss", False))
        # A private-loss log is only useful if kept: log_private_loss keeps the workspace.
        self.keep_workspace = self.log_private_loss or bool(
            self.spec.get("keep_private_workspace", False)
        )
        # Temporary files of a writer killed mid-write (SIGKILL); no one else writes here.
        for name in (self.ckpt_path, *(self.out_dir / f for f in OUTPUT_FILES)):
            remove_stale_temps(name)
        self.log_rows: list[dict] = []
        self.private_rows: list[dict] = []
        if self.ckpt_path.exists():
            # On the CPU: model and optimiser state are copied to the trainer's device by
            # load_state_dict; the RNG state must stay a CPU ByteTensor (set_state).
            state = _load_checkpoint(self.ckpt_path, torch.device("cpu"))
            if state.get("spec_hash") == self.digest:
                trainer.load_state_dict(state)
                self.log_rows = state["log"]
                self.private_rows = state.get("private_log", [])
            else:
                # Not printed: job logs are released, and whether the data changed since the
                # checkpoint is a fact about the private data. Noted in the workspace only.
                write_text(
                    self.workspace / "ignored_checkpoint.txt",
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}: ignored the checkpoint at step "
                    f"{state.get('step')}: it belongs to other settings or other training "
                    "data; started afresh\n",
                )
        self.start_step, self.t0 = trainer.step_count, time.perf_counter()

    @property
    def done(self) -> bool:
        return self.trainer.step_count >= self.trainer.total_steps

    def after_step(self, loss: torch.Tensor) -> dict | None:
        """Log every ``log_every`` steps (and the last), checkpoint every ``checkpoint_every``.

        Returns the new (public) log row, if one was written. The private loss is read
        (a device sync) only with ``log_private_loss``, into the workspace.
        """
        step, row = self.trainer.step_count, None
        if step % int(self.spec["log_every"]) == 0 or self.done:
            elapsed = time.perf_counter() - self.t0
            row = {
                "step": step,
                "epsilon": self.trainer.epsilon(),
                "steps_per_s": (step - self.start_step) / max(elapsed, 1e-9),
                "elapsed_s": elapsed,
            }
            self.log_rows.append(row)
            if self.log_private_loss:
                self.private_rows.append({"step": step, "loss": float(loss)})
        if step % int(self.spec["checkpoint_every"]) == 0:
            self.checkpoint()
        return row

    def checkpoint(self) -> None:
        self._save()
        _write_log(self.out_dir / "train_log.csv", self.log_rows)

    def _save(self) -> None:
        _save_checkpoint(
            self.ckpt_path, self.trainer, self.log_rows, self.private_rows, self.digest
        )
        if self.log_private_loss:
            _write_log(self.workspace / "private_loss.csv", self.private_rows, PRIVATE_LOG_COLUMNS)

    def release(self) -> None:
        """Give up the output folder's lock (``finish`` does it; also on errors)."""
        self.lock.release()

    def finish(self, remove_workspace: bool = True) -> dict:
        """Write generator.pt, privacy.json, train_log.csv; returns the privacy record.

        Then deletes the private workspace (:meth:`remove_workspace`), unless
        ``remove_workspace`` is false (a sweep removes its members' workspaces when all
        have finished, so a preempted sweep knows which members are done). A workspace
        that stays gets the final checkpoint: a rerun finds every step done and only
        rewrites the outputs.
        """
        try:
            return self._finish(remove_workspace)
        finally:
            self.release()

    def _finish(self, remove_workspace: bool) -> dict:
        trainer = self.trainer
        stays = self.keep_workspace or not remove_workspace
        if stays and (trainer.step_count != self.start_step or not self.ckpt_path.exists()):
            self._save()
        generator = {
            "state_dict": trainer.model.state_dict(),
            "model_config": trainer.model_config.to_dict(),
            "dataset": self.spec["dataset"],
            "num_classes": trainer.num_classes,
            "image_shape": list(trainer.image_shape),
            "experiment": self.spec["name"],
            "steps": trainer.step_count,
        }
        payload = torch_bytes(generator)  # deterministic bytes (no file name inside)
        record = {
            **trainer.privacy_record(),
            # identifies the released generator; bit-identical reruns need equal threads
            "content_sha256": hashlib.sha256(payload).hexdigest(),
            "threads": torch.get_num_threads(),
        }
        _write_log(self.out_dir / "train_log.csv", self.log_rows)
        commit_release(
            self.out_dir / "generator.pt",
            payload,
            self.out_dir / "privacy.json",
            (json.dumps(record, indent=2) + "\n").encode(),
        )
        if remove_workspace:
            self.remove_workspace()
        return record

    def remove_workspace(self) -> None:
        """Delete the private workspace, unless the config keeps it."""
        if not self.keep_workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)


def commit_release(generator: Path, payload: bytes, ledger: Path, ledger_bytes: bytes) -> None:
    """Write a generator and its privacy ledger so that the generator never exists alone.

    Both are written in full to temporary files first (a full disk fails there, with
    ``fileio.NoSpaceError`` naming the file, and changes nothing); then an older generator
    is removed, the ledger moved into place, and the generator last (``fileio.write_all``).
    """
    write_all([(ledger, ledger_bytes), (generator, payload)], remove_first=[generator])


def train(
    spec: dict,
    out_dir: Path,
    data_dir: Path | None = None,
    device: str = "auto",
    stop_after: int | None = None,
    progress: bool = True,
    train_data: tuple[np.ndarray, np.ndarray] | None = None,
    cuda_graphs: bool = False,
    compile_solver: bool = False,
    precision: str = "fp32",
) -> dict:
    """Train one experiment into ``out_dir``; returns the privacy record.

    The private data is ``<data_dir>/<dataset>/train.npz``, or ``train_data`` =
    (images uint8 [N,28,28] or [N,28,28,C], labels int64 [N]) for your own data.
    Writes generator.pt, privacy.json and train_log.csv; checkpoints go to
    ``out_dir/private_workspace/``, deleted on completion unless ``keep_private_workspace``
    (then the final checkpoint lets a finished run rerun in seconds). ``stop_after`` ends
    this process after that many new steps (with a checkpoint), as a preemption would; it raises
    ``Preempted``. ``cuda_graphs`` replays the step from a CUDA graph (CUDA devices only,
    see ``GraphedStep``); ``compile_solver`` runs the Sinkhorn iterations through
    ``torch.compile`` (``ot._compiled_iterations``); ``precision`` is the generator's
    arithmetic (``models.GeneratorPrecision``: fp32, tf32, bf16).
    """
    images, labels = load_train_data(spec, data_dir, train_data)
    device = resolve_device(device)
    trainer = Trainer(spec, images, labels, device, cuda_graphs, compile_solver, precision)
    run = RunFiles(trainer, out_dir)
    bar = tqdm(
        total=trainer.total_steps,
        initial=run.start_step,
        desc=spec["name"],
        disable=not progress,
        mininterval=1.0,
    )
    with _StopSignal() as stop, released_on_error([run]):
        while not run.done:
            loss = trainer.step()
            bar.update(1)
            row = run.after_step(loss)
            if row is not None:  # ε only: nothing computed on the private data
                bar.set_postfix(eps=f"{row['epsilon']:.3g}")
            new_steps = trainer.step_count - run.start_step
            if not run.done and stop.should_stop(new_steps, stop_after):
                run.checkpoint()
                bar.close()
                where = f"checkpoint at step {trainer.step_count} in {run.ckpt_path}"
                raise stop.preempted(stop_after, where)
    bar.close()
    return run.finish()


def load_train_data(
    spec: dict, data_dir: Path | None, train_data: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The experiment's private training split (prepared npz or given arrays), checked."""
    if train_data is None:
        if data_dir is None:
            raise ValueError("give data_dir (prepared datasets) or train_data (arrays)")
        train_data = data.load_split(Path(data_dir), spec["dataset"], "train")
    images, labels = train_data
    check_samples(np.asarray(images), np.asarray(labels), "train_data")
    return images, labels


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train one experiment of a config")
    p.add_argument("--experiment", required=True)
    p.add_argument("--out", required=True, help="output folder (results/<run>/<experiment>)")
    add_training_arguments(p)
    p.set_defaults(handler=_cli)


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``dpsinkhorn train`` and ``dpsinkhorn train-sweep``."""
    p.add_argument("--config", nargs="+", required=True, help="config YAML file(s)")
    p.add_argument("--device", help="override the config's device (auto, cpu, cuda, cuda:N)")
    p.add_argument("--data-dir", help="override the config's data_dir")
    p.add_argument("--stop-after", type=int, help="checkpoint and exit after this many steps")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="replay the training step from a CUDA graph (CUDA only; default: config key "
        "cuda_graphs)",
    )
    p.add_argument(
        "--compile-solver",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the Sinkhorn iterations (default: config key compile_solver)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the generator's arithmetic while training (config key precision)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--attempt",
        type=int,
        default=1,
        help="Snakemake's attempt number: a retry (> 1) after a stop that a retry cannot "
        "fix (SIGINT, exit 130; bad input, exit 2) ends at once with the same code",
    )


def run_training_cli(command: str, args: argparse.Namespace, train_fn, specs, outs) -> int:
    """Call ``train_fn(specs, outs, data_dir, ...)`` -> list of privacy records with the CLI
    options; print each record.

    Returns 0, or PREEMPTED_EXIT_CODE (75) after a signal or ``--stop-after`` checkpoint,
    INTERRUPTED_EXIT_CODE (130) after SIGINT (checkpoint written too).
    """
    cfg = config_lib.load_config(args.config)
    markers = [Path(d) / STOPPED_NAME for d in ([outs] if isinstance(outs, Path) else outs)]
    if args.attempt > 1:  # a workflow retry: repeat a final stop instead of running again
        for marker in markers:
            if marker.is_file():
                note = json.loads(marker.read_text())
                print(f"dpsinkhorn {command}: not retried: {note['message']}", file=sys.stderr)
                return int(note["exit_code"])
    for marker in markers:
        marker.unlink(missing_ok=True)
    try:
        records = train_fn(
            specs,
            outs,
            Path(args.data_dir or cfg["data_dir"]),
            device=args.device or cfg["device"],
            stop_after=args.stop_after,
            progress=not args.no_progress,
            cuda_graphs=config_lib.cli_or_config(args.cuda_graphs, cfg, "cuda_graphs"),
            compile_solver=config_lib.cli_or_config(args.compile_solver, cfg, "compile_solver"),
            precision=config_lib.cli_or_config(args.precision, cfg, "precision"),
        )
    except Preempted as stop:
        print(f"dpsinkhorn {command}: {stop}")
        if not stop.interrupted:
            return PREEMPTED_EXIT_CODE  # a scheduler's stop: resubmit and resume
        _final_stop(markers, INTERRUPTED_EXIT_CODE, f"stopped by the user ({stop})")
        return INTERRUPTED_EXIT_CODE
    except (ValueError, FileNotFoundError, KeyError, NoSpaceError) as err:
        if isinstance(err, memory.TooLargeError):  # name the file that set the key
            names = [s["name"] for s in (specs if isinstance(specs, list) else [specs])]
            where = config_lib.setting_source(args.config, names, err.key)
            err = memory.TooLargeError(err.key, f"{where}: {err}")
        _final_stop(markers, 2, str(err))  # cli.main prints it as one line, exit 2
        raise err
    for record in records:
        print(json.dumps({k: record.get(k) for k in ("experiment", "steps", "epsilon")}))
    return 0


def _final_stop(markers: list[Path], exit_code: int, message: str) -> None:
    """Note in each output folder that this run ended in a way a retry cannot fix."""
    for marker in markers:
        write_text(marker, json.dumps({"exit_code": exit_code, "message": message}) + "\n")


def _cli(args: argparse.Namespace) -> int:
    cfg = config_lib.load_config(args.config)
    spec = config_lib.trained_experiment(cfg, args.experiment, "nothing to train")
    return run_training_cli(
        "train",
        args,
        lambda spec, out, *a, **kw: [train(spec, out, *a, **kw)],
        spec,
        Path(args.out),
    )
