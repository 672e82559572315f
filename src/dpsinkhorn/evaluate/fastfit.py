"""The batched MLP / CNN training of :func:`classifiers.train_torch_batched` without its
per-epoch host round trips and, on CUDA, without its per-batch launches.

- **Early stopping on the device** (:class:`EarlyStopping`): each seed's best hold-out
  accuracy, best epoch, epoch count and best weights are tensors updated by ``torch.where``,
  so a hold-out check queues work instead of waiting for it. Whether every seed has
  stopped is read ``lag`` epochs later (CUDA: 1, through a pinned copy and an event, while
  the device runs the next epoch; CPU: 0). A seed that has stopped is frozen in the tracker,
  so an extra epoch changes no result, only time.
- **CUDA graphs** (:class:`GraphedStep`, CUDA only): the whole training step of all K seeds
  (gather, vmapped forward and backward, Adam with ``capturable=True``) is captured once
  after three eager steps and replayed for every full batch; an epoch's last, smaller batch
  runs eagerly on the same parameters and optimiser.

On the CPU neither applies (lag 0, no graph): the arithmetic is the reference loop's, and
the results are identical to :func:`classifiers.train_torch_batched`'s
(``tests/test_fastfit.py``). On CUDA Adam's ``capturable`` form rounds its bias corrections
on the device, so results agree within the seed-to-seed spread, not bit for bit.
"""

from __future__ import annotations

import torch

from dpsinkhorn.evaluate.classifiers import BatchedRun


class EarlyStopping:
    """Per-seed early-stopping state on the device: best hold-out accuracy [K] (float64),
    best epoch [K], epochs run [K], stopped [K] and the best parameters (one tensor [K, ...]
    per name). The rule is :func:`classifiers.train_torch_batched`'s."""

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
                with torch.cuda.graph(graph):
                    self.run.step(self.optimizer, self.idx)
            except RuntimeError as err:  # capture refused: a capture runs nothing, so the
                # parameters and Adam's state are as before; this and later steps run eagerly
                self.error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                torch.cuda.synchronize()
                self.run.step(self.optimizer, idx)
                return
            self.graph = graph  # capturing ran nothing: the replay below is this step
        self.graph.replay()


def train_torch_batched_fast(
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
    """:func:`classifiers.train_torch_batched` (same arguments and records) with early
    stopping on the device and, where ``cuda_graphs`` (default: on CUDA), the step replayed
    from a CUDA graph. ``lag`` (default 1 on CUDA, 0 elsewhere) is how many epochs later
    the stop is read. Records gain ``"fast_loop"`` (the options used)."""
    run = BatchedRun(name, xs, ys, num_classes, seeds, max_epochs, patience, batch_size)
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
    return [r | {"fast_loop": options} for r in run.records(test_acc, best_acc, epochs, best_epoch)]
