import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import vit_keras as vk
from apps import export as export_app
from apps import predict
from tests.conftest import TINY, backend_independent, in_tensorflow_pass, randomize
from tests.conftest import images as random_images
from vit_keras.export import ClassTokenFolded, Predictor

ROOT = Path(__file__).parents[1]


def quadrant_data(count, seed):
    """4 classes: which quadrant of a 32x32 image is bright. uint8 images, int labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, count)
    images = rng.integers(0, 120, (count, 32, 32, 3))
    for image, label in zip(images, labels, strict=True):
        row, col = divmod(int(label), 2)
        image[row * 16:(row + 1) * 16, col * 16:(col + 1) * 16] += 120
    return images.astype(np.uint8), labels


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained on the current backend, saved as .keras with labels.txt."""
    folder = tmp_path_factory.mktemp("run")
    keras.utils.set_random_seed(0)  # module fixtures run before the per-test seeding
    images, labels = quadrant_data(1024, 0)
    model = vk.vit(TINY, image_size=32, num_classes=4)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(vk.preprocess(images), labels, batch_size=32, epochs=16, verbose=0)
    model.save(folder / "model.keras")
    (folder / "labels.txt").write_text("top-left\ntop-right\nbottom-left\nbottom-right\n")
    held_out = folder / "held_out"
    from PIL import Image

    test_images, test_labels = quadrant_data(300, 1)
    predicted = keras.ops.convert_to_numpy(model(vk.preprocess(test_images))).argmax(-1)
    assert (predicted == test_labels).mean() > 0.9  # a trained model, not noise
    for i, (image, label) in enumerate(zip(test_images, test_labels, strict=True)):
        (held_out / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(held_out / str(label) / f"{i}.png")
    return folder, model, test_images


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    folder, _, _ = trained
    out = tmp_path_factory.mktemp("export") / "tiny"
    # Under JAX or PyTorch this runs the export in a TensorFlow child process; there only the
    # formats that test_exports_answer_like_keras_when_run_here reads are made (every format
    # is checked in the TensorFlow pass).
    formats = [] if keras.backend.backend() == "tensorflow" else [
        "--formats", "saved_model", "tflite_float32", "onnx"]
    export_app.main([str(folder / "model.keras"), "--out", str(out), "--folder",
                     str(folder / "held_out"), "--samples", "300", "--calibration", "200",
                     *formats])
    return out, json.loads((out / "export_report.json").read_text())


@in_tensorflow_pass
def test_every_format_agrees_with_keras(trained, exported):
    _, model, _ = trained
    out, report = exported
    formats = report["formats"]
    assert set(formats) == {"saved_model", "tflite_float32", "tflite_float16",
                            "tflite_dynamic_int8", "tflite_int8", "onnx"}
    for kind in ("saved_model", "tflite_float32", "onnx"):
        assert formats[kind]["max_abs_diff_probabilities"] <= 1e-4, kind
    assert formats["tflite_float16"]["max_abs_diff_probabilities"] <= 1e-2
    _, _, images = trained
    np.testing.assert_allclose(  # recomputed here, not the report's
        Predictor(str(out / "model_float16.tflite"))(images[:20])["probabilities"],
        keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(images[:20])))),
        atol=1e-2)
    keras_top1 = keras.ops.convert_to_numpy(model(vk.preprocess(images))).argmax(-1)
    for kind, file in (("tflite_int8", "model_int8.tflite"),
                       ("tflite_dynamic_int8", "model_dynamic_int8.tflite")):
        assert formats[kind]["images"] == 300
        top1 = Predictor(str(out / file))(images)["probabilities"].argmax(-1)
        agreement = float((top1 == keras_top1).mean())  # recomputed here, not the report's
        assert agreement >= 0.99 and agreement == pytest.approx(
            formats[kind]["top1_agreement"]), (kind, agreement, formats[kind])
    assert formats["tflite_int8"]["size_bytes"] < formats["tflite_float32"]["size_bytes"]
    assert (out / "labels.txt").read_text().splitlines()[0] == "top-left"


