"""The input convention of each release (vit_keras.preprocessing), checked against the
constants timm publishes for the same files, and the record a model keeps of it: through
include_preprocessing, vk.preprocess, .keras files, the serving functions, predict and
evaluate; the model cards' table (apps.variants.pretrained_table) from the records."""

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import timm
import torch
from timm.data import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    IMAGENET_INCEPTION_MEAN,
    IMAGENET_INCEPTION_STD,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
)

import vit_keras as vk
from tests.conftest import (
    TINY,
    backend_independent,
    images,
    in_tensorflow_pass,
    randomize,
    write_release_file,
)
from vit_keras import preprocessing
from vit_keras.export.serving import serving_model
from vit_keras.preprocessing import IMAGENET, OPENAI_CLIP, UNIT_RANGE, release_of
from vit_keras.weights import pretrained

# Google's files are not timm's on the Hub, but timm publishes its copies' constants too.
GOOGLE_FILES_IN_TIMM = {"augreg_in21k": "vit_base_patch16_224.augreg_in21k",
                        "augreg_in21k_ft_in1k": "vit_base_patch16_224.augreg_in21k_ft_in1k",
                        "imagenet21k": "vit_base_patch16_224.orig_in21k",
                        "imagenet21k_ft_in1k": "vit_base_patch16_384.orig_in21k_ft_in1k"}


def pixels(batch=2, size=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, size, size, 3), dtype="uint8")


def numpy_normalised(pixels, mean, std):
    """(x / 255 - mean) / std in NumPy, from the constants given (timm's)."""
    return ((pixels / 255.0 - np.array(mean)) / np.array(std)).astype("float32")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def timm_models(name: str) -> set[str]:
    """The timm models (name.tag) of a release's files."""
    entries = pretrained.PRETRAINED[name].checkpoints.values()
    return {entry.timm_model for entry in entries} - {None} or {GOOGLE_FILES_IN_TIMM[name]}


@backend_independent
@pytest.mark.parametrize("name", pretrained.names())
def test_each_releases_convention_is_the_one_timm_publishes_for_its_files(name):
    convention = vk.input_convention(name)
    for model in timm_models(name):
        published = timm.models.get_pretrained_cfg(model)
        np.testing.assert_allclose(convention.mean, published.mean, rtol=1e-12, err_msg=model)
        np.testing.assert_allclose(convention.std, published.std, rtol=1e-12, err_msg=model)


@backend_independent
def test_the_named_conventions_are_timms_constants():
    for convention, mean, std in ((UNIT_RANGE, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD),
                                  (IMAGENET, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
                                  (OPENAI_CLIP, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)):
        assert (convention.mean, convention.std) == (tuple(mean), tuple(std))
    x = pixels()
    for convention in (UNIT_RANGE, IMAGENET, OPENAI_CLIP):
        np.testing.assert_allclose(numpy(vk.preprocess(x, convention)),
                                   numpy_normalised(x, convention.mean, convention.std),
                                   atol=1e-6)
    np.testing.assert_array_equal(numpy(vk.preprocess(x)), numpy(vk.preprocess(x, UNIT_RANGE)))
    np.testing.assert_allclose(numpy(vk.preprocess(x)), x / 127.5 - 1, atol=1e-6)


def test_include_preprocessing_normalises_by_the_deit_convention_through_a_keras_file(
        tmp_path):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, include_preprocessing=True,
                             input_convention="deit_in1k"))
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    plain.set_weights(model.get_weights())
    x = pixels()
    expected = numpy(plain(numpy_normalised(x, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)))
    for raw in (x, x.astype("float32")):
        np.testing.assert_allclose(numpy(model(raw)), expected, atol=1e-5)
    model.save(tmp_path / "deit.keras")
    loaded = keras.saving.load_model(tmp_path / "deit.keras", safe_mode=True)
    assert vk.input_convention(loaded) == IMAGENET and release_of(loaded) is None
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, atol=1e-5)
    # The model normalises itself: vk.preprocess and the serving function leave the pixels.
    np.testing.assert_array_equal(numpy(vk.preprocess(x, loaded)), x.astype("float32"))
    np.testing.assert_allclose(numpy(serving_model(loaded)(x)["logits"]), expected, atol=1e-5)


