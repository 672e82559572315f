"""The three downstream classifiers of paper appendix D.2 (docs/PAPER.md), every seed's
model trained at once on one device, inputs float32 [N,C,H,W] in [0,1]: ``logreg``
(:func:`train_logreg`), ``mlp`` and ``cnn`` (Adam, 10% hold-out, early stopping after
``patience`` epochs, best weights kept: :func:`train_batched`)."""

from __future__ import annotations

import copy

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


def train_logreg(
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    max_iter: int,
    c: float = 1.0,
    tolerance: float = 1e-6,
) -> list[dict]:
    """scikit-learn's L2 logistic regression (lbfgs, multinomial, C = ``c``) per training set
    (``xs`` float32 [N_k,...], ``ys`` [N_k]), fitted together by ``torch.optim.LBFGS``
    (strong Wolfe) from W = 0, b = 0: per set mean_i CE(W_k x_i + b_k, y_i) + ||W_k||^2 /
    (2 C n_k), scikit-learn's objective / (C n_k), until the largest gradient entry is below
    ``tolerance`` or ``max_iter``."""
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
    common = {"holdout_accuracy": None, "epochs": None}  # no model selection for logreg
    common |= {"iterations": iterations, "converged": iterations < max_iter, "max_iter": max_iter}
    solver = "torch.optim.LBFGS (strong Wolfe), seeds fitted together"
    return [{"accuracy": acc} | common | {"solver": solver, "batched_seeds": k} for acc in accs]


