"""One training run's state: generator, optimiser, privacy mechanism, ledger, checkpoints.

:class:`GeneratorRun` is what every run holds; a :class:`Trainer` (DP-Sinkhorn) adds the
real features on the device and what ``privacy.factory.make_private`` builds, and steps by
``train.step`` as its K = 1 case. DP-MERF's: ``train.merf.MerfTrainer``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpsinkhorn import config as config_lib
from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.data import datasets as data
from dpsinkhorn.data.catalog import dataset_info
from dpsinkhorn.fileio import check_class_names
from dpsinkhorn.models import GeneratorConfig, GeneratorPrecision, build_generator
from dpsinkhorn.ot.loss import conditional_features, feature_diameter
from dpsinkhorn.privacy.factory import PrivateRun, make_private
from dpsinkhorn.privacy.mechanism import ParameterGradientSanitizer
from dpsinkhorn.privacy.noise import rng_state_bytes, rng_state_tensor
from dpsinkhorn.privacy.trainings import data_fingerprint
from dpsinkhorn.train import memory
from dpsinkhorn.train.step import TrainingStep


def check_batch_size(spec: dict, num_records: int) -> None:
    """Refuse (``memory.TooLargeError`` naming ``batch_size``) a batch larger than the data."""
    if spec["batch_size"] > num_records:
        raise memory.TooLargeError(
            "batch_size",
            f"batch_size {spec['batch_size']} is larger than the {num_records} training "
            f"records of {spec['dataset']}: the sampling rate q = batch_size / N must be at "
            "most 1",
        )


class GeneratorRun:
    """What every run holds: its settings, declared classes, generator and optimiser.

    ``spec``: a validated experiment dict (``experiment``, what ``spec_hash`` hashes);
    ``fingerprint``: the data's (None: computed here). ``classes``: the declared class
    names, never counted from the private labels (None: the catalogue's, or one
    ``unconditional``, whose labels are zeroed before anything reads them)."""

    cuda_graphs = False

    def __init__(
        self,
        spec: dict,
        train_images,
        train_labels,
        device: torch.device,
        classes: Sequence[str] | None = None,
        fingerprint: str | None = None,
    ):
        self.experiment, self.device = spec, device
        # The training record is keyed by the private source as it is (its labels too), so
        # an unconditional training counts with every other training of that data.
        self.fingerprint = fingerprint or data_fingerprint(train_images, train_labels)
        self.settings = settings = ExperimentSpec.from_dict(spec)
        check_batch_size(spec, len(train_images))
        self.conditional = settings.conditional
        definition = spec.get("dataset_definition")
        if classes is None and not self.conditional and definition is None:
            self.class_names: tuple[str, ...] = ("unconditional",)  # no class is read
        elif classes is None:
            self.class_names = dataset_info(settings.dataset, definition).class_names
        else:
            self.class_names = check_class_names(classes, "classes")
        # Then generator.pt names them (declared here, or by an own dataset's definition).
        self.classes_declared = classes is not None or definition is not None
        self.num_classes = len(self.class_names) if self.conditional else 1
        if self.conditional:  # the message names no label value and no count: private
            labels = np.asarray(train_labels)
            if ((labels < 0) | (labels >= self.num_classes)).any():
                raise ValueError(
                    f"experiment {settings.name}: a training label is outside the "
                    f"{self.num_classes} declared classes (labels must lie in "
                    f"0..{self.num_classes - 1}; no label value is shown: the labels are "
                    "private)"
                )
            self.labels = train_labels
        else:
            self.labels = np.zeros(len(train_images), dtype=np.int64)
        self.step_count = 0

    def build_model(self, image_shape: tuple[int, ...]) -> None:
        """The generator (initial weights from ``seed``) and its optimiser: fused where
        PyTorch has a fused kernel, ``capturable`` when the step is a CUDA graph."""
        settings = self.settings
        self.image_shape = image_shape
        torch.manual_seed(settings.seed)
        self.model_config = GeneratorConfig.from_settings(settings, self.num_classes, image_shape)
        self.model = build_generator(self.model_config).to(self.device)
        self.optimizer_flags = {"fused": self.device.type in ("cpu", "cuda") or None}
        options = {"lr": settings.lr, "weight_decay": settings.weight_decay}
        optimizer: type[torch.optim.Optimizer] = torch.optim.SGD
        if settings.optimizer == "adam" or settings.method == "dpmerf":
            self.optimizer_flags["capturable"] = self.cuda_graphs
            optimizer, options["betas"] = torch.optim.Adam, settings.betas
        self.optimizer = optimizer(self.model.parameters(), **options, **self.optimizer_flags)

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state_bytes(self.rng),  # bytes: immune to torch.load's map_location
            "accountant": self.accountant.state_dict() if self.accountant else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """The state of :meth:`state_dict`; the ledger is the subclass's to check."""
        self.step_count = int(state["step"])
        self.model.load_state_dict(state["model"])
        # A saved optimiser brings its execution flags along; keep this process's
        # (a run may resume with or without CUDA graphs).
        groups = [{**g, **self.optimizer_flags} for g in state["optimizer"]["param_groups"]]
        self.optimizer.load_state_dict({**state["optimizer"], "param_groups": groups})
        self.rng.set_state(rng_state_tensor(state["rng"]))  # a CPU ByteTensor, any device
        if self.accountant is not None:
            self.accountant.load_state_dict(state["accountant"])


