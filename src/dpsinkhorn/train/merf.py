"""DP-MERF training: one private release, then a generator fitted to it (``method: dpmerf``).

:class:`MerfTrainer` has ``Trainer``'s interface. Step 1 releases the noisy mean embedding
μ̃ [D, K] (``privacy.merf``); every step then takes one Adam step on ‖μ̃ − μ(g(z, y))‖²_F
over B generated rows (post-processing), the learning rate decaying by ``lr_decay`` per
epoch of ⌊N/B⌋ steps. μ̃ stays in the private checkpoint, never drawn again on resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.data import datasets as data
from dpsinkhorn.models import GeneratorConfig, build_generator
from dpsinkhorn.privacy.accounting import PrivacyAccountant
from dpsinkhorn.privacy.checks import check_delta_of_records
from dpsinkhorn.privacy.merf import (
    MerfRelease,
    mean_embedding,
    merf_noise_multiplier,
    random_frequencies,
)
from dpsinkhorn.privacy.noise import (
    keyed_generator,
    public_noise_key,
    rng_state_bytes,
    rng_state_tensor,
    secret_noise_key,
)
from dpsinkhorn.privacy.trainings import data_fingerprint
from dpsinkhorn.train.trainer import check_batch_size, check_labels, declared_classes


class MerfTrainer:
    """One DP-MERF run: the release (at the first step) and the generator's training.

    Arguments as ``Trainer``'s (``precision`` and the CUDA options do not apply: fp32).
    """

    def __init__(
        self,
        spec: dict,
        train_images,
        train_labels,
        device: torch.device,
        classes: Sequence[str] | None = None,
    ):
        self.experiment, self.device = spec, device
        self.settings = settings = ExperimentSpec.from_dict(spec)
        num_records = len(train_images)
        check_batch_size(spec, num_records)
        check_delta_of_records(settings.delta, num_records, settings.name)
        key = (
            public_noise_key(settings.seed, settings.name)
            if settings.reproducible
            else secret_noise_key()
        )
        self.rng = keyed_generator(key, device)  # the release's noise, then z and labels
        del key
        self.sanitizer = MerfRelease(merf_noise_multiplier(spec), self.rng)
        self.accountant = PrivacyAccountant(
            1.0, self.sanitizer.noise_multiplier, settings.delta, settings.accountant
        )
        self.q, self.n, self.n_prime, self.sampler = 1.0, settings.batch_size, 0, None
        self.total_steps = int(settings.steps)
        self.releases_planned = 1  # ledger steps: the one Gaussian mechanism
        self.perturbation = None
        self.epsilon_convention = settings.epsilon_convention
        self.private, self.reproducible = True, settings.reproducible
        self.conditional = settings.conditional
        definition = spec.get("dataset_definition")
        if classes is None and not self.conditional and definition is None:
            self.class_names: tuple[str, ...] = ("unconditional",)
        else:
            self.class_names = declared_classes(settings.dataset, classes, definition)
        self.classes_declared = classes is not None or definition is not None
        if self.conditional:
            self.num_classes = len(self.class_names)
            check_labels(train_labels, self.class_names, settings.name)
        else:
            self.num_classes = 1
            train_labels = np.zeros(num_records, dtype=np.int64)
        self.fingerprint = data_fingerprint(train_images, train_labels)
        images = data.to_unit_range(train_images)  # [N, C, S, S] in [-1, 1], CPU
        self.image_shape = tuple(images.shape[1:])
        # Private until released (step 1), then dropped: [N, d] in [0, 1] and labels.
        self._private: tuple[torch.Tensor, torch.Tensor] | None = (
            ((images.flatten(1) + 1) / 2),
            torch.as_tensor(train_labels, dtype=torch.int64),
        )
        self.epoch_steps = max(1, num_records // settings.batch_size)
        self.w = random_frequencies(
            settings.rff_features,
            images[0].numel(),
            settings.rff_bandwidth,
            settings.seed,
            settings.name,
            device,
        )
        torch.manual_seed(settings.seed)
        self.model_config = GeneratorConfig.from_settings(
            settings, self.num_classes, self.image_shape
        )
        self.model = build_generator(self.model_config).to(device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
        )
        self.noisy: torch.Tensor | None = None  # μ̃ [D, K], once released
        self.step_count = 0

    def release(self) -> None:
        """The one private release μ̃ (``MerfRelease``), recorded in the ledger."""
        images, labels = self._private
        self.noisy = self.sanitizer.release(images, labels, self.w, self.num_classes)
        self.accountant.step()
        self._private = None

    def learning_rate(self) -> float:
        """lr · lr_decay^⌊step / epoch⌋ for the next step."""
        epoch = self.step_count // self.epoch_steps
        return self.settings.lr * self.settings.lr_decay**epoch

    def step(self) -> torch.Tensor:
        """One generator step on ‖μ̃ − μ(g)‖²_F (the release first, at step 1)."""
        if self.noisy is None:
            self.release()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.model.train()
        z, labels = self.model.sample_inputs(self.n, generator=self.rng)
        x = (self.model(z, labels).flatten(1) + 1) / 2
        loss = ((self.noisy - mean_embedding(x, labels, self.w, self.num_classes)) ** 2).sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.step_count += 1
        return loss.detach()

    def epsilon(self) -> float:
        return self.accountant.epsilon() if self.accountant.steps else 0.0

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state_bytes(self.rng),
            "accountant": self.accountant.state_dict(),
            "noisy_embedding": None if self.noisy is None else self.noisy.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.set_state(rng_state_tensor(state["rng"]))
        self.accountant.load_state_dict(state["accountant"])
        noisy = state["noisy_embedding"]
        released = noisy is not None
        if self.accountant.steps != int(released) or (self.step_count > 0) != released:
            raise ValueError(
                f"checkpoint of {self.settings.name}: ledger counts {self.accountant.steps} "
                f"releases, embedding {'present' if released else 'absent'}, step "
                f"{self.step_count}; not a DP-MERF checkpoint of this run"
            )
        if released:
            self.noisy = noisy.to(self.device, torch.float32)
            self._private = None
