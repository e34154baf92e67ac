"""tf.data input pipelines for model.fit on any Keras backend: sources, the official
preprocessing, augmentation and batching. Images travel as uint8 until the last map, which
normalises them by the input convention ([-1, 1] unless one is given) and emits one-hot float
labels (what Mixup, CutMix and label smoothing need)."""

from __future__ import annotations

import contextlib
import difflib
import gzip
import logging
import os
import pathlib
import re
import warnings

import keras
import numpy as np
import tensorflow as tf

from vit_keras.preprocessing import UNIT_RANGE, InputConvention

__all__ = ["FASHION_MNIST_CLASSES", "from_arrays", "from_folder", "from_tfds",
           "inception_crop", "load_fashion_mnist", "load_image_files", "load_source",
           "make_pipeline", "pad_crop", "read_idx", "sample_images", "split_last"]

AUTOTUNE = tf.data.AUTOTUNE
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif")

# ------------------------------------------------------------------------- sources


def from_arrays(images: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
    """A dataset of (image, label) pairs from arrays in memory, the source make_pipeline
    takes.

    Args:
        images: uint8 images (N, height, width) or (N, height, width, channels).
        labels: integer class indices (N,).

    Returns:
        The tf.data.Dataset of (uint8 image (height, width, channels), int64 label).

    Raises:
        ValueError: images of another rank, or a count of labels other than of images.
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or len(images) != len(labels):
        raise ValueError(f"expected images (N, H, W[, C]) and N labels, got images "
                         f"{images.shape} and {len(labels)} labels")
    return tf.data.Dataset.from_tensor_slices((images, np.asarray(labels, "int64")))


class _NoMissingVariantFiles(logging.Filter):
    """Drops tfds' absl warning "Variant folder ... has no dataset_info.json" (or
    features.json): tfds logs it for every version folder of a dataset it looks for and does
    not find prepared, on every load, although nothing is wrong."""

    MESSAGE = re.compile(r"Variant folder .* has no \S+\.json$")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.MESSAGE.match(record.getMessage())


@contextlib.contextmanager
def _quiet_tfds():
    """tfds calls without the warning _NoMissingVariantFiles drops; every other log record
    passes."""
    logger, quiet = logging.getLogger("absl"), _NoMissingVariantFiles()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _check_tfds_name(name: str) -> None:
    """A name tfds does not know gets one line, with the closest known name, instead of tfds'
    own error (a format description or the list of every dataset)."""
    import tensorflow_datasets as tfds

    base = name.split(":")[0].split("/")[0]
    known = tfds.list_builders(with_community_datasets=False)
    if base not in known:
        close = difflib.get_close_matches(base.replace("-", "_"), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"dataset {name!r}: not a TensorFlow Datasets name{hint}")


def from_tfds(name: str, split: str, data_dir: str | None = None,
              shuffle_files: bool = False) -> tuple[tf.data.Dataset, list[str]]:
    """A TensorFlow Datasets dataset as (image, label) pairs, and its class names; a name
    tfds does not know is refused in one line with the closest known name.

    Args:
        name: the tfds name, with a version or config if wanted ("cifar10", "mnist:3.0.1").
        split: the tfds split ("train", "test", "train[:90%]").
        data_dir: where tfds keeps its data; None for its default.
        shuffle_files: shuffle the dataset's files (tfds' own option).

    Returns:
        (dataset, class names); the names are empty where the dataset has none.

    Raises:
        ValueError: a name that is not a tfds dataset.
    """
    import tensorflow_datasets as tfds

    _check_tfds_name(name)
    with _quiet_tfds():
        dataset, info = tfds.load(name, split=split, data_dir=data_dir, as_supervised=True,
                                  with_info=True, shuffle_files=shuffle_files)
    label = info.features["label"] if "label" in info.features else None
    names = list(label.names) if label is not None and hasattr(label, "names") else []
    return dataset, names


def load_source(dataset: str = "fashion_mnist", split: str = "train", folder: str | None = None,
                data_dir: str | None = None,
                on_error: str = "skip") -> tuple[tf.data.Dataset, list[str]]:
    """(image, label) pairs and class names from one of the three sources the apps offer: a
    folder of class sub-folders (when `folder` is given), Fashion-MNIST from its offline IDX
    files ("fashion_mnist"), or any tfds dataset by name.

    Args:
        dataset: "fashion_mnist" or a tfds name; unused with folder.
        split: the split to read ("train" or "test" for Fashion-MNIST).
        folder: a folder of class sub-folders of images (from_folder).
        data_dir: where tfds keeps its data, or a folder of Fashion-MNIST's IDX files.
        on_error: for a folder: "skip" leaves a file that does not decode out with a
            warning, "raise" stops at it.

    Returns:
        (dataset, class names).
    """
    if folder:
        return from_folder(folder, on_error=on_error)
    if dataset == "fashion_mnist":
        return from_arrays(*load_fashion_mnist(split, data_dir)), list(FASHION_MNIST_CLASSES)
    return from_tfds(dataset, split, data_dir)


def split_last(dataset: tf.data.Dataset,
               count: int) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(all but the last `count` examples, the last `count`): a validation split held out of
    the training data, the same examples on every run, so that choices made on it leave the
    test split unread.

    Args:
        dataset: a dataset of examples.
        count: the examples to hold out.

    Returns:
        (train, validation) datasets.

    Raises:
        ValueError: a count that leaves nothing to train on, or is not positive.
    """
    total = int(dataset.cardinality())
    if total < 0:  # unknown (a filtered folder): count it
        total = sum(1 for _ in dataset)
    if not 0 < count < total:
        raise ValueError(f"a validation split of {count} images must leave some to train on: "
                         f"expected 1 to {total - 1}, got {count}")
    return dataset.take(total - count), dataset.skip(total - count)