@dataclass(frozen=True)
class StepOptions:
    """How the training step executes, not what it computes."""

    cuda_graphs: bool = False  # train.step.GraphedStep (CUDA only)
    compile_solver: bool = False  # torch.compile the Sinkhorn iterations
    precision: str = "fp32"  # models.GeneratorPrecision


class Trainer(GeneratorRun):
    """One DP-Sinkhorn training run; performs single steps. ``private_run``: its mechanism
    (``make_private``'s when not given); ``fingerprint`` and ``real_features`` let a sweep
    hash the data and put its features on the device once."""

    def __init__(
        self,
        spec: dict,
        train_images,
        train_labels,
        device: torch.device,
        options: StepOptions = StepOptions(),
        *,
        fingerprint: str | None = None,
        real_features: torch.Tensor | None = None,
        private_run: PrivateRun | None = None,
        classes: Sequence[str] | None = None,
    ):
        super().__init__(spec, train_images, train_labels, device, classes, fingerprint)
        settings = self.settings
        self.cuda_graphs = options.cuda_graphs and device.type == "cuda"
        self.compile_solver = options.compile_solver
        self.precision = GeneratorPrecision(options.precision, device)
        num_records = len(train_images)
        # Every draw's generator, sampler, sanitiser and accountant, from the one factory.
        run = private_run or make_private(spec, num_records, device)
        self.rng, self.sampler = run.rng, run.sampler
        self.sanitizer, self.accountant = run.sanitizer, run.accountant
        self.n, self.n_prime, self.q = run.n, run.n_prime, run.q
        self.total_steps = self.releases_planned = run.total_steps  # one mechanism per step
        # Columns α_c · onehot(label) of the cost: none for an unconditional generator.
        self.feature_classes = self.num_classes if self.conditional else 0
        alpha_c = settings.alpha_c if self.conditional else 0.0
        images = data.to_unit_range(train_images).to(device)  # real data on the device
        if real_features is None:
            labels = torch.as_tensor(self.labels, device=device)
            real_features = conditional_features(images, labels, self.feature_classes, alpha_c)
        self.real = real_features
        self.diameter = feature_diameter(images[0].numel(), alpha_c, settings.cost)
        self.build_model(tuple(images.shape[1:]))
        per_row = memory.activation_bytes_per_row(self.model)
        need = memory.step_bytes(
            self.n, self.n_prime, self.sampler.capacity, num_records, self.real.shape[1], per_row
        )
        memory.check_fits(need, device, f"batch_size {self.n} (q = {self.q:.4g}, {settings.name})")
        self.stepper = TrainingStep([self], device, self.cuda_graphs)

    def step(self) -> torch.Tensor:
        """One training step; returns the loss as a device tensor (no host sync)."""
        return self.stepper([self])[0]

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

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.accountant is not None and self.accountant.steps != self.step_count:
            raise ValueError(
                f"checkpoint ledger counts {self.accountant.steps} steps "
                f"but the model has taken {self.step_count}"
            )


def spec_hash(spec: dict, fingerprint: str = "") -> str:
    """Identifies what a checkpoint computes: the settings (bookkeeping keys aside) and
    the training data's :func:`data_fingerprint`."""
    content = config_lib.experiment_spec_of(spec) + "|data:" + fingerprint
    return hashlib.sha256(content.encode()).hexdigest()[:16]
