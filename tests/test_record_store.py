"""Every person's ε counts every DP training that held one of their records
(``privacy.record_store``, ``report.privacy_summary.individual_summary``).

Real data throughout: scikit-learn's digits (1,797 images), tiny DP generators (4 steps).
Cases: the same data prepared under two data_dirs; a neighbouring dataset with one record
removed, and one with one added; two disjoint halves (parallel: one training each); a
half-overlapping pair; a store exported and merged on another machine; a sweep; DP-MERF;
``api.train``; a training recorded only in a data_dir's event record.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import digits_arrays
from test_trainings import DIGITS, TINY, digits_28

from dpsinkhorn import api, cli, fileio
from dpsinkhorn import config as config_lib
from dpsinkhorn.privacy import record_store
from dpsinkhorn.privacy.accounting import composed_epsilon
from dpsinkhorn.privacy.record_store import STORE_ENV, RecordStore, fingerprints, individual
from dpsinkhorn.report.privacy_summary import (
    individual_lines,
    prepared_train_file,
    privacy_summary,
)
from dpsinkhorn.train.sweep import train_sweep


@pytest.fixture
def store(tmp_path, monkeypatch) -> RecordStore:
    """A record store of this test alone (the environment variable points at it)."""
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    return RecordStore(tmp_path / "store")


def _mechanisms(trainings) -> list[tuple[float, float, int]]:
    return [(t.meta["q"], t.meta["noise_multiplier"], t.meta["steps"]) for t in trainings]


def _tiny_merf() -> dict:
    """A DP-MERF experiment of two steps on a tiny generator."""
    return config_lib.make_experiment(
        "merf",
        method="dpmerf",
        generator="merf",
        channels=[20, 8, 4],
        latent_dim=5,
        batch_size=100,
        rff_features=100,
        sigma=2.0,
        steps=2,
        log_every=1,
        checkpoint_every=10,
    )


def _api_train(out: Path, images, labels, **kw) -> dict:
    return api.train(
        {"name": out.name, **TINY},
        out,
        train_data=(images, labels),
        classes=DIGITS,
        device="cpu",
        dataset="digits",
        **kw,
    )


def test_fingerprints_are_keyed_per_image_and_the_store_is_no_membership_oracle(store):
    images, labels = digits_28()
    key = store.key()
    assert stat.S_IMODE(os.stat(store.root / "key").st_mode) == 0o600
    assert store.key() == key  # made once
    mine = fingerprints(key, images)
    assert len(mine) == len(np.unique(images.reshape(len(images), -1), axis=0))
    as_bytes = [bytes(f) for f in mine]
    assert as_bytes == sorted(set(as_bytes))  # sorted, distinct (the digits are)
    # an image is a record: its label and a trailing channel of one do not change it
    assert np.array_equal(fingerprints(key, images[:5, :, :, None]), fingerprints(key, images[:5]))
    twice = np.concatenate([images[:5], images[:5]])  # each record in two rows
    assert np.array_equal(fingerprints(key, twice), np.repeat(fingerprints(key, images[:5]), 2))
    # under another key no fingerprint matches: without the store's key, one cannot test
    # whether an image is in it
    other = fingerprints(os.urandom(32), images)
    assert not record_store.holds(mine, other).any()
    plain = {hashlib.sha256(im.tobytes()).digest()[:16] for im in images}
    assert not plain & {bytes(f) for f in mine}


def test_two_disjoint_halves_pay_one_training_and_an_overlap_pays_both(tmp_path, store):
    """API writer. Halves A and B are disjoint: everyone's ε is that of one training
    (parallel composition). C holds the second half of A and the first half of B: each of
    its records lies in two trainings, and the worst-off person pays both."""
    images, labels = digits_28()
    n = len(images)
    halves = {"a": slice(0, n // 2), "b": slice(n // 2, n), "c": slice(n // 4, 3 * n // 4)}
    records = {}
    for name in ("a", "b"):
        part = halves[name]
        records[name] = _api_train(tmp_path / "run" / name, images[part], labels[part])
    key = store.key()
    for name in ("a", "b"):
        person = individual(store, fingerprints(key, images[halves[name]]))
        (only,) = person["trainings"]
        assert only.meta["experiment"] == name and person["shared"] == 0
        assert person["epsilon_worst_off"] == pytest.approx(records[name]["epsilon"], rel=1e-9)
        # δ plus the Poisson overflow's charge: the ledger's own delta_total, for one training
        assert person["delta_total"] == pytest.approx(records[name]["delta_total"], rel=1e-9)
        assert person["delta_total"] > person["delta"] == records[name]["delta"]
    records["c"] = _api_train(tmp_path / "run" / "c", images[halves["c"]], labels[halves["c"]])
    for name in ("a", "b", "c"):
        person = individual(store, fingerprints(key, images[halves[name]]))
        by_name = {t.meta["experiment"]: t for t in person["trainings"]}
        assert set(by_name) == ({"a", "b", "c"} if name == "c" else {name, "c"})
        assert person["shared"] == n // 4 + (name == "c") * (3 * n // 4 - n // 2)
        worst = max(
            composed_epsilon(_mechanisms([by_name[x], by_name["c"]]), 1e-5)
            for x in by_name
            if x != "c"
        )
        assert person["epsilon_worst_off"] == pytest.approx(worst, rel=1e-9)
        assert person["epsilon_worst_off"] > max(r["epsilon"] for r in records.values())
        # every training that held one of the records: (1 + e^ε)·Σ T_i·p_i, p_i its ledger's
        steps_p = sum(
            t.meta["steps"] * records[x]["poisson_overflow_probability_per_step"]
            for x, t in by_name.items()
        )
        charge = (1 + math.exp(person["epsilon_worst_off"])) * steps_p
        assert person["delta_total"] == pytest.approx(1e-5 + charge, rel=1e-9)


def _config(tmp_path: Path, run: str, data_dir: str, npz: Path) -> Path:
    config = {
        "run_name": run,
        "data_dir": data_dir,
        "device": "cpu",
        "seeds": [0],
        "datasets": {
            "clothes": {"path": str(npz), "classes": DIGITS, "image_size": 28, "resize": True}
        },
        "training_defaults": TINY,
        "experiments": {"clothes_dp": {"dataset": "clothes", "table1_row": "paper"}},
    }
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _npz(path: Path, images, labels) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=images, labels=labels)
    return path


def _prepare_and_train(configfile: Path, run: str) -> dict:
    cfg = config_lib.load_config([str(configfile)])
    args = ["--config", str(configfile)]
    assert cli.main(["data", "--dataset", "clothes", "--root", cfg["data_dir"], *args]) == 0
    out = ["--experiment", "clothes_dp", "--out", f"results/{run}/clothes_dp", "--no-progress"]
    assert cli.main(["train", *args, *out]) == 0
    return cfg


def test_the_same_data_under_two_data_dirs_and_its_neighbours_count_together(
    tmp_path, store, monkeypatch, capsys
):
    """CLI writer and the summary. The digits prepared under data_dirs d1 and d2 are the
    same records; a copy less one image, and one with one image more, are neighbours that
    share all others. Each run's summary composes every training that held its records;
    the data_dir's own record (``all_trainings``) sees only its split."""
    monkeypatch.chdir(tmp_path)
    images, labels = digits_arrays()
    new = np.fliplr(images[0])[None]  # an image the digits do not hold
    assert not (images == new).all(axis=(1, 2)).any()
    data = {
        "one": ("d1", images, labels),
        "two": ("d2", images, labels),
        "removed": ("d1", images[1:], labels[1:]),
        "added": ("d1", np.concatenate([images, new]), np.append(labels, 0)),
    }
    splits: dict[str, set[bytes]] = {}  # each run's prepared training split, as images
    for run, (data_dir, x, y) in data.items():
        npz = _npz(tmp_path / "sources" / run / "clothes.npz", x, y)
        cfg = _prepare_and_train(_config(tmp_path, run, data_dir, npz), run)
        split, _ = fileio.load_samples(prepared_train_file(cfg, "clothes"))
        splits[run] = {image.tobytes() for image in split}
        earlier = [r for r in splits if r != run and splits[r] & splits[run]]
        shared = len(splits[run] & set().union(*(splits[r] for r in earlier)))
        # a neighbour's train/test split is drawn again, yet most records stay in training
        assert run == "one" or shared > len(splits[run]) // 2
        curator: list[str] = []
        (summary,) = privacy_summary(cfg, f"results/{run}", curator)["datasets"]
        person = summary["individual"]
        assert person["trainings"] == len(earlier) + 1 == len(splits), (run, person)
        assert summary["all_trainings"]["trainings"] == 1  # its data_dir's split only
        ledger = fileio.read_json(Path(f"results/{run}/clothes_dp/privacy.json"))
        every = summary["all_trainings"]
        assert every["delta_total"] == pytest.approx(ledger["delta_total"], rel=1e-9)
        assert person["epsilon_worst_off"] == pytest.approx(
            composed_epsilon(_mechanisms(store.trainings()), summary["delta"]), rel=1e-9
        )
        assert sorted(person["other_runs"]) == [f"clothes_dp (run {r})" for r in sorted(earlier)]
        if earlier:
            (warning,) = [w for w in summary["warnings"] if "outside this run" in w]
            assert all(f"(run {r})" in warning for r in earlier)
            assert person["epsilon_worst_off"] > summary["all_trainings"]["epsilon_composed"]
        # the counts from the private data reach the curator, never the summary
        assert "shared" not in str(person) and len(curator) == 1
        assert "no_guarantee" not in person  # secret noise keys
        assert f"{shared} record(s) lie in more than one" in curator[0]
        (line, *_) = individual_lines({"datasets": [summary]})
        assert "per release" in line and f"{person['epsilon_worst_off']:.4g}" in line