class BatchedRun:
    """K seeds of one model trained together: per seed its initialisation
    (``torch.manual_seed(seed)``), hold-out split and batch order; parameters stacked
    [K, ...] and one vmapped forward/backward and Adam step for all seeds. The sets ``xs``
    [N,C,H,W] / ``ys`` [N] share N; dropout masks: ``vmap(randomness="different")``."""

    def __init__(
        self,
        name: str,
        xs: list[torch.Tensor],
        ys: list[torch.Tensor],
        num_classes: int,
        seeds: list[int],
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
        device = xs[0].device
        n_hold = max(1, int(round(HOLDOUT_FRACTION * n)))
        models, orders = [], []
        for seed in seeds:
            torch.manual_seed(seed)
            orders.append(np.random.default_rng(seed).permutation(n))
            models.append(make_model(name, tuple(xs[0].shape[1:]), num_classes).to(device))
        order = torch.from_numpy(np.stack(orders)).to(device)  # [K, n]: hold-out first
        rows = torch.arange(k, device=device)[:, None]
        x, y = torch.stack(xs), torch.stack(ys)  # [K, n, C, H, W], [K, n]
        x_fit, y_fit = x[rows, order[:, n_hold:]], y[rows, order[:, n_hold:]]
        x_hold, y_hold = x[rows, order[:, :n_hold]], y[rows, order[:, :n_hold]]
        del x, y
        shuffles = [torch.Generator().manual_seed(seed) for seed in seeds]
        params, buffers = stack_module_state(models)  # leaves [K, ...]
        base = copy.deepcopy(models[0]).to("meta")

        def forward(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (x,))

        self.k, self.n_hold, self.device, self.seeds = k, n_hold, device, seeds
        self.name, self.in_shape, self.num_classes = name, tuple(xs[0].shape[1:]), num_classes
        self.batch_size = batch_size
        self.x_fit, self.y_fit, self.x_hold, self.y_hold = x_fit, y_fit, x_hold, y_hold
        self.params, self.buffers, self.base, self.shuffles = params, buffers, base, shuffles
        self.forward = forward
        self.train_fn = vmap(forward, randomness="different")
        self.rows = rows

    def epoch_batches(self) -> list[torch.Tensor]:
        """One epoch's batches of training indices [K, b] (each seed's own order), on the
        device; puts the model in training mode."""
        self.base.train()
        n_fit = self.x_fit.shape[1]
        perms = torch.stack([torch.randperm(n_fit, generator=g) for g in self.shuffles])
        if self.device.type == "cuda":  # a pageable copy would wait for the queued steps
            perms = perms.pin_memory()
        return list(perms.to(self.device, non_blocking=True).split(self.batch_size, dim=1))

    def step(self, optimizer: torch.optim.Optimizer, idx: torch.Tensor) -> None:
        """One Adam step of all K models on the batches ``idx`` [K, b] (:meth:`update`)."""
        logits = self.train_fn(self.params, self.buffers, self.x_fit[self.rows, idx])
        self.update(optimizer, logits, idx)

    def update(
        self, optimizer: torch.optim.Optimizer, logits: torch.Tensor, idx: torch.Tensor
    ) -> None:
        """The optimiser step for ``logits`` [K, b, classes] of the batches ``idx`` [K, b]:
        the loss is the sum over seeds of each seed's mean cross-entropy, so each seed gets
        its own gradient."""
        labels = self.y_fit[self.rows, idx].flatten()
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels, reduction="sum")
        loss = loss / idx.shape[1]
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

        On the CPU a shared set is scored seed by seed in channels-last layout (faster
        there; logits differ by rounding only)."""
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


class EarlyStopping:
    """Per-seed early stopping on the device: best hold-out accuracy, best epoch, epochs
    run, stopped (each [K]) and best parameters ([K, ...] per name). A seed stops, frozen,
    after ``patience`` epochs without a better accuracy; :meth:`finished` reads the flags
    ``lag`` epochs late so the check does not wait on the device."""

    def __init__(self, params: dict[str, torch.Tensor], patience: int, lag: int) -> None:
        k = next(iter(params.values())).shape[0]
        device = next(iter(params.values())).device
        self.patience, self.lag = patience, lag
        self.best_acc = torch.full((k,), -1.0, dtype=torch.float64, device=device)
        self.best_epoch = torch.zeros(k, dtype=torch.int64, device=device)
        self.epochs = torch.zeros(k, dtype=torch.int64, device=device)
        self.done = torch.zeros(k, dtype=torch.bool, device=device)
        self.best = {key: v.detach().clone() for key, v in params.items()}
        self.pending: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []

    @torch.no_grad()
    def update(self, accs: torch.Tensor, epoch: int, params: dict[str, torch.Tensor]) -> None:
        """Record epoch ``epoch``'s hold-out accuracies [K] (queued, no host wait)."""
        active = ~self.done
        self.epochs = torch.where(active, epoch, self.epochs)
        improved = active & (accs > self.best_acc)
        self.best_acc = torch.where(improved, accs, self.best_acc)
        self.best_epoch = torch.where(improved, epoch, self.best_epoch)
        stale = active & ~improved & (epoch - self.best_epoch >= self.patience)
        self.done = self.done | stale
        for key, v in params.items():
            mask = improved.view(-1, *[1] * (v.ndim - 1))
            self.best[key] = torch.where(mask, v.detach(), self.best[key])
        flag = self.done.all()
        if flag.device.type == "cuda":
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((host, event))
        else:
            self.pending.append((flag, None))

    def finished(self) -> bool:
        """Whether every seed had stopped ``lag`` epochs ago (waits only for that epoch)."""
        if len(self.pending) <= self.lag:
            return False
        flag, event = self.pending.pop(0)
        if event is not None:
            event.synchronize()
        return bool(flag)

    def results(self) -> tuple[list[float], list[int], list[int]]:
        """(best hold-out accuracies, epochs run, best epochs) per seed, on the host."""
        return self.best_acc.tolist(), self.epochs.tolist(), self.best_epoch.tolist()


