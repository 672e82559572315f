"""DP-MERF training: one private release, then a generator fitted to it (``method: dpmerf``).

:class:`MerfTrainer` has ``Trainer``'s interface. Step 1 releases the noisy mean embedding
μ̃ [D, K] (``privacy.merf``); every step then takes one Adam step on ‖μ̃ − μ(g(z, y))‖²_F
over B generated rows (post-processing), the learning rate decaying by ``lr_decay`` per
epoch of ⌊N/B⌋ steps. μ̃ stays in the private checkpoint, never drawn again on resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dpsinkhorn.data import datasets as data
from dpsinkhorn.privacy.accounting import PrivacyAccountant
from dpsinkhorn.privacy.checks import check_delta_of_records
from dpsinkhorn.privacy.merf import (
    MerfRelease,
    mean_embedding,
    merf_noise_multiplier,
    random_frequencies,
)
from dpsinkhorn.privacy.noise import keyed_generator, public_noise_key, secret_noise_key
from dpsinkhorn.train.trainer import GeneratorRun


class MerfTrainer(GeneratorRun):
    """One DP-MERF run: the release (at the first step) and the generator's training.
    Arguments as :class:`GeneratorRun`'s (``precision`` and the CUDA options do not apply)."""

    def __init__(
        self,
        spec: dict,
        train_images,
        train_labels,
        device: torch.device,
        classes: Sequence[str] | None = None,
    ):
        super().__init__(spec, train_images, train_labels, device, classes)
        settings = self.settings
        num_records = len(train_images)
        check_delta_of_records(settings.delta, num_records, settings.name)
        seed, name = settings.seed, settings.name
        key = public_noise_key(seed, name) if settings.reproducible else secret_noise_key()
        self.rng = keyed_generator(key, device)  # the release's noise, then z and labels
        del key
        self.sanitizer = MerfRelease(merf_noise_multiplier(spec), self.rng)
        self.accountant = PrivacyAccountant(
            1.0, self.sanitizer.noise_multiplier, settings.delta, settings.accountant
        )
        self.q, self.n, self.n_prime, self.sampler = 1.0, settings.batch_size, 0, None
        self.total_steps = int(settings.steps)
        self.releases_planned = 1  # ledger steps: the one Gaussian mechanism
        images = data.to_unit_range(train_images)  # [N, C, S, S] in [-1, 1], CPU
        # Private until released (step 1), then dropped: [N, d] in [0, 1] and labels.
        self._private: tuple[torch.Tensor, torch.Tensor] | None = (
            ((images.flatten(1) + 1) / 2),
            torch.as_tensor(self.labels, dtype=torch.int64),
        )
        self.epoch_steps = max(1, num_records // settings.batch_size)
        self.w = random_frequencies(
            settings.rff_features, images[0].numel(), settings.rff_bandwidth, seed, name, device
        )
        self.build_model(tuple(images.shape[1:]))  # Adam, fused as Trainer's
        self.noisy: torch.Tensor | None = None  # μ̃ [D, K], once released

    def release(self) -> None:
        """The one private release μ̃ (``MerfRelease``), recorded in the ledger."""
        images, labels = self._private
        self.noisy = self.sanitizer.release(images, labels, self.w, self.num_classes)
        self.accountant.step()
        self._private = None

    def step(self) -> torch.Tensor:
        """One generator step on ‖μ̃ − μ(g)‖²_F (the release first, at step 1)."""
        if self.noisy is None:
            self.release()
        epoch = self.step_count // self.epoch_steps  # lr · lr_decay^⌊step / epoch⌋
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr * self.settings.lr_decay**epoch
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
        noisy = None if self.noisy is None else self.noisy.cpu()
        return {**super().state_dict(), "noisy_embedding": noisy}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
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
