import gzip
import logging
import struct
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

import vit_keras as vk
from tests.conftest import TINY, backend_independent
from vit_keras import data


def fit_one_epoch(batches, image_size=32, num_classes=10):
    model = vk.vit(TINY, image_size=image_size, num_classes=num_classes)
    model.compile("adam", keras.losses.CategoricalCrossentropy(from_logits=True))
    history = model.fit(batches, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])


def test_tfds_mock_data_feeds_fit():
    with tfds.testing.mock_data(num_examples=16):
        dataset, names = data.from_tfds("fashion_mnist", "train")
        batches = data.make_pipeline(dataset, image_size=32, num_classes=10, batch_size=8,
                                     training=True)
        images, labels = next(iter(batches))
        fit_one_epoch(batches.take(2))
    assert names[0] == "T-shirt/top"
    assert tuple(images.shape) == (8, 32, 32, 3) and tuple(labels.shape) == (8, 10)


@backend_independent
def test_a_mistyped_tfds_name_gets_one_line_with_the_closest_name():
    with pytest.raises(ValueError, match=r"^dataset 'fashion-mnist': not a TensorFlow Datasets "
                                         r"name \(did you mean 'fashion_mnist'\?\)$"):
        data.load_source("fashion-mnist")
    with pytest.raises(ValueError, match=r"^dataset 'fashionmnist/3\.0\.1': .*'fashion_mnist'"):
        data.from_tfds("fashionmnist/3.0.1", "train")
    with tfds.testing.mock_data(num_examples=4):  # a config or version after the name is fine
        _, names = data.from_tfds("fashion_mnist:3.*.*", "train")
    assert len(names) == 10


@backend_independent
def test_numpy_source_and_preprocessing_range_and_shape():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 20, 24, 1), dtype=np.uint8)
    images[0] = 0
    images[1] = 255
    labels = rng.integers(0, 3, 12)
    evaluation = data.make_pipeline(data.from_arrays(images, labels), image_size=(20, 24),
                                    num_classes=3, batch_size=12, training=False)
    x, y = next(iter(evaluation))
    assert tuple(x.shape) == (12, 20, 24, 3) and x.dtype == tf.float32
    np.testing.assert_allclose(x[0], -1.0)
    np.testing.assert_allclose(x[1], 1.0)
    # evaluation is a plain resize + scaling: same size means the pixels themselves
    np.testing.assert_allclose(x.numpy()[..., 0], (images[..., 0] - 127.5) / 127.5, atol=1e-6)
    np.testing.assert_array_equal(y.numpy(), np.eye(3)[labels])
    train = data.make_pipeline(data.from_arrays(images, labels), image_size=32, num_classes=3,
                               batch_size=4, training=True)
    for x, _ in train:
        assert tuple(x.shape) == (4, 32, 32, 3)
        assert -1.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1.0
    fit_one_epoch(train, num_classes=3)


@backend_independent
@pytest.mark.parametrize("crop, resizes", [("none", 8), ("inception", 16)])
def test_a_cached_pipeline_resizes_once_and_draws_crops_anew(monkeypatch, crop, resizes):
    # Without a random crop the resized images are what the cache keeps: two passes over 8
    # images resize 8 times and give the same images. A random crop is drawn after the cache,
    # on every pass, and resized there: 16 resizes and other images.
    calls = []
    resize = data._resize

    def counted(image, size):
        called = tf.py_function(lambda: calls.append(1) or 0, [], tf.int32)
        return resize(image, size) + tf.cast(0 * called, tf.uint8)

    monkeypatch.setattr(data, "_resize", counted)
    rng = np.random.default_rng(1)
    source = data.from_arrays(rng.integers(0, 256, (8, 20, 20, 1), dtype=np.uint8), np.arange(8))
    batches = data.make_pipeline(source, image_size=24, num_classes=8, batch_size=8,
                                 training=True, crop=crop, flip=False, cache=True, seed=3)
    first, second = (np.sort(next(iter(batches))[0].numpy().reshape(8, -1), axis=0)
                     for _ in range(2))
    assert len(calls) == resizes
    assert np.array_equal(first, second) == (crop == "none")


