"""The training step as the paper describes it, written the obvious way (``--impl reference``):
Poisson sample by boolean mask, images converted every step, a tensor hook (or the parameter
gradient) clipped and noised, geomloss with its defaults called twice. For benchmarks only.
"""

from __future__ import annotations

import torch
from geomloss import SamplesLoss

from dpsinkhorn.config.spec import ExperimentSpec
from dpsinkhorn.models import GeneratorConfig, build_generator
from dpsinkhorn.ot.loss import debias_size
from dpsinkhorn.ot.solver import mixed_cost
from dpsinkhorn.privacy.budget import budget_of


class ReferenceStep:
    """The plain DP-Sinkhorn step of paper Algorithm 1, written the obvious way (benchmark only)."""

    def __init__(self, spec: dict, images, labels, device: torch.device):
        self.spec, self.device = spec, device
        self.images = torch.as_tensor(images, device=device)  # uint8, converted every step
        self.labels = torch.as_tensor(labels, device=device)
        self.n = int(spec["batch_size"])
        self.n_prime = debias_size(self.n, spec["p"])
        self.q = self.n / len(self.labels)
        self.num_classes = int(self.labels.max()) + 1
        channels = 1 if self.images.ndim == 3 else self.images.shape[-1]
        shape = (channels, *self.images.shape[1:3])  # [C, H, W]
        config = GeneratorConfig.from_settings(
            ExperimentSpec.from_dict(spec), self.num_classes, shape
        )
        self.model = build_generator(config).to(device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"]
        )
        self.private = spec["method"] == "dp_sinkhorn"
        self.perturbation = spec["perturbation"]
        if self.private:
            self.sigma, _ = budget_of(spec, len(self.labels))

    def _features(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(labels, self.num_classes).float()
        return torch.cat([images.flatten(1), self.spec["alpha_c"] * onehot], dim=1)

    def _sanitize(self, grad: torch.Tensor) -> torch.Tensor:
        clip, n = self.spec["clip"], self.n
        head, tail = grad[:n], grad[n:]
        head = head * min(1.0, clip / (head.norm().item() + 1e-12))
        head = head + 2 * clip * self.sigma * torch.randn_like(head)
        if len(tail):
            tail = tail * min(1.0, clip / (tail.norm().item() + 1e-12))
        return torch.cat([head, tail])

    def _sanitize_parameters(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        clip = self.spec["clip"]
        norm = torch.cat([g.flatten() for g in grads]).norm().item()
        for g in grads:
            g.mul_(min(1.0, clip / (norm + 1e-12)))
            g.add_(2 * clip * self.sigma * torch.randn_like(g))

    def step(self) -> torch.Tensor:
        spec, n, n_prime = self.spec, self.n, self.n_prime
        chosen = (torch.rand(len(self.labels), device=self.device) < self.q).nonzero().squeeze(1)
        real = self.images[chosen].float() / 127.5 - 1.0
        y = self._features(real, self.labels[chosen])
        z = torch.rand(n + n_prime, spec["latent_dim"], device=self.device)
        labels = torch.randint(0, self.num_classes, (n + n_prime,), device=self.device)
        fake = self.model(z, labels)
        if self.private and self.perturbation == "image":
            fake.register_hook(self._sanitize)
        x = self._features(fake, labels)
        ot = SamplesLoss(
            "sinkhorn",
            p=1,
            blur=spec["entropy_reg"],
            debias=False,
            cost=lambda a, b: mixed_cost(a, b, spec["m"], spec["cost"]),
        )
        self_term = ot(x[:n], x[n_prime : n + n_prime])
        data_term = ot(x[:n], y) if len(chosen) else torch.zeros((), device=self.device)
        loss = 2 * data_term - self_term
        self.optimizer.zero_grad()
        loss.backward()
        if self.private and self.perturbation == "parameter":
            self._sanitize_parameters()
        self.optimizer.step()
        return loss.detach()