class GraphedStep:
    """``run.step(optimizer, idx)`` for full batches [K, ``batch``] replayed from one CUDA
    graph: the first ``warmup`` calls run eagerly on a side stream, the next one captures
    (into a static index tensor) and replays; calls with another batch shape run eagerly.
    If the capture fails, every step runs eagerly and ``error`` says why."""

    def __init__(
        self, run: BatchedRun, optimizer: torch.optim.Optimizer, batch: int, warmup: int = 3
    ) -> None:
        self.run, self.optimizer, self.warmup = run, optimizer, warmup
        self.idx = torch.zeros((run.k, batch), dtype=torch.int64, device=run.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self.error: str | None = None  # why capture failed (then every step runs eagerly)

    def __call__(self, idx: torch.Tensor) -> None:
        if idx.shape != self.idx.shape:
            self.run.step(self.optimizer, idx)
            return
        if self.graph is None and self.calls < self.warmup:
            self.calls += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.run.step(self.optimizer, idx)
            torch.cuda.current_stream().wait_stream(side)
            return
        if self.error is not None:
            self.run.step(self.optimizer, idx)
            return
        self.idx.copy_(idx)
        if self.graph is None:
            self.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: FID may run in another thread beside the capture
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self.run.step(self.optimizer, self.idx)
            except RuntimeError as err:  # capture refused: a capture runs nothing, so the
                # parameters and Adam's state are as before; this and later steps run eagerly
                self.error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                torch.cuda.synchronize()
                self.run.step(self.optimizer, idx)
                return
            self.graph = graph  # capturing ran nothing: the replay below is this step
        self.graph.replay()


def train_batched(
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
    cuda_graphs: bool | None = None,
    lag: int | None = None,
) -> list[dict]:
    """Train ``name`` (mlp, cnn) per seed on (``xs[k]``, ``ys[k]``): Adam on 90%, early
    stopping on 10% (:class:`EarlyStopping`), best weights tested on ``x_test`` [M,C,H,W].
    ``cuda_graphs`` (default: on CUDA): :class:`GraphedStep`; ``lag`` (default 1 on CUDA,
    else 0): epochs until the stop is read. One record per seed (``training_loop``)."""
    if max_epochs < 1 or patience < 1 or batch_size < 1:
        raise ValueError("max_epochs, patience and batch_size must be >= 1")
    run = BatchedRun(name, xs, ys, num_classes, seeds, batch_size)
    cuda = run.device.type == "cuda"
    cuda_graphs = cuda if cuda_graphs is None else cuda_graphs
    if cuda_graphs and not cuda:
        raise ValueError("cuda_graphs needs the training on a CUDA device")
    lag = (1 if cuda else 0) if lag is None else lag
    params = run.params
    optimizer = torch.optim.Adam(list(params.values()), capturable=cuda_graphs)
    if cuda_graphs:
        step = GraphedStep(run, optimizer, min(batch_size, run.x_fit.shape[1]))
    else:
        step = lambda idx: run.step(optimizer, idx)  # noqa: E731
    stopping = EarlyStopping(params, patience, lag)
    for epoch in range(1, max_epochs + 1):
        for idx in run.epoch_batches():
            step(idx)
        stopping.update(run.accuracy(run.x_hold, run.y_hold, shared=False), epoch, params)
        if stopping.finished():
            break
    with torch.no_grad():
        for key, v in params.items():
            v.copy_(stopping.best[key])
    best_acc, epochs, best_epoch = stopping.results()
    test_acc = run.accuracy(x_test, y_test, shared=True).tolist()
    options = {"cuda_graphs": cuda_graphs, "stop_read_lag_epochs": lag}
    if cuda_graphs and step.error is not None:
        options |= {"cuda_graphs": False, "cuda_graph_error": step.error}
    settings = {"num_holdout": run.n_hold, "max_epochs": max_epochs, "patience": patience}
    settings |= {"batch_size": batch_size, "batched_seeds": run.k, "training_loop": options}
    return [
        {"accuracy": test_acc[j], "holdout_accuracy": float(best_acc[j]), "epochs": epochs[j]}
        | {"best_epoch": best_epoch[j], **settings}
        for j in range(run.k)
    ]