@backend_independent
@pytest.mark.parametrize("training", [True, False])
def test_pipelines_run_without_the_autotune_thread(training):
    # tf.data's autotuning thread holds up the deletion of the iterator that owns it for what
    # is left of its optimization period, up to a minute once a run has gone on for a while
    # (seen at the end of model.fit): the pipelines leave it out, and still give batches
    rng = np.random.default_rng(0)
    source = data.from_arrays(rng.integers(0, 256, (8, 6, 6, 1), dtype=np.uint8), np.arange(8))
    batches = data.make_pipeline(source, image_size=6, num_classes=8, batch_size=4,
                                 training=training, crop="none")
    assert batches.options().autotune.enabled is False
    assert next(iter(batches))[0].shape == (4, 6, 6, 3)


@backend_independent
@pytest.mark.parametrize("channels", [1, 3])
def test_flip_mirrors_each_image_on_its_own_draw(channels):
    """Batch-level flipping: every image comes out as itself or its left-right mirror, under
    its own label, and one batch holds both; grayscale images asked for in three channels
    come out with the same image in each."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (64, 6, 6, 1), dtype=np.uint8)
    batches = data.make_pipeline(data.from_arrays(images, np.arange(64)), image_size=6,
                                 num_classes=64, batch_size=64, training=True, crop="none",
                                 channels=channels, seed=0)
    x, y = next(iter(batches))
    pixels = np.round((x.numpy() + 1.0) * 127.5).astype(np.uint8)
    sources = np.repeat(images[y.numpy().argmax(axis=1)], channels, axis=-1)
    plain = np.all(pixels == sources, axis=(1, 2, 3))
    mirrored = np.all(pixels == sources[:, :, ::-1], axis=(1, 2, 3))
    assert np.all(plain | mirrored)
    assert 10 < mirrored.sum() < 54, mirrored.sum()


@backend_independent
@pytest.mark.parametrize("crop", ["none", "pad2", "inception"])
def test_a_seeded_pipeline_crops_and_flips_the_same_images_every_time(crop):
    """Two pipelines of one seed give the same batches, epoch after epoch: the flips are drawn
    in batch order, each image's crop from a seed of its own (parallel calls at one seeded
    generator would take turns at it in no fixed order)."""
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (32, 8, 8, 1), dtype=np.uint8)

    def epochs():
        batches = data.make_pipeline(data.from_arrays(images, np.arange(32)), image_size=8,
                                     num_classes=32, batch_size=2, training=True, crop=crop,
                                     channels=1, seed=0)
        return np.stack([x.numpy() for x, _ in batches.repeat(40)])

    first, second = epochs(), epochs()
    assert first.shape == (640, 2, 8, 8, 1)
    np.testing.assert_array_equal(first, second)


@backend_independent
def test_pad_crop_translates_by_at_most_its_padding():
    """Each crop is an 8x8 window of the image reflect-padded by 2 (NumPy's "reflect" is
    TensorFlow's REFLECT), at an offset drawn from its seed; the pipeline's crop="pad2" applies
    it to each training image."""
    image = np.random.default_rng(5).integers(0, 256, (8, 8, 1), dtype=np.uint8)
    padded = np.pad(image, [(2, 2), (2, 2), (0, 0)], mode="reflect")
    offsets = set()
    for seed in range(30):
        crop = data.pad_crop(tf.constant(image), 2, tf.constant([seed, 1])).numpy()
        found = [(dy, dx) for dy in range(5) for dx in range(5)
                 if np.array_equal(crop, padded[dy:dy + 8, dx:dx + 8])]
        assert found, f"seed {seed}: not a window of the padded image"
        offsets.update(found)
    assert len(offsets) > 10, offsets  # the offsets vary, not only the centred (2, 2)

    images = np.random.default_rng(6).integers(0, 256, (16, 8, 8, 1), dtype=np.uint8)

    def pixels(crop):
        batches = data.make_pipeline(data.from_arrays(images, np.arange(16)), image_size=8,
                                     num_classes=16, batch_size=16, training=True, crop=crop,
                                     flip=False, channels=1, seed=0)
        x, y = next(iter(batches))
        return x.numpy()[np.argsort(y.numpy().argmax(-1))]  # by label, undoing the shuffle

    moved = np.abs(pixels("pad2") - pixels("none")).max(axis=(1, 2, 3)) > 0
    assert moved.sum() >= 8, moved


CLASS_VALUES = np.array([0, 80, 160, 240])  # one flat grey level per class


def class_batch(**options):
    """One training batch of 16 flat images, each of its class's grey level, uncropped and
    unflipped, through make_pipeline with the given mixing or augmentation."""
    labels = np.arange(16) % 4
    images = np.broadcast_to(CLASS_VALUES[labels][:, None, None, None], (16, 32, 32, 3))
    batches = data.make_pipeline(data.from_arrays(images.astype(np.uint8), labels),
                                 image_size=32, num_classes=4, batch_size=16, training=True,
                                 crop="none", flip=False, seed=0, **options)
    x, y = next(iter(batches))
    return (x.numpy() + 1.0) * 127.5, y.numpy()  # back to pixel values


# Keras' CutMix weighs the labels by its box's real-valued area, and pastes the pixels whose
# integer coordinates fall in the box: they differ by up to a row and a column of pixels.
CUTMIX_PIXEL_SLACK = (32 + 32 + 1) / (32 * 32) * (CLASS_VALUES.max() - CLASS_VALUES.min())


@backend_independent
@pytest.mark.parametrize("mix, atol", [({"mixup_alpha": 0.8}, 0.5),
                                       ({"cutmix_alpha": 1.0}, CUTMIX_PIXEL_SLACK)])
def test_mixing_weighs_images_and_labels_alike(mix, atol):
    """Each mixed image's mean grey level is its label's mix of the class levels: the images
    and the labels were mixed with one and the same proportion."""
    pixels, labels = class_batch(**mix)
    np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-5)
    assert not np.all(np.isin(labels, [0.0, 1.0]))  # something was mixed
    np.testing.assert_allclose(pixels.mean(axis=(1, 2, 3)), labels @ CLASS_VALUES, atol=atol)
    if "cutmix_alpha" in mix:  # pasted, not blended: only the two classes' own levels
        for image, label in zip(pixels, labels, strict=True):
            levels = CLASS_VALUES[label > 0]
            assert np.all(np.abs(image.reshape(-1, 1) - levels).min(axis=1) < 0.5)


@backend_independent
def test_randaugment_applies_once_to_the_batchs_pixel_values_and_keeps_the_labels():
    """The augmentation layers take each training batch once, as floats of the uint8 range,
    and the [-1, 1] mapping follows: the pipeline's batch is RandAugment (a fresh layer of the
    same seed, so the same draw) applied here to the plain batch's pixel values, then mapped
    to [-1, 1]; the labels pass unchanged. Textured images: on flat ones most of its
    operations (shear, rotation, contrast, sharpness) change nothing."""
    rng = np.random.default_rng(5)
    images, labels = rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8), np.arange(16) % 4

    def first_batch(augment=()):
        batches = data.make_pipeline(data.from_arrays(images, labels), image_size=32,
                                     num_classes=4, batch_size=16, training=True, crop="none",
                                     flip=False, seed=0, augment=augment)
        return [tensor.numpy() for tensor in next(iter(batches))]

    plain, plain_labels = first_batch()
    pixels = np.round((plain + 1.0) * 127.5)  # the shuffled batch's uint8 values
    augmented, augmented_labels = first_batch(
        (keras.layers.RandAugment(value_range=(0, 255), seed=0),))
    reference = keras.layers.RandAugment(value_range=(0, 255), seed=0)
    want = next(iter(tf.data.Dataset.from_tensors(pixels.astype("float32")).map(
        lambda batch: reference(batch, training=True)))).numpy()
    assert np.abs(want - pixels).max(axis=(1, 2, 3)).min() > 100  # every image changed
    np.testing.assert_array_equal(augmented_labels, plain_labels)
    np.testing.assert_allclose(augmented, want / 127.5 - 1.0, atol=1e-5)


def write_folder(root, corrupt=False):
    rng = np.random.default_rng(2)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    if corrupt:
        (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "dog" / "notes.txt").write_text("ignored: not an image suffix")


def test_image_folder_feeds_fit(tmp_path):
    write_folder(tmp_path)
    dataset, names = data.from_folder(str(tmp_path))
    assert names == ["cat", "dog"]
    written = {np.asarray(Image.open(path)).tobytes(): names.index(path.parent.name)
               for path in tmp_path.glob("*/*.png")}
    pairs = [(image.numpy().tobytes(), int(label)) for image, label in dataset]
    assert sorted(label for _, label in pairs) == [0] * 5 + [1] * 5
    assert all(written[pixels] == label for pixels, label in pairs)  # each image its class's
    fit_one_epoch(data.make_pipeline(dataset, image_size=32, num_classes=2, batch_size=4,
                                     training=True), num_classes=2)


@backend_independent
def test_corrupt_image_is_skipped_and_named_or_raises(tmp_path):
    write_folder(tmp_path, corrupt=True)
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable image file\(s\): .*broken.jpg"):
        dataset, _ = data.from_folder(str(tmp_path))
    assert sum(1 for _ in dataset) == 10
    with pytest.raises(ValueError, match=r"corrupt image file '.*broken\.jpg'"):
        data.from_folder(str(tmp_path), on_error="raise")


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as file:
        file.write(header + array.astype(np.uint8).tobytes())


@backend_independent
def test_fashion_mnist_from_idx_files_and_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "FASHION_MNIST_DIRS", ())
    images = np.random.default_rng(3).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, y = data.load_fashion_mnist("test", data_dir=str(tmp_path))
    np.testing.assert_array_equal(x[..., 0], images)
    np.testing.assert_array_equal(y, np.arange(5))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        data.load_fashion_mnist("train", data_dir=str(tmp_path))
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="is not an unsigned-byte IDX file"):
        data.read_idx(str(tmp_path / "bad"))


@backend_independent
def test_a_data_dir_that_does_not_exist_is_refused_not_passed_over():
    """A mistyped --data-dir must not fall back to Debian's copy in silence."""
    with pytest.raises(FileNotFoundError, match=r"data_dir '/no/such/folder': no such folder"):
        data.load_fashion_mnist("test", data_dir="/no/such/folder")


