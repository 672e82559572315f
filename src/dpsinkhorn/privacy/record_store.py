"""The record store: which training records (images) every DP training of this user held.

One store per user (:func:`store_root`): a secret ``key`` and one ``trainings/<id>.npz`` per
training (keyed fingerprints of its images, how many times each is held, its public
settings). A person's ε (:func:`individual`) composes every DP training that held one of
their records (RDP, add/remove-one adjacency, Poisson-subsampled Gaussian steps; a record
held k times by one training as a group of k: :func:`group_mechanism`) at the largest δ.
``dpsinkhorn records show|export|merge``; docs/PRIVACY.md ("The record store").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import hmac
import io
import json
import os
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsinkhorn.privacy.trainings import MECHANISM as MECHANISM_KEYS
from dpsinkhorn.privacy.trainings import accounted, mechanisms, overflow_delta, overflow_terms

#: Environment variable naming the store (the config key ``record_store`` wins over it).
STORE_ENV = "DPSINKHORN_RECORD_STORE"
#: The store's key file and trainings folder.
KEY_FILE, TRAININGS = "key", "trainings"
#: Bytes of HMAC-SHA256 kept per record: 128 bits.
FINGERPRINT_BYTES = 16
FINGERPRINT_DTYPE = f"V{FINGERPRINT_BYTES}"
#: What :func:`individual` composes, said in the summary.
MECHANISM = (
    "every DP training that held one of the person's records (an identical image is the "
    "same record), each a sequence of Poisson-subsampled Gaussian steps under add/remove-one "
    "adjacency (a record held k times by one training: a group of k), composed (RDP curves "
    "added, dp-accounting) at the largest delta"
)


def store_root(config: Mapping | None = None) -> Path:
    """The record store's folder: ``config["record_store"]``, else ``$DPSINKHORN_RECORD_STORE``,
    else ``$XDG_DATA_HOME/dpsinkhorn/records`` (``~/.local/share/dpsinkhorn/records``)."""
    if config and config.get("record_store"):
        return Path(os.path.expanduser(str(config["record_store"])))
    if os.environ.get(STORE_ENV):
        return Path(os.path.expanduser(os.environ[STORE_ENV]))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return Path(base) / "dpsinkhorn" / "records"


def _write_atomic(path: Path, payload: bytes, replace: bool = True) -> None:
    """Write ``payload`` to ``path`` through a temporary file beside it (0600), fsynced,
    then renamed onto it (``replace``) or linked to it (else: a ``path`` that exists wins):
    a reader sees the old file or the new one, never part of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def fingerprints(key: bytes, images: np.ndarray) -> np.ndarray:
    """The sorted fingerprints of ``images`` (uint8 [N,S,S] or [N,S,S,C]; [S,S,1] counts as
    [S,S]): per image the first :data:`FINGERPRINT_BYTES` bytes of HMAC-SHA256 under ``key``
    of its dtype, shape and bytes; labels are not part of a record. Returns [N] of dtype
    V16: an image held k times is k equal fingerprints (a record in k rows)."""
    images = np.asarray(images)
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    images = np.ascontiguousarray(images)
    head = hmac.new(key, f"{images.dtype.str}{images.shape[1:]}|".encode(), hashlib.sha256)
    out = bytearray()
    for row in images.reshape(len(images), -1):
        h = head.copy()
        h.update(row)
        out += h.digest()[:FINGERPRINT_BYTES]
    return np.sort(np.frombuffer(bytes(out), dtype=FINGERPRINT_DTYPE))