def test_a_recorded_convention_changes_no_number_no_checkpoint_name_and_no_feature(tmp_path):
    recorded = randomize(vk.vit(TINY, image_size=32, num_classes=3,
                                input_convention=OPENAI_CLIP))
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    plain.set_weights(recorded.get_weights())
    x = images()
    np.testing.assert_array_equal(numpy(recorded(x)), numpy(plain(x)))
    vk.save_npz(recorded, tmp_path / "recorded.npz")
    vk.save_npz(plain, tmp_path / "plain.npz")
    with np.load(tmp_path / "recorded.npz") as got, np.load(tmp_path / "plain.npz") as want:
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    got, want = vk.features(recorded, blocks=2)(x), vk.features(plain, blocks=2)(x)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(numpy(got[key]), numpy(want[key]))
    from vit_keras import analysis, masked

    np.testing.assert_array_equal(analysis.attention_rollout(recorded, x),
                                  analysis.attention_rollout(plain, x))
    assert (masked.masked_patch_model(recorded).output.shape
            == masked.masked_patch_model(plain).output.shape)
    recorded.save(tmp_path / "recorded.keras")
    loaded = keras.saving.load_model(tmp_path / "recorded.keras", safe_mode=True)
    assert vk.input_convention(loaded) == OPENAI_CLIP and release_of(loaded) is None
    np.testing.assert_array_equal(numpy(loaded(x)), numpy(plain(x)))
    np.testing.assert_allclose(numpy(vk.preprocess(pixels(), loaded)),
                               numpy_normalised(pixels(), OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
                               atol=1e-6)


def test_a_model_built_from_a_release_records_it_and_takes_timms_normalised_input(
        tmp_path, monkeypatch):
    # The file is placed in the cache by hand, as a user without network does; the mirror
    # address is one nothing listens on, so that nothing is downloaded.
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VIT_KERAS_WEIGHTS_URL", "http://127.0.0.1:9/")
    entry = pretrained.checkpoint("Ti/16", "deit_in1k")
    written, reference = write_release_file(tmp_path / "files", "deit_in1k", "Ti/16")
    cached = Path(pretrained.cache_path(entry))
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(written, cached)
    model = vk.vit("Ti/16", weights="deit_in1k", approximate_gelu=False)
    assert release_of(model) == "deit_in1k" and vk.input_convention(model) == IMAGENET
    x = pixels(batch=1, size=224)
    published = timm.models.get_pretrained_cfg(entry.timm_model)
    with torch.no_grad():
        expected = reference(torch.from_numpy(numpy_normalised(x, published.mean, published.std))
                             .permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(numpy(model(vk.preprocess(x, model))), expected, atol=1e-4)
    model.save(tmp_path / "deit.keras")
    loaded = keras.saving.load_model(tmp_path / "deit.keras", safe_mode=True)
    assert release_of(loaded) == "deit_in1k" and vk.input_convention(loaded) == IMAGENET
    np.testing.assert_allclose(numpy(serving_model(loaded)(x)["logits"]), expected, atol=1e-4)


def test_a_model_without_a_record_takes_unit_range_as_every_model_before_it(tmp_path):
    plain = randomize(vk.vit(TINY, image_size=32, num_classes=3), scale=0.1)
    plain.save(tmp_path / "plain.keras")
    loaded = keras.saving.load_model(tmp_path / "plain.keras", safe_mode=True)
    x = pixels()
    expected = numpy(plain(x / 127.5 - 1))
    assert vk.input_convention(loaded) == UNIT_RANGE and release_of(loaded) is None
    np.testing.assert_allclose(numpy(vk.preprocess(x, loaded)), x / 127.5 - 1, atol=1e-6)
    np.testing.assert_allclose(numpy(serving_model(loaded)(x)["logits"]), expected, atol=1e-5)
    # include_preprocessing's layer before records: a Rescaling named "preprocessing".
    inputs = keras.Input((32, 32, 3))
    scaled = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="preprocessing")(inputs)
    keras.Model(inputs, plain(scaled)).save(tmp_path / "old_raw.keras")
    old = keras.saving.load_model(tmp_path / "old_raw.keras", safe_mode=True)
    assert vk.input_convention(old) == UNIT_RANGE and release_of(old) is None
    np.testing.assert_allclose(numpy(serving_model(old)(x)["logits"]), expected, atol=1e-5)


def test_predict_and_the_serving_function_normalise_by_the_models_convention(tmp_path):
    from PIL import Image

    from apps import predict

    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, input_convention="dino"),
                      scale=0.1)
    model.save(tmp_path / "model.keras")
    x = pixels(batch=1)
    expected = numpy(keras.ops.softmax(model(numpy_normalised(x, IMAGENET_DEFAULT_MEAN,
                                                               IMAGENET_DEFAULT_STD))))
    served = numpy(serving_model(model)(x)["probabilities"])
    np.testing.assert_allclose(served, expected, atol=1e-5)
    Image.fromarray(x[0]).save(tmp_path / "image.png")
    [top] = predict.main([str(tmp_path / "model.keras"), str(tmp_path / "image.png"),
                          "--top-k", "1"])
    assert top[0] == (str(expected[0].argmax()), pytest.approx(expected[0].max(), abs=1e-5))