def test_exports_answer_like_keras_when_run_here(trained, exported):
    _, model, images = trained
    out, _ = exported
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(images[:20]))))
    for name in ("saved_model", "model_float32.tflite", "model.onnx"):
        got = Predictor(str(out / name))(images[:20])["probabilities"]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=name)


@in_tensorflow_pass
def test_predict_app_gives_the_same_answer_from_every_format(trained, exported):
    from PIL import Image

    folder, model, _ = trained
    out, _ = exported
    image = sorted((folder / "held_out" / "2").iterdir())[0]
    expected = ["top-left", "top-right", "bottom-left", "bottom-right"][int(keras.ops.argmax(
        model(vk.preprocess(np.asarray(Image.open(image))[None]))[0]))]
    answers = []
    for model in (folder / "model.keras", out / "saved_model", out / "model_float32.tflite",
                  out / "model_float16.tflite", out / "model_int8.tflite", out / "model.onnx"):
        top = predict.main([str(model), str(image), "--top-k", "1"])[0][0]
        answers.append(top[0])
    assert set(answers) == {expected}, answers


@in_tensorflow_pass
def test_saved_model_runs_without_vit_keras_or_keras(trained, exported, tmp_path):
    _, model, images = trained
    out, _ = exported
    np.save(tmp_path / "x.npy", images[:8])
    code = f"""
import sys
sys.modules["vit_keras"] = None  # make any import of them fail
sys.modules["keras"] = None
import numpy as np, tensorflow as tf
serve = tf.saved_model.load({str(out / "saved_model")!r}).signatures["serving_default"]
out = serve(images=tf.constant(np.load({str(tmp_path / "x.npy")!r})))
np.save({str(tmp_path / "p.npy")!r}, out["probabilities"].numpy())
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": ""})
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(images[:8]))))
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), expected, atol=1e-4)


@in_tensorflow_pass
def test_dynamic_size_model_exports_a_saved_model_of_any_size(tmp_path):
    from PIL import Image

    from vit_keras import export

    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, dynamic_image_size=True),
                      scale=0.1)
    rng = np.random.default_rng(0)
    report = export.export_all(model, str(tmp_path / "out"),
                               rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8),
                               formats=("saved_model", "tflite_float32"))
    assert report["input_shape"] == [None, None, 3]
    assert report["fixed_size_formats_input_shape"] == [32, 32, 3]
    assert Predictor(str(tmp_path / "out" / "model_float32.tflite")).input_shape == (32, 32, 3)
    assert not (tmp_path / "out" / "fixed_size_saved_model").exists()
    sizes = [(32, 32), (48, 24)]
    for size in sizes:
        np.save(tmp_path / f"x{size[0]}.npy",
                rng.integers(0, 256, (2, *size, 3), dtype=np.uint8))
    code = f"""
import sys
sys.modules["vit_keras"] = None
sys.modules["keras"] = None
import numpy as np, tensorflow as tf
serve = tf.saved_model.load({str(tmp_path / "out" / "saved_model")!r}).signatures["serving_default"]
for height in {[size[0] for size in sizes]!r}:
    x = np.load({str(tmp_path)!r} + f"/x{{height}}.npy")
    np.save({str(tmp_path)!r} + f"/p{{height}}.npy", serve(images=tf.constant(x))["logits"].numpy())
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": ""})
    for height, _ in sizes:
        x = np.load(tmp_path / f"x{height}.npy")
        np.testing.assert_allclose(np.load(tmp_path / f"p{height}.npy"),
                                   keras.ops.convert_to_numpy(model(vk.preprocess(x))),
                                   atol=1e-4)
    Image.fromarray(np.load(tmp_path / "x48.npy")[0]).save(tmp_path / "image.png")
    saved_model = str(tmp_path / "out" / "saved_model")
    [top] = predict.main([saved_model, str(tmp_path / "image.png"), "--image-size", "48", "24",
                          "--top-k", "1"])  # height 48, width 24: the image as it is
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(
        np.load(tmp_path / "x48.npy")[:1]))))[0]
    assert top[0][0] == str(expected.argmax()) and top[0][1] == pytest.approx(expected.max(),
                                                                              abs=1e-4)
    with pytest.raises(ValueError, match="the model takes images of any size: give "
                                         "--image-size HEIGHT WIDTH"):
        predict.main([saved_model, str(tmp_path / "image.png")])