def _check_image(path: pathlib.Path) -> str | None:
    """None when the file decodes completely, else why not."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
    except Exception as err:  # PIL raises many types for bad files
        return f"{type(err).__name__}: {err}"
    return None


def from_folder(directory: str, on_error: str = "skip",
                check: bool = True) -> tuple[tf.data.Dataset, list[str]]:
    """Images in one sub-folder per class, the class names sorted giving the labels.

    Every file is decoded once up front (check=True) so that a corrupt one is found before
    training rather than in the middle of it.

    Args:
        directory: DIR of DIR/<class name>/<image files> (.jpg, .jpeg, .png, .bmp, .gif).
        on_error: "skip" leaves a file that does not decode out, with one warning naming and
            counting them all; "raise" stops at it.
        check: decode every file up front; False leaves a bad file to fail in training.

    Returns:
        (dataset of (uint8 RGB image, int64 label), class names).

    Raises:
        FileNotFoundError: the folder does not exist.
        ValueError: no class sub-folders or no readable images, a bad file with
            on_error="raise", or another on_error.
    """
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    root = pathlib.Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {directory!r} does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"image folder {directory!r} has no class sub-folders "
                         "(expected DIR/<class name>/<image files>)")
    paths, labels, bad = [], [], []
    for index, name in enumerate(classes):
        for path in sorted((root / name).iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            problem = _check_image(path) if check else None
            if problem:
                if on_error == "raise":
                    raise ValueError(f"corrupt image file {str(path)!r}: {problem}")
                bad.append(str(path))
                continue
            paths.append(str(path))
            labels.append(index)
    if bad:
        warnings.warn(f"skipped {len(bad)} unreadable image file(s): {', '.join(bad)}",
                      stacklevel=2)
    if not paths:
        raise ValueError(f"image folder {directory!r} holds no readable images")

    def load(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return image, label

    dataset = tf.data.Dataset.from_tensor_slices((paths, np.array(labels, "int64")))
    return dataset.map(load, num_parallel_calls=AUTOTUNE), classes


def load_image_files(paths, size, channels: int = 3) -> np.ndarray:
    """Image files as one uint8 array, each resized (bilinear) to the same size, for
    predicting on a few files without a pipeline.

    Args:
        paths: the image files.
        size: an int or (height, width).
        channels: 3 for RGB, 1 for grayscale.

    Returns:
        uint8 images (N, height, width, channels).

    Raises:
        FileNotFoundError: a file that does not exist.
        ValueError: a file that does not decode, named.
    """
    from PIL import Image, UnidentifiedImageError

    height, width = (size, size) if isinstance(size, int) else size
    out = []
    for path in paths:
        try:
            with Image.open(path) as image:
                image = image.convert("RGB" if channels == 3 else "L")
                image = image.resize((width, height), Image.BILINEAR)
                out.append(np.asarray(image, np.uint8).reshape(height, width, channels))
        except FileNotFoundError:
            raise
        except (UnidentifiedImageError, OSError, ValueError) as err:
            raise ValueError(f"cannot read image file {str(path)!r}: {err}") from err
    return np.stack(out)


def sample_images(dataset: tf.data.Dataset, size, channels: int, count: int) -> np.ndarray:
    """The first images of an (image, label) dataset, resized, as uint8 NumPy: an export's
    sample and representative images come from here.

    Args:
        dataset: an (image, label) dataset.
        size: an int or (height, width).
        channels: 3 repeats grayscale images to RGB.
        count: how many images.

    Returns:
        uint8 images (count, height, width, channels).
    """
    size = (size, size) if isinstance(size, int) else tuple(size)

    def prepare(image, _):
        if channels == 3 and image.shape[-1] == 1:
            image = tf.repeat(image, 3, axis=-1)
        return _resize(image, size)

    batch = next(iter(dataset.take(count).map(prepare).batch(count)))
    return batch.numpy()


# ------------------------------------------------------------ Fashion-MNIST offline

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]
"""Fashion-MNIST's class names, in label order."""
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
_IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: str) -> np.ndarray:
    """An IDX file, MNIST's format (gzipped or not): big-endian magic 0 0 dtype ndim, uint32
    dims, then the data.

    Args:
        path: the file; a name ending in .gz is read through gzip.

    Returns:
        The uint8 array of the shape the header gives.

    Raises:
        ValueError: not an unsigned-byte IDX file, or data of another size than the header's.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as file:
        data = file.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path!r} is not an unsigned-byte IDX file (bad magic {data[:4]!r})")
    ndim = data[3]
    dims = np.frombuffer(data, ">u4", count=ndim, offset=4).astype(int)
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path!r}: header says {tuple(dims)} but holds {body.size} bytes")
    return body.reshape(dims)


def _find_idx(data_dir: str | None, stem: str) -> str | None:
    for folder in ([data_dir] if data_dir else []) + list(FASHION_MNIST_DIRS):
        for name in (stem + ".gz", stem):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                return path
    return None


def load_fashion_mnist(split: str = "train", data_dir: str | None = None):
    """Fashion-MNIST as arrays, offline: from the tfds copy if prepared, else from the
    original IDX files (in data_dir, then Debian's dataset-fashion-mnist package).

    Args:
        split: "train" (60,000 images) or "test" (10,000).
        data_dir: a tfds data_dir or a folder of the IDX files; None looks in the default
            places.

    Returns:
        (uint8 images (N, 28, 28, 1), int64 labels (N,)); FASHION_MNIST_CLASSES names them.

    Raises:
        ValueError: another split, or IDX files whose counts differ.
        FileNotFoundError: data_dir is not a folder, or no copy was found (the message says
            how to get one).
    """
    if split not in _IDX_FILES:
        raise ValueError(f"Fashion-MNIST split must be 'train' or 'test', got {split!r}")
    if data_dir and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir {data_dir!r}: no such folder")
    try:
        import tensorflow_datasets as tfds

        with _quiet_tfds():
            builder = tfds.builder("fashion_mnist", data_dir=data_dir)
            if builder.is_prepared():
                images, labels = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1,
                                                                  as_supervised=True))
                return images, labels
    except Exception:  # noqa: S110  (tfds missing or unreadable: fall back to IDX files)
        pass
    paths = [_find_idx(data_dir, stem) for stem in _IDX_FILES[split]]
    if None in paths:
        raise FileNotFoundError(
            "Fashion-MNIST not found: no prepared tfds 'fashion_mnist' and no IDX files "
            f"({', '.join(_IDX_FILES[split])}[.gz]) in "
            f"{', '.join(([data_dir] if data_dir else []) + list(FASHION_MNIST_DIRS))}. "
            "Install Debian's package (sudo apt-get install dataset-fashion-mnist), or download "
            "the four files from github.com/zalandoresearch/fashion-mnist into a folder and "
            "pass it as --data-dir.")
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if len(images) != len(labels):
        raise ValueError(f"{paths[0]} has {len(images)} images but {paths[1]} "
                         f"{len(labels)} labels")
    return images[..., None], labels.astype("int64")


# ---------------------------------------------------------------- preprocessing


def inception_crop(image, seed, area_range=(0.05, 1.0)):
    """vit_jax's training crop: a random box covering a share of the image's area, drawn by
    the stateless op, so that a seed gives the same crop in any order of calls.

    Args:
        image: a (height, width, channels) image.
        seed: two integers.
        area_range: the least and most share of the area the box covers.

    Returns:
        The cropped image (not resized).
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed, area_range=area_range,
        min_object_covered=0, use_image_if_no_bounding_boxes=True)
    return tf.slice(image, begin, size)