@in_tensorflow_pass
def test_an_exported_saved_model_normalises_by_the_deit_convention(tmp_path):
    from vit_keras import export

    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, input_convention="deit_in1k"),
                      scale=0.1)
    x = pixels(batch=4)
    export.export_all(model, str(tmp_path / "out"), x, formats=("saved_model",))
    got = export.Predictor(str(tmp_path / "out" / "saved_model"))(x)["logits"]
    expected = numpy(model(numpy_normalised(x, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)))
    np.testing.assert_allclose(got, expected, atol=1e-4)


@backend_independent
# A model that records the convention takes normalised batches; one with its own
# preprocessing layer (include_preprocessing) takes the pixels and normalises them once.
@pytest.mark.parametrize("first_layer", [
    lambda: preprocessing.InputRecord(IMAGENET, name=preprocessing.RECORD_LAYER),
    lambda: preprocessing.Normalize(IMAGENET, None, name=preprocessing.MODEL_LAYER)],
    ids=["record", "own_preprocessing"])
def test_the_evaluation_pipeline_and_evaluate_take_the_models_convention(tmp_path, first_layer):
    import tensorflow as tf
    from PIL import Image

    from apps import evaluate
    from vit_keras import data

    x, labels = pixels(batch=6), np.arange(6) % 2
    batches = data.make_pipeline(tf.data.Dataset.from_tensor_slices((x, labels)),
                                 image_size=32, num_classes=2, batch_size=6, training=False,
                                 convention=IMAGENET)
    got, _ = next(iter(batches))
    np.testing.assert_allclose(got.numpy(), numpy_normalised(x, IMAGENET_DEFAULT_MEAN,
                                                             IMAGENET_DEFAULT_STD), atol=1e-6)
    # A model that answers 1 where the channels' normalised values sum above zero: flat greys
    # between the ImageNet means and 127.5 tell the two conventions apart.
    inputs = keras.Input((32, 32, 3))
    recorded = first_layer()(inputs)
    head = keras.layers.Dense(2, name="head")
    model = keras.Model(inputs, head(keras.layers.GlobalAveragePooling2D()(recorded)))
    head.set_weights([np.tile([[-1.0, 1.0]], (3, 1)), np.zeros(2)])
    model.save(tmp_path / "model.keras")
    greys = {"c0": [60, 200], "c1": [118, 122]}
    for name, levels in greys.items():
        (tmp_path / "images" / name).mkdir(parents=True)
        for level in levels:
            Image.fromarray(np.full((32, 32, 3), level, np.uint8)).save(
                tmp_path / "images" / name / f"{level}.png")
    answers = {level: int(numpy_normalised(np.full(3, level), IMAGENET_DEFAULT_MEAN,
                                           IMAGENET_DEFAULT_STD).sum() > 0)
               for levels in greys.values() for level in levels}
    assert [answers[level] for level in (118, 122)] == [1, 1]  # [-1, 1] would give 0, 0
    report = evaluate.main([str(tmp_path / "model.keras"), "--folder",
                            str(tmp_path / "images")])
    expected = np.mean([answers[level] == int(name[1]) for name, levels in greys.items()
                        for level in levels])
    assert report["top1"] == pytest.approx(expected) and report["input_convention"] == "imagenet"