@in_tensorflow_pass
def test_export_refuses_to_overwrite(trained, exported):
    folder, _, _ = trained
    out, _ = exported
    command = [sys.executable, "-m", "apps.export", str(folder / "model.keras"), "--out",
               str(out), "--folder", str(folder / "held_out"), "--formats", "tflite_float32"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert done.returncode != 0
    assert "exists; pass --overwrite (overwrite=True) to export into it, replacing an " \
           "earlier export's files" in done.stderr


@in_tensorflow_pass
def test_overwriting_replaces_the_exports_and_nothing_else(trained, tmp_path):
    """A run's folder as the export's: --overwrite must not take the model, the run's files
    (its labels.txt too, when no labels are given) or a user's notes with it; an earlier
    export's files go, asked for again or not."""
    from vit_keras import export

    _, model, test_images = trained
    run_files = {"model.keras": "the run's model", "labels.txt": "a\nb\nc\nd\n",
                 "result.json": "{}", "notes.txt": "mine"}
    for name, text in run_files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "model_int8.tflite").write_bytes(b"an earlier export")
    (tmp_path / "model.onnx").write_bytes(b"an earlier export")
    report = export.export_all(model, str(tmp_path), test_images[:8],
                               formats=("tflite_float32",), overwrite=True)
    assert report["formats"]["tflite_float32"]["passed"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [*run_files, "export_report.json", "model_float32.tflite"])
    assert {name: (tmp_path / name).read_text() for name in run_files} == run_files
    with pytest.raises(NotADirectoryError, match="'.*notes.txt' is a file: exports go into a "
                                                 "folder"):
        export.export_all(model, str(tmp_path / "notes.txt"), test_images[:8],
                          formats=("tflite_float32",), overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@in_tensorflow_pass
def test_wrong_input_shape_is_refused(exported):
    out, _ = exported
    predictor = Predictor(str(out / "model_float32.tflite"))
    with pytest.raises(ValueError, match=r"expected uint8 images of shape \(batch, 32, 32, 3\), "
                                         r"got float32 \(1, 28, 28, 3\)"):
        predictor(np.zeros((1, 28, 28, 3), np.float32))
    with pytest.raises(ValueError, match=r"got float32 \(1, 32, 32, 3\)"):  # [-1, 1] floats
        predictor(np.zeros((1, 32, 32, 3), np.float32))


@backend_independent
def test_export_reads_both_splits_of_the_data_its_run_recorded(tmp_path, monkeypatch):
    """A run's record as apps.train writes it, a dataset's or a folder's: the held-out and the
    calibration images each come from their place; --data-dir alone moves where a recorded
    dataset's files are."""
    from apps import export as export_app
    from vit_keras import data

    read = []
    monkeypatch.setattr(data, "load_source", lambda *args: read.append(args) or ("images", []))
    monkeypatch.setattr(data, "sample_images", lambda dataset, size, channels, count: dataset)
    model = vk.vit(TINY, image_size=32, num_classes=3)
    dataset_run = {"dataset": "fashion_mnist", "data_dir": "/old", "train_split": "train",
                   "eval_split": "test", "validation_split": None}
    folder_run = {"folder": "/images", "eval_folder": None, "validation_split": None}
    for recorded, flags, expected in [  # (dataset, split, folder, data_dir): held out, train
            (dataset_run, [], [("fashion_mnist", "test", None, "/old"),
                               ("fashion_mnist", "train", None, "/old")]),
            (dataset_run, ["--data-dir", "/new"], [("fashion_mnist", "test", None, "/new"),
                                                   ("fashion_mnist", "train", None, "/new")]),
            (folder_run, [], [(None, "test", "/images", None), (None, "train", "/images", None)]),
            ({**folder_run, "eval_folder": "/held"}, [], [(None, "test", "/held", None),
                                                         (None, "train", "/images", None)])]:
        (tmp_path / "result.json").write_text(json.dumps({"data": recorded}))
        args = export_app.build_parser().parse_args([str(tmp_path / "model.keras"), *flags])
        source = export_app.data_source(args)
        read.clear()
        assert [export_app.images_for(source, model, split, 4) for split in ("eval", "train")
                ] == ["images", "images"]
        assert read == expected, (recorded, flags)


@in_tensorflow_pass
def test_an_export_past_its_tolerance_is_refused_by_name(trained, tmp_path):
    """A format that fails its check raises, names itself, and is marked in the report (a
    top-1 agreement above 1 cannot be met)."""
    from vit_keras import export

    _, model, test_images = trained
    with pytest.raises(export.ExportVerificationError,
                       match="exports past their tolerance: tflite_float32 "):
        export.export_all(model, str(tmp_path / "out"), test_images[:8],
                          formats=("tflite_float32",),
                          tolerances={"tflite_float32": (None, 1.01)})
    report = json.loads((tmp_path / "out" / "export_report.json").read_text())
    assert report["formats"]["tflite_float32"]["passed"] is False
    assert report["formats"]["tflite_float32"]["min_top1_agreement"] == 1.01  # the one asked


HYBRID = {**TINY, "patch_size": 1, "resnet_layers": (1,), "resnet_width": 32}


@in_tensorflow_pass
@pytest.mark.parametrize("config, posemb", [(TINY, "learned"), (TINY, "none"),
                                            (HYBRID, "sincos2d")])
def test_folding_the_class_token_keeps_the_function(config, posemb):
    model = randomize(vk.vit(config, image_size=32, num_classes=3, posemb=posemb))
    assert ClassTokenFolded.applies_to(model)
    x = random_images(3)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ClassTokenFolded(model)(x)),
                               keras.ops.convert_to_numpy(model(x)), rtol=1e-5, atol=1e-5)