def pad_crop(image, padding: int, seed):
    """Random translation by up to `padding` pixels (small-image augmentation): the image
    padded by reflection, then cropped back to its size by the stateless op.

    Args:
        image: a (height, width, channels) image.
        padding: the most pixels it moves on each axis.
        seed: two integers.

    Returns:
        The translated image, of the same size.
    """
    shape = tf.shape(image)
    padded = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, shape, seed)


def _resize(image, size):
    return tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, size)), 0, 255), tf.uint8)


def _prepare(size, crop):
    """The per-image map: the crop ("inception", "padN" or "none"), then the resize to size
    (uint8 kept). A crop takes its image's own seed (two integers), so that the map's parallel
    calls draw the same crops in any order."""

    def prepare(image, label, crop_seed=None):
        if image.shape.rank == 2:
            image = image[..., None]
        channels = image.shape[-1]  # static where the source's is; a crop loses it
        if crop == "inception":
            image = inception_crop(image, crop_seed)
        elif crop.startswith("pad"):
            image = pad_crop(image, int(crop[3:] or 4), crop_seed)
        return tf.ensure_shape(_resize(image, size), (*size, channels)), label

    return prepare


def _with_crop_seeds(dataset: tf.data.Dataset, seed) -> tf.data.Dataset:
    """(image, label) -> ((image, label), seed): a seed of two integers per element, from a
    random sequence seeded by seed and drawn anew on every pass, in the elements' order."""
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip(dataset, seeds)