@backend_independent
def test_conventions_are_refused_by_name_where_they_cannot_apply():
    with pytest.raises(ValueError, match=r"^no release named 'imagenet': expected one of "
                                         r"augreg_in21k, "):
        vk.input_convention("imagenet")
    with pytest.raises(TypeError, match="expected a Keras model, a release name or an "
                                        "InputConvention, got int"):
        vk.preprocess(pixels(), 3)
    with pytest.raises(ValueError, match="input convention 'imagenet' normalises 3 channels, "
                                         "but the model takes 1"):
        vk.vit(TINY, image_size=32, channels=1, input_convention=IMAGENET)
    with pytest.raises(ValueError, match=r"expected 3 channel values for mean, got 2"):
        preprocessing.InputConvention("two", (0.5, 0.5), (0.5, 0.5, 0.5))
    # [-1, 1] is one number per pixel: a one-channel model takes it.
    assert vk.input_convention(vk.vit(TINY, image_size=32, channels=1,
                                      input_convention=UNIT_RANGE)) == UNIT_RANGE


@backend_independent
def test_the_model_cards_table_is_rendered_from_the_release_records(monkeypatch):
    from apps.variants import pretrained_table

    card = pretrained.Release(
        "a test card", "Test-Licence-1.0",
        {"Ti/16": pretrained.Checkpoint("x/ti.npz", 64, 10)}, {"layer_scale": 0.5},
        data="Test-10 images", convention=OPENAI_CLIP,
        top1=pretrained.Top1("linear probe", "[a table](https://example.org)", {"Ti/16": 12.0}))
    monkeypatch.setitem(pretrained.PRETRAINED, "test_card", card)
    rows = {row.split(" | ")[0]: row for row in pretrained_table().splitlines()[2:]}
    assert set(rows) == {f"| `{name}`" for name in pretrained.names()}
    assert rows["| `test_card`"] == (
        "| `test_card` | a test card | Test-10 images | Ti/16 | 64 | 10 | openai_clip | Ti/16 "
        "12.0 (linear probe; [a table](https://example.org)) | `layer_scale=0.5` | "
        "Test-Licence-1.0 |")
    for name in pretrained.names():
        release = pretrained.PRETRAINED[name]
        assert release.licence in rows[f"| `{name}`"] and release.data
        assert release.convention.name in rows[f"| `{name}`"]
        if release.top1 is not None:
            assert release.top1.source in rows[f"| `{name}`"]
            assert set(release.top1.values) <= set(release.checkpoints), name


@backend_independent
def test_the_pages_table_of_conventions_has_the_constants_values():
    page = (Path(__file__).parents[1] / "docs" / "pretrained.md").read_text()
    for convention, constant in ((UNIT_RANGE, "UNIT_RANGE"), (IMAGENET, "IMAGENET"),
                                 (OPENAI_CLIP, "OPENAI_CLIP")):
        values = [", ".join(map(repr, side)) for side in (convention.mean, convention.std)]
        assert f"| `{convention.name}` | `{constant}` | {values[0]} | {values[1]} |" in page
