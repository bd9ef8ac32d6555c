"""Image data for the ViT study: scikit-learn's digits (offline) and CIFAR-10.

Every loader returns an `ImageData`: float tensors ``(N, C, H, W)`` normalised per
channel with the *training* split's mean and std, integer labels, and class names.

- ``digits``: the 1,797 8x8 grey-scale digits that ship with scikit-learn, split 80/20
  (stratified, fixed seed), scaled to [0, 1] and upscaled bilinearly to ``image_size``
  (default 16: 4x4 patches of 4 pixels). No network, a few milliseconds.
- ``cifar10``: from a local folder (``data_dir``) in the usual image-folder layout
  ``DIR/train/<class>/*.png`` and ``DIR/test/<class>/*.png`` (any format Pillow reads; class
  names are the sub-folder names, sorted), or else through Hugging Face ``datasets``
  (``load_dataset("cifar10")``; offline this works only from its cache, otherwise a clear
  error says what to do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError, require

DATASETS = ("digits", "cifar10")
DEFAULT_IMAGE_SIZE = {"digits": 16, "cifar10": 32}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"}


@dataclass
class ImageData:
    """A train/test split, normalised with the training split's per-channel statistics."""

    name: str
    train_x: Tensor  # (N_train, C, H, W) float32
    train_y: Tensor  # (N_train,) int64
    test_x: Tensor  # (N_test, C, H, W) float32
    test_y: Tensor  # (N_test,) int64
    classes: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, of the [0, 1]-scaled training images
    std: tuple[float, ...]

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    @property
    def num_channels(self) -> int:
        return int(self.train_x.shape[1])


def _normalise(name: str, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor,
               classes: tuple[str, ...]) -> ImageData:
    mean = train_x.mean(dim=(0, 2, 3))  # (C,)
    std = train_x.std(dim=(0, 2, 3)).clamp_min(1e-6)  # (C,)

    def norm(x: Tensor) -> Tensor:
        return ((x - mean[None, :, None, None]) / std[None, :, None, None]).contiguous()

    return ImageData(name, norm(train_x), train_y.long(), norm(test_x), test_y.long(), classes,
                     tuple(mean.tolist()), tuple(std.tolist()))


def _resize(x: Tensor, size: int) -> Tensor:
    """(N, C, h, w) -> (N, C, size, size), bilinear (identity when the size already fits)."""
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                           align_corners=False)


#: the seed of the permutation every run shares when its subset is not drawn per seed
SHARED_SUBSET_SEED = 1234


def subset_indices(n: int, limit: int | None, seed: int | None = None) -> Tensor | None:
    """The indices of a subset of ``limit`` of ``n`` examples: the first ``limit`` of a seeded
    permutation. ``seed`` None: the one fixed permutation (``SHARED_SUBSET_SEED``) that every
    run shares, so smaller subsets are prefixes of larger ones and runs of different seeds
    hold the same images; a ``seed``: a permutation of its own for each (seed, limit), seeded
    by ``numpy.random.SeedSequence([29, seed, limit])`` (a stream apart from the label
    noise's and the training's), so each seed and size draws its subset independently. None
    when the limit keeps every example."""
    if limit is None or limit >= n:
        return None
    base = SHARED_SUBSET_SEED if seed is None else int(
        np.random.SeedSequence([29, int(seed), int(limit)]).generate_state(1)[0])
    g = torch.Generator().manual_seed(base)
    return torch.randperm(n, generator=g)[:limit]


def _subset(x: Tensor, y: Tensor, limit: int | None, seed: int | None = None
            ) -> tuple[Tensor, Tensor]:
    """`subset_indices` applied to ``x`` and ``y``."""
    idx = subset_indices(len(y), limit, seed)
    return (x, y) if idx is None else (x[idx], y[idx])


def load_digits(image_size: int = 16) -> ImageData:
    """scikit-learn's digits, 80/20 stratified split (seed 0), upscaled to ``image_size``."""
    sk_datasets = require("sklearn.datasets", what="the digits data set", package="scikit-learn",
                          install="'blockcoupling[vit]'")
    from sklearn.model_selection import train_test_split

    bunch = sk_datasets.load_digits()
    images = bunch.images.astype(np.float32) / 16.0  # (N, 8, 8) in [0, 1]
    labels = bunch.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(images, labels, test_size=0.2, random_state=0,
                                              stratify=labels)
    tr = _resize(torch.from_numpy(tr_x)[:, None], image_size)
    te = _resize(torch.from_numpy(te_x)[:, None], image_size)
    return _normalise("digits", tr, torch.from_numpy(tr_y), te, torch.from_numpy(te_y),
                      tuple(str(i) for i in range(10)))