def _needs_per_image_map(element: tf.TensorSpec, size, training, crop) -> bool:
    """False where the images are uint8 of the size already and no crop is drawn: then every
    step runs on whole batches."""
    return not (element.dtype == tf.uint8 and element.shape.rank == 3
                and tuple(element.shape[:2]) == tuple(size) and (not training or crop == "none"))


def _finish(size, num_classes, channels, training, flip, layers, seed=None,
            convention: InputConvention = UNIT_RANGE):
    """The per-batch map: the random horizontal flip (each image its own draw), channels,
    one-hot labels, the augmentation layers on uint8-range floats, then the input
    convention. The flip comes before grayscale images are repeated to three channels: a
    third of the work."""
    normalize = convention.layer()

    def finish(images, labels):
        if training and flip:
            mirrored = tf.random.uniform(tf.shape(images)[:1], seed=seed) < 0.5
            images = tf.where(mirrored[:, None, None, None], tf.reverse(images, [2]), images)
        if channels == 3 and images.shape[-1] == 1:
            images = tf.repeat(images, 3, axis=-1)
        images = tf.ensure_shape(images, (None, *size, channels))  # static for the layers
        labels = tf.one_hot(labels, num_classes)
        images = tf.cast(images, tf.float32)
        for layer in layers:
            out = layer({"images": images, "labels": labels}, training=True)
            images, labels = out["images"], out.get("labels", labels)
        return normalize(images), labels

    return finish


