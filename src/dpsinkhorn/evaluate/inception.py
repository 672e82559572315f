"""pytorch-fid's Inception network for FID: its weights file, their SHA-256, the pool3 features.

The weights file (a path, or pytorch-fid's torch hub download) is read only if its SHA-256
is known (:data:`KNOWN_WEIGHTS_SHA256`). Features: pytorch-fid's preparation, batch norm
folded, channels-last (:func:`activations`)."""

from __future__ import annotations

import os
import weakref
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dpsinkhorn import fileio
from dpsinkhorn.devices import resolve_device
from dpsinkhorn.evaluate.sample import channels_last
from dpsinkhorn.models import cudnn_tf32

if TYPE_CHECKING:
    from pytorch_fid import inception as pfi
# pytorch-fid (torchvision, 2-3 s to import) is imported where a network is built; its two
# constants, checked against pytorch-fid's own by tests/test_fid.py:
POOL3_BLOCK = 3  # pytorch_fid.inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]
WEIGHTS_FILE_NAME = "pt_inception-2015-12-05-6726825d.pth"  # the name in its FID_WEIGHTS_URL
HOW_TO_PASS = (
    f"pass pytorch-fid's {WEIGHTS_FILE_NAME} with --weights PATH (config key 'fid_weights', "
    "make variable FID_WEIGHTS=PATH)"
)

#: SHA-256 of the weights files FID accepts (a file is read only if its hash is listed here).
KNOWN_WEIGHTS_SHA256: dict[str, str] = {
    # pytorch-fid's release file (FID_WEIGHTS_URL); the name's 6726825d is its hash prefix
    "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2": (
        "pytorch-fid's published pt_inception-2015-12-05-6726825d.pth"
    ),
    # ../shared/weights/SHA256SUMS: the offline copy of this project's machines, rebuilt in
    # pytorch-fid's format from the same 2015-12-05 network (pool3 features equal to 1e-7
    # relative; its 1008-class fc layer is zeroed, which FID never uses)
    "d9b36da80a6304d8ab322478ec0416c4a40882483c18593cf29fbe0cc25e83cd": (
        "offline rebuild of pt_inception-2015-12-05-6726825d.pth (../shared/weights/SHA256SUMS)"
    ),
}

_MODELS: dict[tuple[str | None, str], pfi.InceptionV3] = {}
_SHA256: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime_ns) -> hex digest


def hub_cache_file() -> Path:
    """Where pytorch-fid's own download keeps the weights (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_FILE_NAME


def sha256_of(path: str | os.PathLike) -> str:
    """``fileio.sha256_of`` of the 95 MB weights file, cached per (path, size, mtime)."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA256:
        _SHA256[key] = fileio.sha256_of(path)
    return _SHA256[key]


def verify_weights(path: str | os.PathLike) -> str:
    """SHA-256 of ``path`` when it is a known weights file (:data:`KNOWN_WEIGHTS_SHA256`);
    ``ValueError`` otherwise: a modified file would silently give another FID."""
    digest = sha256_of(path)
    if digest not in KNOWN_WEIGHTS_SHA256:
        raise ValueError(
            f"{path}: FID Inception weights have SHA-256 {digest}, not that of pytorch-fid's "
            f"{WEIGHTS_FILE_NAME} ({', '.join(k[:12] + '...' for k in KNOWN_WEIGHTS_SHA256)}); "
            "the file is modified or another network: replace it"
        )
    return digest


def _local_inception(path: Path) -> pfi.InceptionV3:
    """pytorch-fid's ``InceptionV3`` (pool3 block only) with weights read from ``path``."""
    if not path.is_file():
        raise FileNotFoundError(
            f"FID Inception weights not found: {path}; this must be pytorch-fid's "
            f"{WEIGHTS_FILE_NAME}: {HOW_TO_PASS}"
        )
    verify_weights(path)  # a known file: it loads into pytorch-fid's network
    return _with_weights(torch.load(path, map_location="cpu", weights_only=True))


def _with_weights(state_dict: dict) -> pfi.InceptionV3:
    """pytorch-fid's own ``InceptionV3([POOL3_BLOCK])``, its constructor's download of the
    weights (``load_state_dict_from_url``) replaced by ``state_dict``."""
    from unittest import mock

    from pytorch_fid import inception as pfi

    with mock.patch.object(pfi, "load_state_dict_from_url", lambda *_, **__: state_dict):
        return pfi.InceptionV3([POOL3_BLOCK])