def _read_folder_split(root: Path, split: str, classes: tuple[str, ...] | None
                       ) -> tuple[Tensor, Tensor, tuple[str, ...]]:
    from PIL import Image

    split_dir = root / split
    if not split_dir.is_dir():
        raise BlockCouplingError(
            f"{root} has no '{split}' folder; the layout is DIR/train/<class>/*.png and "
            "DIR/test/<class>/*.png"
        )
    found = tuple(sorted(p.name for p in split_dir.iterdir() if p.is_dir()))
    if classes is None:
        classes = found
    if not classes:
        raise BlockCouplingError(f"{split_dir} has no class sub-folders (DIR/{split}/<class>/)")
    if set(found) - set(classes):
        raise BlockCouplingError(
            f"{split_dir} has classes {sorted(set(found) - set(classes))} that the train "
            "split does not have"
        )
    if set(classes) - set(found):  # evaluating on fewer classes would change every accuracy
        raise BlockCouplingError(
            f"{split_dir} lacks the class folder(s) {sorted(set(classes) - set(found))} of the "
            "train split; add them (with images) so that both splits have the same classes")
    arrays: list[np.ndarray] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        folder = split_dir / cls
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES) \
            if folder.is_dir() else []
        if not files:  # an empty folder would be a label without examples
            raise BlockCouplingError(
                f"class folder {folder} holds no images (png, jpg, ...); add images or remove "
                "the folder from both splits")
        for f in files:
            try:
                with Image.open(f) as im:
                    arrays.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            except OSError as err:  # PIL's UnidentifiedImageError included
                raise BlockCouplingError(f"cannot read the image {f} ({err}); replace or "
                                         "remove it") from err
            labels.append(label)
    if not arrays:
        raise BlockCouplingError(f"no images under {split_dir}/<class>/ (png, jpg, ...)")
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise BlockCouplingError(
            f"images under {split_dir} have different sizes {sorted(shapes)[:3]}; resize them "
            "to one size first"
        )
    x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0  # (N, 3, H, W)
    return x, torch.tensor(labels, dtype=torch.int64), classes


def load_image_folder(root: str | Path, image_size: int | None = None,
                      name: str = "folder") -> ImageData:
    """An image-folder data set: ``root/train/<class>/*`` and ``root/test/<class>/*``."""
    root = Path(root)
    if not root.is_dir():
        raise BlockCouplingError(f"data folder {root} does not exist")
    tr_x, tr_y, classes = _read_folder_split(root, "train", None)
    te_x, te_y, _ = _read_folder_split(root, "test", classes)
    if image_size is not None:
        tr_x, te_x = _resize(tr_x, image_size), _resize(te_x, image_size)
    return _normalise(name, tr_x, tr_y, te_x, te_y, classes)


def load_cifar10_hub(image_size: int | None = None) -> ImageData:
    """CIFAR-10 through Hugging Face ``datasets`` (network or its local cache)."""
    datasets = require("datasets", what="CIFAR-10", install="'blockcoupling[datasets]'",
                       alternative="or give a local folder: --data-dir DIR with "
                                   "DIR/train/<class>/*.png, DIR/test/...")
    try:
        ds = datasets.load_dataset("cifar10")
    except Exception as err:  # noqa: BLE001 - offline/missing cache: many exception types
        raise BlockCouplingError(
            f"CIFAR-10 could not be loaded with datasets.load_dataset('cifar10') "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}). "
            "Where there is network, run it once to fill the cache, or pass --data-dir DIR "
            "with the layout DIR/train/<class>/*.png and DIR/test/<class>/*.png"
        ) from err

    def split(part: str) -> tuple[Tensor, Tensor]:
        rows = ds[part]
        image_col = "img" if "img" in rows.column_names else "image"
        x = np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in rows[image_col]])
        y = np.asarray(rows["label"], dtype=np.int64)
        return torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0, torch.from_numpy(y)

    tr_x, tr_y = split("train")
    te_x, te_y = split("test")
    names = ds["train"].features["label"].names
    if image_size is not None:
        tr_x, te_x = _resize(tr_x, image_size), _resize(te_x, image_size)
    return _normalise("cifar10", tr_x, tr_y, te_x, te_y, tuple(names))


def noisy_labels(labels: Tensor, rate: float, n_classes: int, seed: int) -> Tensor:
    """``labels`` with exactly ``round(rate x n)`` of them, chosen at random, replaced by a
    class drawn uniformly from the *other* classes (so each chosen label is wrong); seeded by
    ``seed`` (a generator of its own: the training's random streams are untouched)."""
    if not 0.0 <= rate < 1.0:
        raise BlockCouplingError(f"label noise {rate!r}: give a fraction in [0, 1)")
    if n_classes < 2:
        raise BlockCouplingError("label noise needs at least 2 classes")
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + 17)
    n = len(labels)
    chosen = torch.randperm(n, generator=g)[: int(round(rate * n))]
    shift = torch.randint(1, n_classes, (len(chosen),), generator=g)  # never 0: another class
    out = labels.clone()
    out[chosen] = (labels[chosen] + shift) % n_classes
    return out


def load_image_data(name: str, *, image_size: int | None = None,
                    data_dir: str | Path | None = None, train_limit: int | None = None,
                    test_limit: int | None = None, subset_seed: int | None = None
                    ) -> ImageData:
    """The data set ``name`` (``digits`` or ``cifar10``), optionally subsampled (seeded:
    the training subset by ``subset_seed``, or the shared permutation when None; the test
    subset always by the shared one, `subset_indices`)."""
    if name not in DATASETS:
        raise BlockCouplingError(f"unknown data set {name!r}; choose {' or '.join(DATASETS)}")
    size = image_size or DEFAULT_IMAGE_SIZE[name]
    if name == "digits":
        if data_dir is not None:
            raise BlockCouplingError("digits ships with scikit-learn; drop --data-dir")
        data = load_digits(size)
    elif data_dir is not None:
        data = load_image_folder(data_dir, size, name="cifar10")
    else:
        data = load_cifar10_hub(size)
    tr_x, tr_y = _subset(data.train_x, data.train_y, train_limit, subset_seed)
    te_x, te_y = _subset(data.test_x, data.test_y, test_limit)
    data.train_x, data.train_y, data.test_x, data.test_y = tr_x, tr_y, te_x, te_y
    return data


__all__ = ["DATASETS", "DEFAULT_IMAGE_SIZE", "SHARED_SUBSET_SEED", "ImageData", "load_digits",
           "load_image_data", "load_image_folder", "noisy_labels", "subset_indices"]