def _without_autotune() -> tf.data.Options:
    """Options without tf.data's autotuning thread, which sleeps out its optimization period
    (up to a minute) before the iterator that owns it can be deleted: model.fit and evaluate
    waited for it at their end. AUTOTUNE parallelism and buffers keep their starting values."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def make_pipeline(
    dataset: tf.data.Dataset,
    *,
    image_size,
    num_classes: int,
    batch_size: int,
    training: bool,
    crop: str = "inception",
    flip: bool = True,
    channels: int = 3,
    augment=(),
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    shuffle_buffer: int = 10_000,
    cache: bool = False,
    drop_remainder: bool | None = None,
    seed: int | None = None,
    convention: InputConvention = UNIT_RANGE,
) -> tf.data.Dataset:
    """(uint8 image, int label) pairs -> batches of (float images normalised by `convention`,
    [-1, 1] by default, and one-hot labels), what model.fit takes on any backend.

    In training: shuffle, crop, random horizontal flip, then the given Keras preprocessing
    layers (RandAugment and the like, on uint8-range values) and Mixup / CutMix
    (training.pipeline_options gives a recipe's). In evaluation: a plain resize, as vit_jax
    evaluates. Images travel as uint8 until the last map, and the pipeline runs without
    tf.data's autotuning thread, which made model.fit wait at its end.

    Args:
        dataset: (uint8 image, int label) pairs (from_arrays, from_folder, from_tfds).
        image_size: the model's input size, an int or (height, width).
        num_classes: the width of the one-hot labels.
        batch_size: the images per batch.
        training: shuffle, crop, flip and augment; False resizes only.
        crop: the training crop: "inception" (vit_jax's random box), "padN" (a random
            translation by up to N pixels, "pad4" for instance) or "none".
        flip: random horizontal flips in training.
        channels: grayscale images are repeated to this many channels.
        augment: Keras preprocessing layers applied in training, on uint8-range floats.
        mixup_alpha: Mixup's alpha in training; 0 for none.
        cutmix_alpha: CutMix's alpha in training; 0 for none.
        shuffle_buffer: the shuffle buffer's size, in images.
        cache: keep the images in memory after the first pass, resized where no random crop
            follows (for data that fits in memory).
        drop_remainder: drop a last partial batch; None does so in training (static shapes
            for TPUs).
        seed: the seed of the shuffle, crops, flips and augmentation; None draws one.
        convention: the input convention of the model the batches are for
            (vit_keras.preprocessing.feeding(model): its recorded convention, or the pixels
            as they are for a model with its own preprocessing layer).

    Returns:
        A tf.data.Dataset of (float32 images (batch, height, width, channels), one-hot float32
        labels (batch, num_classes)).

    Raises:
        ValueError: an unknown crop.
    """
    if crop not in ("none", "inception") and not crop.startswith("pad"):
        raise ValueError(f"unknown crop {crop!r}: expected 'inception', 'padN' or 'none'")
    size = tuple(image_size) if not isinstance(image_size, int) else (image_size, image_size)
    layers = list(augment) if training else []
    if training and mixup_alpha:
        layers.append(keras.layers.MixUp(alpha=mixup_alpha, seed=seed))
    if training and cutmix_alpha:
        layers.append(keras.layers.CutMix(factor=cutmix_alpha, seed=seed))
    per_image = _needs_per_image_map(dataset.element_spec[0], size, training, crop)
    random_crop = training and crop != "none"
    if per_image and not random_crop:  # the same every pass: before the cache, which keeps it
        dataset = dataset.map(_prepare(size, "none"), num_parallel_calls=AUTOTUNE)
    if cache:
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if per_image and random_crop:
        prepare = _prepare(size, crop)
        dataset = _with_crop_seeds(dataset, seed).map(
            lambda pair, crop_seed: prepare(*pair, crop_seed), num_parallel_calls=AUTOTUNE)
    dataset = dataset.batch(batch_size, num_parallel_calls=AUTOTUNE,
                            drop_remainder=training if drop_remainder is None else drop_remainder)
    finish = _finish(size, num_classes, channels, training, flip, layers, seed, convention)
    # In batch order, without parallel calls: the flips and augmentation layers draw from one
    # seeded generator, which parallel calls would take turns at in no fixed order.
    batches = dataset.map(finish).prefetch(AUTOTUNE)
    return batches.with_options(_without_autotune())