def _fid_inception_v3() -> torch.nn.Module:
    """pytorch-fid's ``fid_inception_v3`` network without its download (weights random)."""
    from pytorch_fid import inception as pfi

    net = pfi._inception_v3(num_classes=1008, aux_logits=False, weights=None)
    net.Mixed_5b = pfi.FIDInceptionA(192, pool_features=32)
    net.Mixed_5c = pfi.FIDInceptionA(256, pool_features=64)
    net.Mixed_5d = pfi.FIDInceptionA(288, pool_features=64)
    net.Mixed_6b = pfi.FIDInceptionC(768, channels_7x7=128)
    net.Mixed_6c = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6d = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6e = pfi.FIDInceptionC(768, channels_7x7=192)
    net.Mixed_7b = pfi.FIDInceptionE_1(1280)
    net.Mixed_7c = pfi.FIDInceptionE_2(2048)
    return net


def _downloaded_inception() -> pfi.InceptionV3:
    """pytorch-fid's own ``InceptionV3``: weights from the torch hub cache, else downloaded."""
    from pytorch_fid import inception as pfi

    cached = hub_cache_file()
    if cached.exists():
        verify_weights(cached)  # before torch.load reads it
    try:
        model = pfi.InceptionV3([POOL3_BLOCK])
    except OSError as err:  # urllib's URLError is an OSError
        if cached.exists():
            raise
        raise FileNotFoundError(
            f"FID Inception weights are not in the torch hub cache ({cached}) and downloading "
            f"them from {pfi.FID_WEIGHTS_URL} failed ({err}); offline, {HOW_TO_PASS}, or copy "
            f"the file to {cached}"
        ) from err
    verify_weights(cached)  # a fresh download
    return model


def network_sha256(weights: str | os.PathLike | None) -> str:
    """The SHA-256 that names the network FID used (``weights``, else pytorch-fid's torch hub
    cache file)."""
    return verify_weights(hub_cache_file() if weights is None else weights)


def load_inception(
    weights: str | os.PathLike | None = None, device: str | torch.device = "auto"
) -> pfi.InceptionV3:
    """The FID network in eval mode on ``device``, cached per (weights path, device);
    ``weights`` None: pytorch-fid's own download (torch hub cache)."""
    device = resolve_device(device) if isinstance(device, str) else device
    key = (None if weights is None else str(Path(weights).resolve()), str(device))
    if key not in _MODELS:
        model = _downloaded_inception() if weights is None else _local_inception(Path(weights))
        _MODELS[key] = model.to(device).eval()
    return _MODELS[key]


#: Inception images per batch when none is given: on a GPU 1,000 299x299 images (about
#: 9 GiB of activations in fp32), pytorch-fid's 50 on a CPU.
DEFAULT_BATCH = {"cuda": 1000, "cpu": 50}
#: Arithmetic of the Inception convolutions: fp32 (IEEE: cuDNN's TF32 off, on every device),
#: tf32 (float32 tensors, cuDNN convolving in TF32; on a CPU the same as fp32), or bf16 /
#: fp16 (the folded network's weights cast to that type once, the images cast per batch).
#: Features and statistics stay float32 / float64.
FID_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_FOLDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # network -> folded copy
_CAST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # folded -> {dtype: copy}


def leaves_tf32_switch(precision: str) -> bool:
    """Whether features in ``precision`` run with cuDNN's process-wide TF32 switch as it is
    now (:func:`activations` sets it for fp32 and tf32 only), so work beside them keeps
    its arithmetic. False where the switch cannot be read."""
    if precision in HALF_TYPES:
        return True
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9
        now = {"tf32": True, "ieee": False}.get(conv.fp32_precision)
    else:
        now = bool(torch.backends.cudnn.allow_tf32)
    return now == (precision == "tf32")