def holds(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Which of ``query`` are in ``sorted_keys`` (sorted V16): bool [len(query)]."""
    if not len(sorted_keys):
        return np.zeros(len(query), dtype=bool)
    at = np.searchsorted(sorted_keys, query)
    at[at == len(sorted_keys)] = 0
    return sorted_keys[at] == query


def group_mechanism(training: Mapping, k: int) -> tuple[float, float, int]:
    """(q, noise multiplier, steps) that account a record held ``k`` times by ``training``
    (its public ``meta``): removing the record removes k rows. A DP-Sinkhorn step's clipped
    block changes by at most its sensitivity whatever rows change, and it changes only when
    one of the k rows is sampled: a Poisson-subsampled Gaussian at rate 1 − (1 − q)^k, same
    z (docs/PRIVACY.md, "The record store"). q = 1 (DP-MERF's one release of a sum, whose
    sensitivity is k; a DP-Sinkhorn training with B = N, for which this is an upper bound):
    noise multiplier z / k."""
    q, z, steps = mechanisms([training])[0]
    if k == 1:
        return q, z, steps
    if q < 1:
        return -float(np.expm1(k * np.log1p(-q))), z, steps
    return q, z / k, steps


@dataclass
class Training:
    """One stored training: its public ``meta``, its records' distinct ``fingerprints``, and
    those it held more than once (``repeated``, sorted) with how many times (``repeats``)."""

    meta: dict
    fingerprints: np.ndarray
    repeated: np.ndarray = field(default_factory=lambda: np.zeros(0, FINGERPRINT_DTYPE))
    repeats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))

    @property
    def id(self) -> str:
        return str(self.meta["training"])

    def multiplicity(self, query: np.ndarray) -> np.ndarray:
        """How many times this training held each of ``query`` (V16): int64 [len(query)]."""
        count = holds(self.fingerprints, query).astype(np.int64)
        if len(self.repeated):
            at = np.searchsorted(self.repeated, query)
            at[at == len(self.repeated)] = 0
            many = self.repeated[at] == query
            count[many] = self.repeats[at[many]]
        return count

    def held(self) -> np.ndarray:
        """Its records' fingerprints, each as many times as it was held (sorted)."""
        count = np.ones(len(self.fingerprints), np.int64)
        count[np.searchsorted(self.fingerprints, self.repeated)] = self.repeats
        return np.repeat(self.fingerprints, count)


def _load(source: Path | io.BytesIO, where: object = None) -> Training:
    """One stored training from a file or bytes; ``where`` names it in errors."""
    where = source if where is None else where
    try:
        with np.load(source, allow_pickle=False) as z:
            meta, fps = json.loads(str(z["meta"])), z["fingerprints"]
            repeated = z["repeated"] if "repeated" in z.files else fps[:0]
            repeats = z["repeats"] if "repeats" in z.files else np.zeros(0, np.uint32)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{where}: not a training of a record store ({err})") from None
    if (
        fps.dtype != np.dtype(FINGERPRINT_DTYPE)
        or repeated.dtype != fps.dtype
        or repeats.shape != repeated.shape
        or not (repeats > 1).all()
        or not holds(fps, repeated).all()
        or not isinstance(meta.get("training"), str)
    ):
        raise ValueError(f"{where}: not a training of a record store (fingerprints or id)")
    if meta.get("private") is not False and not accounted(meta):  # never left out
        raise ValueError(
            f"{where}: a DP training of a record store without its mechanism "
            f"({', '.join(MECHANISM_KEYS)}): the store is damaged or older"
        )
    return Training(meta, fps, repeated, repeats.astype(np.uint32))


def _further(new: Mapping, old: Mapping) -> bool:
    """Whether ``new`` says more of one training than ``old``: finished, or more steps."""
    return (bool(new.get("finished")), new.get("steps") or 0) > (
        bool(old.get("finished")),
        old.get("steps") or 0,
    )


class RecordStore:
    """The record store in ``root`` (:func:`store_root`)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.folder = self.root / TRAININGS
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    def fingerprints_of(self, images: np.ndarray) -> np.ndarray:
        """:func:`fingerprints` of ``images`` under this store's key; the last array's are
        kept, so a sweep's members (one array) hash it once."""
        if self._last is None or self._last[0] is not images:
            self._last = (images, fingerprints(self.key(), images))
        return self._last[1]

    # -- the key
    def has_key(self) -> bool:
        return (self.root / KEY_FILE).is_file()

    def key(self) -> bytes:
        """The store's secret key, made (32 random bytes, 0600) on first use. Two writers
        that make it at once agree: the first link wins, the other reads it."""
        path = self.root / KEY_FILE
        if not path.is_file():
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_atomic(path, secrets.token_bytes(32), replace=False)
        key = path.read_bytes()
        if len(key) != 32:
            raise ValueError(f"{path}: not a record store key (32 bytes)")
        return key

    # -- trainings
    def path(self, training: str) -> Path:
        return self.folder / f"{training}.npz"

    def get(self, training: str) -> Training | None:
        path = self.path(training)
        return _load(path) if path.is_file() else None

    def put(self, meta: Mapping, fps: np.ndarray | Callable[[], np.ndarray]) -> bool:
        """Write one training (atomically, its own file) with the fingerprints ``fps`` of
        every row it trained on (:func:`fingerprints`; or ``fps()``, called only for a
        training the store lacks), unless the store already holds as much of it
        (:func:`_further`). Returns whether it wrote."""
        old = self.get(str(meta["training"]))
        if old is not None and not _further(meta, old.meta):
            return False
        if old is not None:
            fps = old.held()
        elif callable(fps):
            fps = fps()
        fps, counts = np.unique(np.asarray(fps), return_counts=True)
        # key_id: a name of the key that reveals nothing of it
        key_id = hashlib.sha256(b"dpsinkhorn record store key|" + self.key()).hexdigest()[:16]
        meta = {**meta, "key_id": key_id, "records": int(len(fps))}
        if old is not None and old.meta.get("time"):
            meta["time"] = old.meta["time"]  # when it started
        buf = io.BytesIO()
        many = counts > 1
        np.savez(
            buf,
            fingerprints=fps,
            repeated=fps[many],
            repeats=counts[many].astype(np.uint32),
            meta=np.array(json.dumps(meta, sort_keys=True)),
        )
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_atomic(self.path(str(meta["training"])), buf.getvalue())
        return True

    def trainings(self) -> list[Training]:
        """Every stored training, oldest first (time, then id)."""
        paths = sorted(self.folder.glob("*.npz")) if self.folder.is_dir() else []
        found = [_load(p) for p in paths]
        return sorted(found, key=lambda t: (str(t.meta.get("time", "")), t.id))

    # -- moving between machines
    def export(self, out: str | os.PathLike) -> Path:
        """Write the key and every training into the tar file ``out`` (atomically, 0600: it
        holds the key). Returns ``out``."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path in [self.root / KEY_FILE, *sorted(self.folder.glob("*.npz"))]:
                if path.is_file():
                    tar.add(path, arcname=path.relative_to(self.root).as_posix())
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(out, buf.getvalue())
        return out

    def merge(self, archive: str | os.PathLike) -> tuple[int, int]:
        """Merge an :meth:`export` into this store: its trainings this store lacks, or
        holds less of (:func:`_further`); merging twice changes nothing. A store without
        trainings takes the export's key; one with trainings under another key refuses
        (ValueError, one line). Returns (trainings added or advanced, trainings read)."""
        try:
            with tarfile.open(archive, mode="r") as tar:
                members = {m.name: m for m in tar.getmembers() if m.isfile()}
                if KEY_FILE not in members:
                    raise ValueError(f"{archive}: not a record store export (no key)")
                theirs = tar.extractfile(members[KEY_FILE]).read()
                entries = []
                for name, member in sorted(members.items()):
                    if name.startswith(f"{TRAININGS}/") and name.endswith(".npz"):
                        raw = io.BytesIO(tar.extractfile(member).read())
                        entries.append(_load(raw, f"{archive}:{name}"))
        except (tarfile.TarError, EOFError) as err:
            raise ValueError(f"{archive}: not a record store export ({err})") from None
        if len(theirs) != 32:
            raise ValueError(f"{archive}: not a record store export (its key is not 32 bytes)")
        if not self.has_key() or not self.trainings():
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_atomic(self.root / KEY_FILE, theirs)
        elif self.key() != theirs:
            raise ValueError(
                f"{archive}: its key differs from that of the record store {self.root}, which "
                "holds trainings; fingerprints compare only under one key: merge into an empty "
                f"store (e.g. {STORE_ENV}=<new folder>), or give every machine one store's "
                "export before it trains"
            )
        return sum(self.put(t.meta, t.held()) for t in entries), len(entries)


def stored_meta(record: Mapping) -> dict:
    """What the store keeps of a training of the event record (``privacy.trainings``'s
    merged entry): its public settings and step counts."""
    keys = ("training", "experiment", "out", "private", "reproducible", "q")
    keys += ("noise_multiplier", "delta", "accountant", "steps", "steps_planned", "finished")
    keys += ("overflow_probability",)
    meta = {k: record.get(k) for k in keys}
    meta["time"] = record.get("time") or time.strftime("%Y-%m-%dT%H:%M:%S")
    return meta


def import_record(
    store: RecordStore, records: Iterable[Mapping], fps: Callable[[], np.ndarray]
) -> int:
    """Put into ``store`` every DP training of ``records`` (merged entries of a training
    record file, ``privacy.trainings.trainings``) it lacks or holds less of, with the
    fingerprints ``fps()`` (called once, only when needed) of the split that record names.
    Returns how many were written."""
    fps = functools.cache(fps)
    return sum(store.put(stored_meta(t), fps) for t in records if t["private"])


def individual(store: RecordStore, data: np.ndarray, delta: float | None = None) -> dict:
    """Per-person ε for the records ``data`` (sorted fingerprints): the ε of the worst-off
    record, its trainings composed (:data:`MECHANISM`; one that held it k times as
    :func:`group_mechanism`) at the largest δ (theirs and ``delta``).

    Returns ``epsilon_worst_off`` (None when no training held one), ``delta``,
    ``delta_total`` (δ plus the Poisson overflow's charge, ``trainings.overflow_delta``, over
    every training that held one; None when a record lacks its overflow probability),
    ``trainings`` (those that held one), ``public_seed`` (those of them whose noise seed was
    public, ``reproducible``: no guarantee for the records they held, whose ε counts their
    noise as if it were secret), ``worst_off`` (the worst-off record's), and, for
    the curator only (counts from the private data), ``shared`` (records in more than one
    training) and ``overlap`` (per training)."""
    data = np.unique(np.asarray(data))
    held, members = [], []
    for t in store.trainings():
        if t.meta.get("private") is False:
            continue
        m = t.multiplicity(data)
        if m.any():
            held.append(t)
            members.append(m)
    out = {
        "epsilon_worst_off": None,
        "delta": delta,
        "delta_total": None,
        "trainings": held,
        "public_seed": [t for t in held if t.meta.get("reproducible")],
        "worst_off": [],
        "shared": 0,
        "overlap": {},
    }
    if not held:
        return out
    # [records, trainings]: how many times each held it, in the narrowest unsigned integer
    # (the unique rows below sort whole rows: 1 byte a cell where no count exceeds 255)
    dtype = np.min_scalar_type(max(int(m.max()) for m in members))
    matrix = np.stack([m.astype(dtype) for m in members], axis=1)
    out["shared"] = int(((matrix > 0).sum(axis=1) > 1).sum())
    out["overlap"] = {t.id: int((m > 0).sum()) for t, m in zip(held, members, strict=True)}
    deltas = [float(t.meta["delta"]) for t in held]
    out["delta"] = max(deltas if delta is None else [*deltas, delta])
    from dpsinkhorn.privacy.accounting import new_accountant  # at use: slow

    # each training's RDP curve per multiplicity k: its steps Poisson-subsampled Gaussian
    # steps (group_mechanism: rate q, noise multiplier z, add/remove-one adjacency),
    # dp-accounting's RDP accountant
    signatures = np.unique(matrix, axis=0)  # [S, trainings]: how many times each held it
    rdp: dict[tuple, np.ndarray] = {}  # one accountant per distinct mechanism
    summed = None
    for j, t in enumerate(held):
        for k in np.unique(signatures[:, j]):
            if k:
                mechanism = group_mechanism(t.meta, int(k))
                if mechanism not in rdp:
                    curve = new_accountant([mechanism])
                    orders, rdp[mechanism] = curve._orders, curve._rdp  # noqa: SLF001
                if summed is None:  # the curves add across trainings (same orders)
                    summed = np.zeros((len(signatures), len(orders)))
                summed[signatures[:, j] == k] += rdp[mechanism]
    row, out["epsilon_worst_off"] = _worst_row(summed, orders, out["delta"])
    chosen = [(t, int(k)) for t, k in zip(held, signatures[row], strict=True) if k]
    out["worst_off"] = [t for t, _ in chosen]
    # Every person is (ε_worst_off, δ + charge)-DP: their trainings' ideal mechanism is
    # (ε_worst_off, δ)-DP, and the overflow coupling over all steps of the trainings that
    # held any of the records (a superset of theirs; each p bounds removing k rows) adds it.
    charge = overflow_delta(overflow_terms(t.meta for t in held), out["epsilon_worst_off"])
    out["delta_total"] = None if charge is None else out["delta"] + charge
    return out


def _worst_row(summed: np.ndarray, orders, delta: float) -> tuple[int, float]:
    """The row of ``summed`` (float [S, orders]: each set of trainings' RDP curve, summed
    under composition) of largest ε at ``delta``, and that ε (dp-accounting's conversion,
    as ``composed_epsilon``'s); a row whose curve lies below a converted one at every order
    is skipped (ε grows with it)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    left, best, best_eps = np.arange(len(summed)), 0, -1.0
    while left.size:
        row = left[np.argmax(summed[left].sum(axis=1))]
        eps = compute_epsilon(orders, summed[row], delta)[0]
        if eps > best_eps:
            best, best_eps = int(row), float(eps)
        below = (summed[left] <= summed[row]).all(axis=1)
        left = left[~below & (left != row)]  # the row itself goes, whatever its values
    return best, best_eps


# ---------------------------------------------------------------- command line


def _store_of(args: argparse.Namespace) -> RecordStore:
    return RecordStore(args.store or store_root())  # a config's record_store: --store


def _show(args: argparse.Namespace) -> int:
    store = _store_of(args)
    found = store.trainings()
    print(f"record store {store.root}: {len(found)} training(s)")
    for t in found:
        m = t.meta
        state = "finished" if m.get("finished") else "unfinished"
        print(
            f"  {t.id}  {m.get('time', '?')}  {m.get('experiment', '?')} ({m.get('out', '?')})"
            f"  {m.get('records')} records  "
            f"q {m.get('q')}  z {m.get('noise_multiplier')}  {m.get('steps')} steps  "
            f"delta {m.get('delta')}  {state}"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    store = _store_of(args)
    if not store.has_key():
        raise ValueError(f"{store.root}: no record store there (no key): nothing to export")
    print(f"{store.export(args.out)}: the key and {len(store.trainings())} training(s)")
    return 0


def _merge(args: argparse.Namespace) -> int:
    store = _store_of(args)
    changed, read = store.merge(args.archive)
    print(f"{store.root}: merged {args.archive}: {changed} of {read} training(s) new or advanced")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "records", help="the per-user record store: show it, export it, merge an export"
    )
    p.add_argument(
        "--store",
        help=f"the store's folder (default: ${STORE_ENV}, else the XDG data folder; a "
        "config that sets record_store: pass that folder here)",
    )
    sub = p.add_subparsers(dest="records_command", required=True, metavar="ACTION")
    sub.add_parser("show", help="list the stored trainings").set_defaults(handler=_show)
    e = sub.add_parser("export", help="write the key and every training into a tar file")
    e.add_argument("out", help="the tar file to write (it holds the key: keep it private)")
    e.set_defaults(handler=_export)
    m = sub.add_parser("merge", help="merge another store's export into this one")
    m.add_argument("archive", help="a tar file written by `dpsinkhorn records export`")
    m.set_defaults(handler=_merge)
