"""What the calls of a GPU window carry in (``dpsinkhorn gpu-window-carry``) and how the GPU
machine takes it: every call within its transfer limit, datasets only with the first item
that needs them, the Inception weights without fc split at call boundaries and joined to
the very bytes that were split, items waiting for what has not arrived."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from helpers import REPO, require_shared, shared_path

from dpsinkhorn import fileio
from dpsinkhorn.config.validate import load_config
from dpsinkhorn.evaluate import inception
from dpsinkhorn.window_setup import (
    DEFAULT_EXCLUDE,
    WEIGHTS,
    load_window,
    missing_needs,
    pack_within,
    plan_carry,
    take_setup,
)

WINDOW = """\
configfile: {config}
work:
  - name: committed
    import: {{mnist_dpsinkhorn: gen}}
  - {{name: real_mnist, experiments: [real_mnist]}}
  - {{name: fmnist, experiments: [fmnist_dpsinkhorn]}}
  - name: dpmerf
    import: {{mnist_dpmerf: "repo:results-paper-scale/dpmerf-cpu/mnist_dpmerf"}}
"""


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """A three-item window planned with a 40 MiB limit (the weights then need three calls)."""
    root = tmp_path_factory.mktemp("carry")
    mirror = require_shared(shared_path("DPSINKHORN_DATA_MIRROR"), "MNIST mirror")
    weights = require_shared(shared_path("DPSINKHORN_FID_WEIGHTS"), "Inception weights")
    (root / "imports" / "gen").mkdir(parents=True)
    (root / "imports" / "gen" / "generator.pt").write_bytes(b"g" * 1000)
    (root / "window.yaml").write_text(WINDOW.format(config=REPO / "config" / "config.yaml"))
    window = load_window(root / "window.yaml")
    plan = plan_carry(
        window,
        root / "out",
        mirror=mirror,
        weights=weights,
        import_root=root / "imports",
        limit_mib=40,
        tree_bytes=2_000_000,
        archive_mib=0,
    )
    return {"root": root, "window": window, "plan": plan, "weights": weights, "mirror": mirror}


def test_each_call_fits_and_datasets_travel_with_their_item(carried):
    plan, out = carried["plan"], carried["root"] / "out"
    limit = 40 * 2**20 - 2_000_000
    assert json.loads((out / "carry.json").read_text()) == plan
    for call in plan:
        assert call["bytes"] <= limit
        folder = out / call["folder"]
        assert call["bytes"] == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    holds = [" ".join(c["holds"]) for c in plan]
    first = next(k for k, h in enumerate(holds) if "mirror/MNIST" in h)
    fashion = next(k for k, h in enumerate(holds) if "mirror/FashionMNIST" in h)
    weights_calls = [k for k, h in enumerate(holds) if WEIGHTS in h]
    assert first == 0 and "import/gen" in holds[0]  # item 1's needs come first
    assert fashion > first and fashion >= weights_calls[-1]  # only when its item comes
    assert len(weights_calls) >= 2  # 87 MB over 40 MiB calls: split
    assert "results-paper-scale" not in " ".join(holds)  # a repo: source travels in the tree


def test_the_machine_joins_the_weights_and_items_wait_for_them(carried, tmp_path):
    config = load_config([carried["window"]["config_path"]])
    cache = tmp_path / "cache"
    items = carried["window"]["work"]
    for k, call in enumerate(carried["plan"]):
        take_setup(carried["root"] / "out" / call["folder"], cache)
        joined = (cache / WEIGHTS).is_file()
        missing = missing_needs(config, items[2], cache / "mirror", tmp_path, cache / WEIGHTS)
        if k < len(carried["plan"]) - 1:
            assert "dataset fmnist" in missing
        if not joined:
            assert any(m.startswith("FID weights") for m in missing)
    assert not missing_needs(config, items[2], cache / "mirror", tmp_path, cache / WEIGHTS)
    assert not list(cache.glob(f"{WEIGHTS}.part*"))  # parts removed once joined
    # the joined file is the stripped weights: verified as the whole file they came from
    assert inception.verify_weights(cache / WEIGHTS) == inception.verify_weights(carried["weights"])
    assert (cache / "import" / "gen" / "generator.pt").read_bytes() == b"g" * 1000
    digest = hashlib.sha256((cache / WEIGHTS).read_bytes()).hexdigest()
    metas = list((carried["root"] / "out").rglob(f"{WEIGHTS}.part*.json"))
    assert {json.loads(m.read_text())["sha256"] for m in metas} == {digest}


def test_a_part_that_does_not_add_up_is_refused(carried, tmp_path):
    cache = tmp_path / "cache"
    for call in carried["plan"]:
        take_setup(carried["root"] / "out" / call["folder"], cache) if call["call"] == 1 else None
    part = next(cache.glob(f"{WEIGHTS}.part000"))
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="joined parts have another SHA-256"):
        for call in carried["plan"][1:]:
            take_setup(carried["root"] / "out" / call["folder"], cache)
    assert not (cache / WEIGHTS).exists()


def test_plan_refuses_what_can_never_fit(carried, tmp_path):
    with pytest.raises(ValueError, match="do not fit one call"):
        plan_carry(
            carried["window"],
            tmp_path / "o",
            mirror=carried["mirror"],
            weights=carried["weights"],
            import_root=carried["root"] / "imports",
            limit_mib=12,
            archive_mib=0,
        )
    assert Path(tmp_path / "o" / "carry.json").exists() is False
    for bad in ({"archive_mib": -16}, {"tree_bytes": -(2**20)}):  # room beyond the limit
        with pytest.raises(ValueError, match="at least 0"):
            plan_carry(
                carried["window"],
                tmp_path / "o",
                mirror=carried["mirror"],
                weights=carried["weights"],
                import_root=carried["root"] / "imports",
                **bad,
            )
    # planned again into the same folder (a larger limit): the weights still travel, and
    # no setup folder of an earlier, longer plan is left beside it
    (tmp_path / "o" / "setup9").mkdir()
    plan = plan_carry(
        carried["window"],
        tmp_path / "o",
        mirror=carried["mirror"],
        weights=carried["weights"],
        import_root=carried["root"] / "imports",
        limit_mib=64,
        archive_mib=0,
    )
    assert WEIGHTS in " ".join(h for call in plan for h in call["holds"])
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(
        [*(c["folder"] for c in plan), "carry.json"]
    )


def realistic_archive(tmp_path: Path, cap_mib: float) -> tuple[list[Path], list[str], Path]:
    """A call-1 working folder as the H100 at 0f6b577 left it (a compiled-kernel cache of
    about 21 MB of generated source, one 10 MB training checkpoint, results), packed as the
    window packs it (``pack_within`` at ``cap_mib``)."""
    rng = random.Random(0)
    work = tmp_path / "work"
    ckpt = work / "results/paper/nonprivate/mnist_nonprivate/private_workspace/checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(rng.randbytes(10_300_000))  # weights and optimiser state: incompressible
    kernels = work / "inductor-cache" / "triton"
    for k in range(50):  # generated kernel source: much repeated text, some unique names
        body = "".join(
            f"    tmp{j} = tl.load(in_ptr{j % 7} + (x0 + {rng.randrange(1 << 30)}), xmask)\n"
            for j in range(4_000)
        )
        (kernels / f"{k:02d}").mkdir(parents=True)
        (kernels / f"{k:02d}" / f"triton_per_fused_{k}.py").write_text(body[:425_000])
    fileio.write_json(work / "results/paper/real_mnist/fid_seed0.json", {"fid": 1.0})
    parts, dropped, _ = pack_within(
        work, tmp_path / "state.tgz", DEFAULT_EXCLUDE, part_mib=15, cap_mib=cap_mib
    )
    return parts, dropped, work


def test_three_call_window_carries_call_one_archive_beside_the_weights(carried, tmp_path):
    """The plan keeps each later call's room for the archive the window packs within the
    cap: call 1's archive, kernel cache and checkpoint in it, travels beside the weights'
    second part within 64 MiB; over a smaller cap the kernels are left out, never a result."""
    tree = 2_680_000  # the tree measured on the H100 at 0f6b577
    plan = plan_carry(
        carried["window"],
        tmp_path / "out",
        mirror=carried["mirror"],
        weights=carried["weights"],
        import_root=carried["root"] / "imports",
        limit_mib=64,
        tree_bytes=tree,
        archive_mib=16,
    )
    assert len(plan) == 3 and WEIGHTS in " ".join(plan[1]["holds"])  # the weights' 2nd part
    parts, dropped, _ = realistic_archive(tmp_path, cap_mib=16)
    archive = sum(p.stat().st_size for p in parts)
    assert dropped == [] and archive <= plan[1]["archive_bytes"] == 16 * 2**20
    back = tmp_path / "back"
    fileio.unpack(tmp_path / "state.tgz", back)
    assert (back / "inductor-cache").is_dir()  # the kernel cache travels
    for call in plan[1:]:  # every later call: tree + setup + the archive within 64 MiB
        assert tree + call["bytes"] + archive <= tree + call["bytes"] + call["archive_bytes"]
        assert call["total_bytes"] <= 64 * 2**20
    # the last allocation's archive given to the plan: call 1 keeps its measured bytes
    given = tmp_path / "state.tgz"
    again = plan_carry(
        carried["window"],
        tmp_path / "out2",
        mirror=carried["mirror"],
        weights=carried["weights"],
        import_root=carried["root"] / "imports",
        limit_mib=64,
        tree_bytes=tree,
        archive_in=given,
    )
    assert again[0]["archive_bytes"] == archive and again[0]["total_bytes"] <= 64 * 2**20
    # a cap the archive exceeds: the kernels are left out, the checkpoint and results kept
    small = tmp_path / "small"
    small.mkdir()
    parts, dropped, _ = realistic_archive(small, cap_mib=archive / 2**20 - 0.5)
    assert dropped == ["compiled kernels"]
    fileio.unpack(small / "state.tgz", small / "back")
    kept = {p.relative_to(small / "back").as_posix() for p in (small / "back").rglob("*.*")}
    assert not any(k.startswith("inductor-cache") for k in kept)
    assert "results/paper/real_mnist/fid_seed0.json" in kept
    assert any(k.endswith("checkpoint.pt") for k in kept)


def test_an_archive_packed_again_is_never_lost_half_way(tmp_path, monkeypatch):
    """Packing the archive again (parts) while the disk fills on its second part leaves the
    last archive whole, not its first part alone: the parts are written in full before any
    old file is replaced. An archive of fewer parts leaves no stale part behind."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.bin").write_bytes(random.Random(0).randbytes(3 * 2**20))  # incompressible
    old = fileio.pack(work, tmp_path / "state.tgz", [], part_mib=1)
    assert len(old) == 4
    (work / "b.bin").write_bytes(random.Random(1).randbytes(2**20))
    real_write, written = fileio._write_synced, []

    def full_on_second(tmp, payload):
        written.append(tmp)
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        real_write(tmp, payload)

    monkeypatch.setattr(fileio, "_write_synced", full_on_second)
    with pytest.raises(fileio.NoSpaceError):
        fileio.pack(work, tmp_path / "state.tgz", [], part_mib=1)
    monkeypatch.setattr(fileio, "_write_synced", real_write)
    fileio.unpack(tmp_path / "state.tgz", tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["a.bin"]  # the last one
    assert sorted(p for p in tmp_path.iterdir() if p.is_file()) == old  # no temporary left
    (work / "a.bin").unlink()
    assert fileio.pack(work, tmp_path / "state.tgz", [], part_mib=1) == old[:2]
    assert sorted(tmp_path.glob("state.tgz*")) == old[:2]
    with pytest.raises(ValueError, match="part"):
        fileio.pack(work, tmp_path / "state.tgz", [], part_mib=0)