def test_an_exported_store_merges_once_and_another_key_is_refused(
    tmp_path, store, monkeypatch, capsys
):
    """Machine A trains half of the digits; machine B starts from A's export, trains an
    overlapping half, exports; A merges it (twice: the second changes nothing) and its
    overlap sees both. A store with its own key and trainings refuses the export."""
    images, labels = digits_28()
    n = len(images)
    _api_train(tmp_path / "a" / "first", images[: n // 2], labels[: n // 2])
    out = tmp_path / "a.tar"
    assert cli.main(["records", "export", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    with tarfile.open(out) as tar:
        assert "key" in tar.getnames()

    other = tmp_path / "machine_b"
    monkeypatch.setenv(STORE_ENV, str(other))
    assert cli.main(["records", "merge", str(out)]) == 0  # an empty store takes A's key
    _api_train(tmp_path / "b" / "second", images[n // 4 :], labels[n // 4 :])
    back = tmp_path / "b.tar"
    assert cli.main(["records", "export", str(back)]) == 0

    monkeypatch.setenv(STORE_ENV, str(store.root))
    assert store.merge(back) == (1, 2)
    assert store.merge(back) == (0, 2)  # merging twice: no double count
    assert len(store.trainings()) == 2
    person = individual(store, fingerprints(store.key(), images[n // 4 : n // 2]))
    assert len(person["trainings"]) == 2
    assert person["epsilon_worst_off"] == pytest.approx(
        composed_epsilon(_mechanisms(store.trainings()), 1e-5), rel=1e-9
    )
    capsys.readouterr()
    assert cli.main(["records", "show"]) == 0
    shown = capsys.readouterr().out
    assert "2 training(s)" in shown and "first" in shown and "second" in shown

    alien = RecordStore(tmp_path / "alien")
    (one, *_) = store.trainings()
    alien.put(one.meta, fingerprints(alien.key(), images))
    alien_tar = alien.export(tmp_path / "alien.tar")
    assert cli.main(["records", "merge", str(alien_tar)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key differs" in err[0] and STORE_ENV in err[0], err
    assert len(store.trainings()) == 2

    # a DP training stored without its mechanism is refused, never left out of an epsilon
    bare = RecordStore(tmp_path / "bare")
    bare.put({**one.meta, "noise_multiplier": None}, fingerprints(bare.key(), images))
    with pytest.raises(ValueError, match=rf"{one.id}\.npz: a DP training .* its mechanism"):
        individual(bare, fingerprints(bare.key(), images))
    assert cli.main(["records", "merge", str(bare.export(tmp_path / "bare.tar"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bare.tar:trainings/" in err[0] and "mechanism" in err[0], err

    # a file that is no tar archive, or a cut one: one line naming it
    cut, text = tmp_path / "cut.tar", tmp_path / "summary.json"
    cut.write_bytes(back.read_bytes()[:700])
    text.write_text("{}")
    for bad in (text, cut):
        assert cli.main(["records", "merge", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{bad}: not a record store export" in err[0], err


def test_a_sweep_and_dpmerf_put_every_training_into_the_store(tmp_path, store):
    images, labels = digits_28()
    specs = [
        config_lib.make_experiment(name, dataset="mnist", **{**TINY, "sigma": sigma})
        for name, sigma in (("s1", 1.5), ("s2", 2.0))
    ]
    done = train_sweep(
        specs,
        [tmp_path / "sweep" / s["name"] for s in specs],
        train_data=(images, labels),
        device="cpu",
        progress=False,
    )
    merf = _tiny_merf()
    from dpsinkhorn.train.run import train

    merf_record = train(
        merf, tmp_path / "merf" / "merf", train_data=(images, labels), device="cpu", progress=False
    )
    by_name = {t.meta["experiment"]: t for t in store.trainings()}
    assert set(by_name) == {"s1", "s2", "merf"}
    assert all(t.meta["finished"] and t.meta["records"] == len(images) for t in by_name.values())
    assert by_name["merf"].meta["steps"] == 1 and by_name["merf"].meta["q"] == 1.0
    for record, name in ((done[0], "s1"), (done[1], "s2"), (merf_record, "merf")):
        alone = composed_epsilon(_mechanisms([by_name[name]]), record["delta"])
        assert alone == pytest.approx(record["epsilon"], rel=1e-6)
    person = individual(store, fingerprints(store.key(), images[:10]))
    assert person["epsilon_worst_off"] == pytest.approx(
        composed_epsilon(_mechanisms(by_name.values()), 1e-5), rel=1e-9
    )


def test_a_training_only_in_a_data_dirs_event_record_keeps_counting(tmp_path, store):
    """A training whose store was lost (or that predates the store) is imported from the
    event record beside its data, fingerprinted from the split that record names."""
    images, labels = digits_28()
    _api_train(tmp_path / "run" / "old", images, labels, record_dir=tmp_path / "events")
    (before,) = store.trainings()
    for path in store.folder.iterdir():
        path.unlink()
    from dpsinkhorn.privacy import trainings

    events = trainings.source_trainings(
        tmp_path / "events", trainings.data_fingerprint(images, labels)
    )
    assert record_store.import_record(store, events, lambda: fingerprints(store.key(), images)) == 1
    assert record_store.import_record(store, events, lambda: fingerprints(store.key(), images)) == 0
    (after,) = store.trainings()
    assert after.id == before.id and np.array_equal(after.fingerprints, before.fingerprints)
    person = individual(store, fingerprints(store.key(), images[:3]))
    assert person["epsilon_worst_off"] == pytest.approx(
        composed_epsilon(_mechanisms([before]), 1e-5), rel=1e-9
    )


def test_the_store_is_the_config_key_else_the_environment_else_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "env"))
    assert record_store.store_root({"record_store": str(tmp_path / "cfg")}) == tmp_path / "cfg"
    assert record_store.store_root({}) == tmp_path / "env"
    monkeypatch.delenv(STORE_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert record_store.store_root() == tmp_path / "xdg" / "dpsinkhorn" / "records"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert record_store.store_root() == tmp_path / "home/.local/share/dpsinkhorn/records"


def _group_epsilon(q: float, z: float, steps: int, k: int, delta: float) -> float:
    """ε of a record held k times by one training, from dp-accounting directly: the rows of
    the k copies change the clipped block by at most its any-change bound, so a DP-Sinkhorn
    training (q < 1) is a Poisson-subsampled Gaussian at rate 1 − (1 − q)^k; one Gaussian
    release of a sum (DP-MERF, q = 1) has sensitivity k."""
    import dp_accounting
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    acc = RdpAccountant()
    if q < 1:
        event = dp_accounting.GaussianDpEvent(z)
        acc.compose(dp_accounting.PoissonSampledDpEvent(1 - (1 - q) ** k, event), steps)
    else:
        acc.compose(dp_accounting.GaussianDpEvent(z / k), steps)
    return acc.get_epsilon(delta)


def test_an_image_held_twice_by_one_training_pays_for_both_copies(tmp_path, store):
    """A record is an image: one that lies twice in a training's data (a user's photo
    copied, one image under two labels) is removed with both rows, so its ε is that of a
    group of two, for DP-Sinkhorn and DP-MERF alike, and survives an export and merge."""
    images, labels = digits_28()
    twice = np.concatenate([images, images[:1]])
    relabelled = np.concatenate([labels, (labels[:1] + 1) % 10])
    record = _api_train(tmp_path / "run" / "dup", twice, relabelled)
    from dpsinkhorn.train.run import train

    merf = _tiny_merf()
    merf_record = train(
        merf, tmp_path / "merf", train_data=(twice, relabelled), device="cpu", progress=False
    )
    key = store.key()
    mine = fingerprints(key, twice)
    by_name = {t.meta["experiment"]: t for t in store.trainings()}
    assert set(by_name) == {"dup", "merf"}
    for name, rec in (("dup", record), ("merf", merf_record)):
        alone = RecordStore(tmp_path / f"alone-{name}")
        alone.merge(store.export(tmp_path / f"{name}.tar"))
        for t in alone.trainings():
            if t.meta["experiment"] != name:
                alone.path(t.id).unlink()
        (only,) = alone.trainings()
        q, z, steps = rec["q"], rec["noise_multiplier"], rec["steps"]
        group = _group_epsilon(q, z, steps, 2, rec["delta"])
        assert group > 1.2 * rec["epsilon"]
        # the duplicated image is the worst-off record; every other one pays one row
        person = individual(alone, mine)
        assert person["epsilon_worst_off"] == pytest.approx(group, rel=1e-6)
        others = individual(alone, fingerprints(key, images[1:]))
        assert others["epsilon_worst_off"] == pytest.approx(rec["epsilon"], rel=1e-6)
    both = individual(store, mine)
    assert both["epsilon_worst_off"] > max(
        _group_epsilon(r["q"], r["noise_multiplier"], r["steps"], 2, 1e-5)
        for r in (record, merf_record)
    )


def test_a_small_noise_multiplier_whose_rdp_is_infinite_at_low_orders_is_composed(store):
    """At σ = 0.656, q = 50/1617 (docs/OWN_DATA.md's setting) dp-accounting's RDP curve is
    inf at orders 1.1-1.3; two trainings that share some records still give the worst-off
    person (the shared ones, in both) at once."""
    from dpsinkhorn.privacy.accounting import new_accountant

    meta = {"q": 50 / 1617, "noise_multiplier": 0.656, "steps": 300, "delta": 1e-5}
    assert np.isinf(new_accountant(record_store.mechanisms([meta]))._rdp).any()  # noqa: SLF001
    random = np.random.default_rng(0).bytes(16 * 40)
    fps = np.sort(np.frombuffer(random, dtype=record_store.FINGERPRINT_DTYPE))
    for name, held in (("all", fps), ("half", fps[:20])):
        store.put({**meta, "training": name, "experiment": name, "private": True}, held)
    person = individual(store, fps)
    assert sorted(t.id for t in person["worst_off"]) == ["all", "half"]
    both = composed_epsilon(record_store.mechanisms([meta, meta]), 1e-5)
    assert person["epsilon_worst_off"] == pytest.approx(both, rel=1e-9)


def test_the_collision_bound_privacy_md_quotes_holds():
    """PRIVACY.md's bound on a fingerprint collision among 10⁹ images is at least the
    birthday bound N²/2^(b+1) of the store's b-bit fingerprints."""
    import re

    text = (Path(__file__).parents[1] / "docs" / "PRIVACY.md").read_text()
    bits = 8 * record_store.FINGERPRINT_BYTES
    assert f"{bits}-bit fingerprints" in text
    quoted = re.search(r"under (?:(\d+)·)?10⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]+) for N = 10⁹", text)
    assert quoted is not None
    exponent = int(quoted.group(2).translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")))
    assert int(quoted.group(1) or 1) * 10.0**-exponent >= (10**9) ** 2 / 2 ** (bits + 1)