@backend_independent
def test_fashion_mnist_loads_without_tfds_variant_folder_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(data, "FASHION_MNIST_DIRS", ())
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((2, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(2))
    unwanted = "fashion_mnist/3.0.1 has no dataset_info.json"
    with caplog.at_level(logging.WARNING):
        tfds.builder("fashion_mnist", data_dir=str(tmp_path)).is_prepared()  # tfds alone warns
        assert any(r.getMessage().endswith(unwanted) for r in caplog.records)
        caplog.clear()
        data.load_fashion_mnist("test", data_dir=str(tmp_path))
        assert not caplog.records
        # Only inside our tfds calls, and only that message.
        logging.getLogger("absl").warning("Variant folder %s has no %s", "v", "features.json")
        assert [r.getMessage() for r in caplog.records] == [
            "Variant folder v has no features.json"]


def test_a_keras_cv_only_augmentation_runs_in_the_pipeline():
    """keras-cv's GridMask (no core Keras counterpart) as augment=: it masks a quarter of a
    plain image with zeros (-1 after scaling), on every backend."""
    keras_cv = pytest.importorskip("keras_cv", reason="the cv extra (keras-cv) is not installed")
    images = np.full((8, 32, 32, 3), 200, np.uint8)
    mask = keras_cv.layers.GridMask(ratio_factor=(0.5, 0.5), rotation_factor=0.0,
                                    fill_mode="constant", fill_value=0, seed=1)
    batches = data.make_pipeline(data.from_arrays(images, np.arange(8) % 2), image_size=32,
                                 num_classes=2, batch_size=8, training=True, crop="none",
                                 flip=False, augment=(mask,))
    x, _ = next(iter(batches))
    x = np.asarray(x)
    assert x.shape == (8, 32, 32, 3)
    np.testing.assert_allclose((x == -1.0).mean(), 0.25, atol=0.05)
    np.testing.assert_allclose(x[x != -1.0], 200 / 127.5 - 1, atol=1e-6)