def folded_network(model: pfi.InceptionV3) -> torch.nn.Module:
    """A cached copy of a loaded FID network, each batch norm folded into its convolution
    (features change by about 1e-6 relative), every weight channels-last (NHWC)."""
    import copy

    from torchvision.models.inception import BasicConv2d

    if model not in _FOLDED:
        folded = copy.deepcopy(model).eval()
        for module in folded.modules():
            if isinstance(module, BasicConv2d):
                module.conv = torch.nn.utils.fusion.fuse_conv_bn_eval(module.conv, module.bn)
                module.bn = torch.nn.Identity()
        _FOLDED[model] = folded.to(memory_format=torch.channels_last)
    return _FOLDED[model]


def cast_network(net: torch.nn.Module, precision: str) -> torch.nn.Module:
    """``net`` (:func:`folded_network`) with its weights in ``precision``'s type: for bf16 /
    fp16 a copy cast once and cached (autocast would cast every weight again per batch);
    else ``net`` itself."""
    import copy

    dtype = HALF_TYPES.get(precision)
    if dtype is None:
        return net
    copies = _CAST.setdefault(net, {})
    if dtype not in copies:
        copies[dtype] = copy.deepcopy(net).to(dtype)
    return copies[dtype]


def pool3_features(
    net: torch.nn.Module, batch: torch.Tensor, precision: str = "fp32"
) -> torch.Tensor:
    """Pool3 features float32 [B,2048] of uint8 images ``batch`` [B,H,W,C] (C in 1, 3) on
    the network's device: scaled to [0,1], resized to 299x299 (bilinear, as pytorch-fid)
    before grayscale is repeated (the same values, a third of the work), mapped to [-1,1],
    channels-last, convolved in ``precision`` (:data:`FID_PRECISIONS`). ``net`` is
    :func:`folded_network` of the FID network, for bf16 / fp16 :func:`cast_network` of it."""
    if precision not in FID_PRECISIONS:
        raise ValueError(f"unknown FID precision {precision!r}; choose from {FID_PRECISIONS}")
    x = batch.permute(0, 3, 1, 2).float() / 255.0  # [B,C,H,W] in [0,1]
    x = torch.nn.functional.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
    x = 2 * x - 1
    x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
    x = x.to(HALF_TYPES.get(precision, torch.float32))
    x = x.contiguous(memory_format=torch.channels_last)
    for block in net.blocks:
        x = block(x)
    return x[:, :, 0, 0].float()


def activations(
    images: np.ndarray | torch.Tensor,
    model: pfi.InceptionV3,
    batch_size: int | None = None,
    precision: str = "fp32",
) -> torch.Tensor:
    """Pool3 features float32 [N,2048] on the network's device (:func:`pool3_features`) of
    uint8 images [N,H,W(,C)], numpy or a tensor (on the device: no copy). ``batch_size``
    None: :data:`DEFAULT_BATCH`. cuDNN's TF32 switch is set for fp32 and tf32 only."""
    images = channels_last(images, "images")
    net = cast_network(folded_network(model), precision)
    device = next(net.parameters()).device
    if batch_size is None:
        batch_size = DEFAULT_BATCH.get(device.type, DEFAULT_BATCH["cpu"])
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out = torch.empty((len(images), 2048), dtype=torch.float32, device=device)
    tf32 = nullcontext() if precision in HALF_TYPES else cudnn_tf32(precision == "tf32")
    with torch.inference_mode(), tf32:
        host = not torch.is_tensor(images)
        resident = torch.from_numpy(np.ascontiguousarray(images)) if host else images
        resident = resident.to(device)
        for start in range(0, len(images), batch_size):
            batch = resident[start : start + batch_size]
            out[start : start + len(batch)] = pool3_features(net, batch, precision)
    return out


def random_inception(
    calibration: np.ndarray, device: str | torch.device = "cpu", seed: int = 0
) -> pfi.InceptionV3:
    """pytorch-fid's pool3 network with random weights (no weights file), in eval mode on
    ``device``: the same architecture and arithmetic, for timing only. Each batch norm's
    statistics are those of the uint8 images ``calibration`` [N,H,W(,C)] (a few), so the
    activations stay of order one through the 90 layers (finite in bf16 and fp16)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _with_weights(_fid_inception_v3().state_dict())
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # one training-mode pass: running stats = batch stats
    x = torch.from_numpy(np.ascontiguousarray(channels_last(calibration, "calibration")))
    x = x.permute(0, 3, 1, 2).float().expand(-1, 3, -1, -1) / 255.0
    with torch.no_grad():
        model.train()(x.contiguous())
    return model.to(device).eval()