@in_tensorflow_pass
def test_class_token_fold_takes_only_vits_plain_chain():
    assert not ClassTokenFolded.applies_to(vk.vit(TINY, image_size=32, classifier="gap"))
    base = vk.vit(TINY, image_size=32, num_classes=3)
    assert ClassTokenFolded.applies_to(keras.Model(base.input, base.get_layer("pool").output))
    side = keras.layers.Dense(3, name="side")(base.get_layer("pool").output)
    branched = keras.Model(base.input, keras.layers.Add()([base.output, side]))
    assert not ClassTokenFolded.applies_to(branched)


def with_small_class_token(model, factor=0.1):
    """`model` with its class token and that token's position embedding scaled by factor."""
    cls = model.get_layer("cls").cls
    cls.assign(cls * factor)
    posemb = model.get_layer("Transformer_posembed_input").pos_embedding
    posemb.assign(keras.ops.concatenate([posemb[:, :1] * factor, posemb[:, 1:]], axis=1))
    return model


@in_tensorflow_pass
def test_full_integer_file_keeps_a_small_class_token(trained, tmp_path):
    """A class token far smaller than the patch tokens (the trained tiny model's, shrunk 10x:
    ~170x smaller, as in a Ti/16 trained on Fashion-MNIST, ~65x) survives int8 when folded."""
    from vit_keras import export
    from vit_keras.export.formats import full_integer_int8

    folder, _, images = trained
    model = with_small_class_token(keras.saving.load_model(folder / "model.keras"))
    report = export.export_all(model, str(tmp_path / "folded"), images[:200],
                               representative=images[200:], formats=("tflite_int8",))
    assert report["formats"]["tflite_int8"]["top1_agreement"] >= 0.99
    # The control: the same model exported without the fold loses its class token.
    serving = export.serving_model(model)
    serving.export(str(tmp_path / "plain"), format="tf_saved_model", verbose=False)
    (tmp_path / "plain.tflite").write_bytes(
        export.tflite_bytes(str(tmp_path / "plain"), full_integer_int8, images[200:]))
    plain = Predictor(str(tmp_path / "plain.tflite"))(images[:200])["probabilities"]
    expected = keras.ops.convert_to_numpy(serving(images[:200])["probabilities"])
    assert (plain.argmax(-1) == expected.argmax(-1)).mean() < 0.9
