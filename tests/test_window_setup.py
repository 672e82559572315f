"""What the calls of a GPU window carry in (``dpsinkhorn gpu-window-carry``) and how the GPU
machine takes it: every call within its transfer limit, datasets only with the first item
that needs them, the Inception weights without fc split at call boundaries and joined to
the very bytes that were split, items waiting for what has not arrived."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import REPO, require_shared, shared_path

from dpsinkhorn.config.validate import load_config
from dpsinkhorn.evaluate import inception
from dpsinkhorn.window_setup import (
    WEIGHTS,
    load_window,
    missing_needs,
    plan_carry,
    take_setup,
)

WINDOW = """\
configfile: {config}
work:
  - name: committed
    import: {{mnist_dpsinkhorn: gen}}
    outputs: [fid]
  - {{name: real_mnist, experiments: [real_mnist]}}
  - {{name: fmnist, experiments: [fmnist_dpsinkhorn]}}
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
    plan = plan_carry(window, root / "out", mirror=mirror, weights=weights,
                      import_root=root / "imports", limit_mib=40, tree_bytes=2_000_000)  # fmt: skip
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
        plan_carry(carried["window"], tmp_path / "o", mirror=carried["mirror"],
                   weights=carried["weights"], import_root=carried["root"] / "imports",
                   limit_mib=12)  # fmt: skip
    assert Path(tmp_path / "o" / "carry.json").exists() is False
