"""The three downstream classifiers of paper appendix D.2 and their training loops.

Inputs are pixels scaled to [0,1] (uint8 / 255; no standardisation), float32
[N,C,H,W] (torch models) or any [N,...] array (``logreg``, flattened).

- ``logreg``: multinomial logistic regression with scikit-learn's objective (mean
  cross-entropy + ||W||^2 / (2 C n), C = 1, intercept not penalised; L-BFGS, ``max_iter``
  5000) on flattened pixels, fitted on the whole training set (no model selection):
  scikit-learn's ``LogisticRegression`` on the host (:func:`train_logreg`), or the same
  objective minimised by torch's L-BFGS on the device for several seeds at once
  (:func:`train_logreg_torch`; the optimum is unique, so both give the same classifier up
  to the solvers' tolerances).
- ``mlp``: flatten - linear(100) - ReLU - linear(classes).
- ``cnn``: conv3x3(32) - ReLU - maxpool2 - dropout(0.5) - conv3x3(64) - ReLU -
  maxpool2 - dropout(0.5) - flatten - linear(classes); any H, W >= 4.

The MLP and CNN are trained with Adam (default parameters) on 90% of the
training set; the other 10% is a hold-out for early stopping: training stops
after ``patience`` epochs without a better hold-out accuracy (or at
``max_epochs``) and the best hold-out weights are kept. The test set is only
used for the final accuracy. Everything is seeded: the same seed gives the
same accuracy on CPU. Batches are index slices of device tensors (no DataLoader).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import torch
from torch import nn

MODELS = ("logreg", "mlp", "cnn")
HOLDOUT_FRACTION = 0.1
EVAL_BATCH = 1024


def make_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The ``mlp`` or ``cnn`` of appendix D.2 for inputs [C,H,W]."""
    c, h, w = in_shape
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(c * h * w, 100), nn.ReLU(), nn.Linear(100, num_classes)
        )
    if name == "cnn":
        if h < 4 or w < 4:
            raise ValueError(f"cnn needs images of at least 4x4 pixels, got {h}x{w}")
        return nn.Sequential(
            nn.Conv2d(c, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.5),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.5),
            nn.Flatten(),
            nn.Linear(64 * (h // 4) * (w // 4), num_classes),
        )
    raise ValueError(f"unknown torch model {name!r}; choose from mlp, cnn")


@torch.no_grad()
def accuracy_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of correct predictions on (x [N,C,H,W], y [N]), in eval mode.

    The count stays on the device until the end: one host synchronisation per call.
    """
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for start in range(0, len(x), EVAL_BATCH):
        logits = model(x[start : start + EVAL_BATCH])
        correct += (logits.argmax(1) == y[start : start + EVAL_BATCH]).sum()
    return int(correct.item()) / len(x)


def train_torch(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    seed: int,
    max_epochs: int,
    patience: int,
    batch_size: int,
) -> dict:
    """Adam + early stopping on a 10% hold-out of (x, y); returns the result fields.

    ``x`` float32 [N,C,H,W], ``y`` int64 [N] and the test pair are tensors already on
    the training device.
    """
    if len(x) < 2:
        raise ValueError(f"{name} needs at least 2 training images, got {len(x)}")
    if max_epochs < 1 or patience < 1 or batch_size < 1:
        raise ValueError("max_epochs, patience and batch_size must be >= 1")
    device = x.device
    torch.manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(x))
    n_hold = max(1, int(round(HOLDOUT_FRACTION * len(x))))
    hold = torch.from_numpy(order[:n_hold]).to(device)
    fit = torch.from_numpy(order[n_hold:]).to(device)
    x_fit, y_fit, x_hold, y_hold = x[fit], y[fit], x[hold], y[hold]
    model = make_model(name, x.shape[1:], num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed)

    best_acc, best_epoch, best_state, epoch = -1.0, 0, None, 0
    for epoch in range(1, max_epochs + 1):
        model.train()
        for batch in torch.randperm(len(x_fit), generator=shuffle).to(device).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x_fit[batch]), y_fit[batch]).backward()
            optimizer.step()
        acc = accuracy_of(model, x_hold, y_hold)
        if acc > best_acc:
            best_acc, best_epoch, best_state = acc, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= patience:
            break
    model.load_state_dict(best_state)
    return {
        "accuracy": accuracy_of(model, x_test, y_test),
        "holdout_accuracy": best_acc,
        "epochs": epoch,
        "best_epoch": best_epoch,
        "num_holdout": int(n_hold),
        "max_epochs": max_epochs,
        "patience": patience,
        "batch_size": batch_size,
    }


def train_torch_batched(
    name: str,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    seeds: list[int],
    max_epochs: int,
    patience: int,
    batch_size: int,
) -> list[dict]:
    """:func:`train_torch` for K seeds at once: the K models' parameters stacked [K, ...]
    (``torch.func.stack_module_state``), every step one ``vmap``-ed forward/backward and one
    Adam step (elementwise, so the same as K separate Adams).

    Per seed as in :func:`train_torch`: initialisation (``torch.manual_seed(seed)``),
    hold-out split, batch order, early stopping and the best hold-out weights; only the
    dropout masks come from another stream (``vmap(randomness="different")``), so the CNN's
    results differ from the sequential ones like another seed's would. The training sets
    ``xs`` [N,C,H,W] (float32) / ``ys`` [N] must have the same N; all tensors on one device.
    """
    run = BatchedRun(name, xs, ys, num_classes, seeds, max_epochs, patience, batch_size)
    k, params = run.k, run.params
    optimizer = torch.optim.Adam(list(params.values()))

    best_acc, best_epoch, epochs = [-1.0] * k, [0] * k, [0] * k
    best_state: list[dict | None] = [None] * k
    done = [False] * k
    for epoch in range(1, max_epochs + 1):
        for idx in run.epoch_batches():
            run.step(optimizer, idx)
        accs = run.accuracy(run.x_hold, run.y_hold, shared=False).tolist()
        for j in range(k):
            if done[j]:
                continue
            epochs[j] = epoch
            if accs[j] > best_acc[j]:
                best_acc[j], best_epoch[j] = accs[j], epoch
                best_state[j] = {key: v[j].detach().clone() for key, v in params.items()}
            elif epoch - best_epoch[j] >= patience:
                done[j] = True
        if all(done):
            break
    with torch.no_grad():
        for j in range(k):
            for key, v in params.items():
                v[j].copy_(best_state[j][key])
    test_acc = run.accuracy(x_test, y_test, shared=True).tolist()
    return run.records(test_acc, best_acc, epochs, best_epoch)


def train_logreg(
    x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, seed: int, max_iter: int
) -> dict:
    """L-BFGS logistic regression on flattened pixels of the whole training set."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(y)) < 2:
        raise ValueError("logreg needs training samples of at least 2 classes")
    clf = LogisticRegression(solver="lbfgs", max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x.reshape(len(x), -1), y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return {
        "accuracy": float(clf.score(x_test.reshape(len(x_test), -1), y_test)),
        "holdout_accuracy": None,  # no model selection for logreg
        "epochs": None,
        "iterations": int(np.max(clf.n_iter_)),
        "converged": converged,
        "max_iter": max_iter,
    }


def train_logreg_torch(
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    max_iter: int,
    c: float = 1.0,
    tolerance: float = 1e-6,
) -> list[dict]:
    """scikit-learn's L2 logistic regression (lbfgs, multinomial), one per training set, all
    fitted together on their device by ``torch.optim.LBFGS`` (strong Wolfe line search).

    Per set k the objective is mean_i CE(W_k x_i + b_k, y_i) + ||W_k||^2 / (2 C n_k), which is
    scikit-learn's ``C sum_i CE + ||W||^2 / 2`` divided by C n_k: the same unique minimiser.
    The K objectives are summed; they share no parameter, so the sum's gradient is each set's
    own and the joint minimiser is the K separate ones. ``xs`` float32 [N_k,C,H,W] (or any
    [N_k,...]), ``ys`` int64 [N_k], the test pair likewise, all on one device. Stops when the
    largest gradient entry is below ``tolerance`` or after ``max_iter`` L-BFGS iterations.
    Deterministic (no random initialisation: W = 0, b = 0, as scikit-learn starts).
    """
    device = xs[0].device
    flat = [x.reshape(len(x), -1) for x in xs]
    dim = flat[0].shape[1]
    k = len(flat)
    weight = torch.zeros(k, dim, num_classes, device=device, requires_grad=True)
    bias = torch.zeros(k, num_classes, device=device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=max_iter,
        max_eval=max_iter * 5 // 4,
        tolerance_grad=tolerance,
        tolerance_change=1e-12,
        history_size=10,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = weight.new_zeros(())
        for j, (x, y) in enumerate(zip(flat, ys, strict=True)):
            logits = x @ weight[j] + bias[j]
            penalty = weight[j].square().sum() / (2 * c * len(x))
            loss = loss + nn.functional.cross_entropy(logits, y) + penalty
        loss.backward()
        return loss

    optimizer.step(closure)
    iterations = int(optimizer.state[optimizer._params[0]]["n_iter"])
    with torch.no_grad():
        x_flat = x_test.reshape(len(x_test), -1)
        accs = [
            float((x_flat @ weight[j] + bias[j]).argmax(1).eq(y_test).double().mean())
            for j in range(k)
        ]
    return [
        {
            "accuracy": accs[j],
            "holdout_accuracy": None,  # no model selection for logreg
            "epochs": None,
            "iterations": iterations,
            "converged": iterations < max_iter,
            "max_iter": max_iter,
            "solver": "torch.optim.LBFGS (strong Wolfe), seeds fitted together",
            "batched_seeds": k,
        }
        for j in range(k)
    ]


class BatchedRun:
    """What :func:`train_torch_batched` sets up for K seeds, and its pieces: per seed the
    initialisation (``torch.manual_seed(seed)``), hold-out split and batch-order generator;
    the K models' parameters stacked [K, ...]; the vmapped step, batch orders and accuracy.
    Shared with the fast loop (:mod:`dpsinkhorn.evaluate.fastfit`), so both do the same
    arithmetic."""

    def __init__(
        self,
        name: str,
        xs: list[torch.Tensor],
        ys: list[torch.Tensor],
        num_classes: int,
        seeds: list[int],
        max_epochs: int,
        patience: int,
        batch_size: int,
    ) -> None:
        from torch.func import functional_call, stack_module_state, vmap

        k, n = len(seeds), len(xs[0])
        if any(len(x) != n for x in xs):
            raise ValueError(
                f"batched seeds need training sets of one size, got {[len(x) for x in xs]}"
            )
        if n < 2:
            raise ValueError(f"{name} needs at least 2 training images, got {n}")
        if max_epochs < 1 or patience < 1 or batch_size < 1:
            raise ValueError("max_epochs, patience and batch_size must be >= 1")
        device = xs[0].device
        n_hold = max(1, int(round(HOLDOUT_FRACTION * n)))
        models, x_fit, y_fit, x_hold, y_hold, shuffles = [], [], [], [], [], []
        for seed, x, y in zip(seeds, xs, ys, strict=True):
            torch.manual_seed(seed)
            order = np.random.default_rng(seed).permutation(n)
            hold = torch.from_numpy(order[:n_hold]).to(device)
            fit = torch.from_numpy(order[n_hold:]).to(device)
            x_fit.append(x[fit])
            y_fit.append(y[fit])
            x_hold.append(x[hold])
            y_hold.append(y[hold])
            models.append(make_model(name, tuple(x.shape[1:]), num_classes).to(device))
            shuffles.append(torch.Generator().manual_seed(seed))
        x_fit, y_fit = torch.stack(x_fit), torch.stack(y_fit)  # [K, n_fit, C, H, W], [K, n_fit]
        x_hold, y_hold = torch.stack(x_hold), torch.stack(y_hold)
        params, buffers = stack_module_state(models)  # leaves [K, ...]
        base = copy.deepcopy(models[0]).to("meta")

        def forward(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (x,))

        self.k, self.n_hold, self.device, self.seeds = k, n_hold, device, seeds
        self.name, self.in_shape, self.num_classes = name, tuple(xs[0].shape[1:]), num_classes
        self.max_epochs, self.patience, self.batch_size = max_epochs, patience, batch_size
        self.x_fit, self.y_fit, self.x_hold, self.y_hold = x_fit, y_fit, x_hold, y_hold
        self.params, self.buffers, self.base, self.shuffles = params, buffers, base, shuffles
        self.forward = forward
        self.train_fn = vmap(forward, randomness="different")
        self.rows = torch.arange(k, device=device)[:, None]

    def epoch_batches(self) -> list[torch.Tensor]:
        """One epoch's batches of training indices [K, b] (each seed's own order), on the
        device; puts the model in training mode."""
        self.base.train()
        n_fit = self.x_fit.shape[1]
        perms = torch.stack([torch.randperm(n_fit, generator=g) for g in self.shuffles])
        return list(perms.to(self.device).split(self.batch_size, dim=1))

    def step(self, optimizer: torch.optim.Optimizer, idx: torch.Tensor) -> None:
        """One Adam step of all K models on the batches ``idx`` [K, b]: the loss is the sum
        over seeds of each seed's mean cross-entropy, so each seed gets its own gradient."""
        rows = self.rows
        logits = self.train_fn(self.params, self.buffers, self.x_fit[rows, idx])  # [K,b,cls]
        loss = (
            nn.functional.cross_entropy(
                logits.flatten(0, 1), self.y_fit[rows, idx].flatten(), reduction="sum"
            )
            / idx.shape[1]
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def model(self, j: int) -> nn.Module:
        """Seed ``j``'s model as a module of its own holding (views of) its current
        parameters; built on the meta device, so no random initialisation is drawn."""
        with torch.device("meta"):
            model = make_model(self.name, self.in_shape, self.num_classes)
        state = {key: v[j].detach() for key, v in (self.params | self.buffers).items()}
        model.load_state_dict(state, assign=True)
        return model

    @torch.no_grad()
    def accuracy(self, x: torch.Tensor, y: torch.Tensor, shared: bool) -> torch.Tensor:
        """Fraction correct per seed [K] (float64, on the device); ``x`` [K,N,...] or,
        ``shared``, [N,...] for all seeds.

        On the CPU a shared set (the real test set) is scored seed by seed, by each model in
        channels-last layout: there the vmapped convolution took 10.4 s for one seed and
        66 s for five on MNIST's 10,000 test images, channels-last 4.5 s and 27 s (one
        thread). The logits differ by rounding only (6e-7 measured), as any two
        convolution algorithms' do."""
        from torch.func import vmap

        if shared and self.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
            scores = [
                accuracy_of(self.model(j).to(memory_format=torch.channels_last), x, y)
                for j in range(self.k)
            ]
            return torch.tensor(scores, dtype=torch.float64)
        self.base.eval()
        fn = vmap(self.forward, in_dims=(0, 0, None) if shared else (0, 0, 0))
        correct = torch.zeros(self.k, dtype=torch.int64, device=self.device)
        for start in range(0, y.shape[-1], EVAL_BATCH):
            xb = x[start : start + EVAL_BATCH] if shared else x[:, start : start + EVAL_BATCH]
            yb = y[start : start + EVAL_BATCH] if shared else y[:, start : start + EVAL_BATCH]
            correct += (fn(self.params, self.buffers, xb).argmax(-1) == yb).sum(-1)
        return correct.double() / y.shape[-1]

    def records(
        self, test_acc: list[float], best_acc: list, epochs: list, best_epoch: list
    ) -> list[dict]:
        """The K result dicts of :func:`train_torch_batched`."""
        return [
            {
                "accuracy": test_acc[j],
                "holdout_accuracy": float(best_acc[j]),
                "epochs": int(epochs[j]),
                "best_epoch": int(best_epoch[j]),
                "num_holdout": int(self.n_hold),
                "max_epochs": self.max_epochs,
                "patience": self.patience,
                "batch_size": self.batch_size,
                "batched_seeds": self.k,
            }
            for j in range(self.k)
        ]
