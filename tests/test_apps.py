import os
import time
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import TINY, TINY_FLAGS, backend_independent, checkpoint_params
from vit_keras import training

# The apps parse, call the library and write files; what they compute is the library's, tested
# on every backend in its own modules.
pytestmark = backend_independent


def test_convert_npz_to_keras_and_back(tmp_path, capsys):

    from apps import convert
    from tests import official_layout

    params = official_layout.random_checkpoint(np.random.default_rng(0), grid=(4, 4))
    np.savez(tmp_path / "in.npz", **params)
    flags = ["--variant", "Ti/16", "--image-size", "32", "--num-classes", "7"]
    # Ti/16 does not fit the tiny checkpoint: the error says how.
    with pytest.raises(ValueError, match="checkpoint has 2 encoder blocks, the model has 12"):
        convert.main([str(tmp_path / "in.npz"), str(tmp_path / "x.keras"), *flags])
    tiny = TINY_FLAGS
    convert.main([str(tmp_path / "in.npz"), str(tmp_path / "out.keras"), *tiny,
                  "--image-size", "48", "--num-classes", "7"])
    printed = capsys.readouterr().out
    assert "resampled Transformer/posembed_input/pos_embedding: grid 4x4 -> 6x6 (zoom)" in printed
    assert "wrote" in printed
    convert.main([str(tmp_path / "out.keras"), str(tmp_path / "back.npz")])
    back = np.load(tmp_path / "back.npz")
    np.testing.assert_array_equal(back["embedding/kernel"], params["embedding/kernel"])
    with pytest.raises(FileExistsError, match="back.npz' exists"):
        convert.main([str(tmp_path / "out.keras"), str(tmp_path / "back.npz")])


@pytest.mark.parametrize("config, image_size, num_classes, named", [
    (TINY, 48, 5, "custom shape (hidden_size 32, num_layers 2, num_heads 4, mlp_dim 64, "
                  "patch_size 8), 48 px, 5 classes"),
    ({**TINY, "patch_size": 1, "resnet_layers": (1,), "resnet_width": 32}, 32, 3,
     "custom shape (hidden_size 32, num_layers 2, num_heads 4, mlp_dim 64, patch_size 1), "
     "32 px, 3 classes"),
])
def test_convert_builds_the_model_an_npz_holds_without_variant(tmp_path, capsys, config,
                                                               image_size, num_classes, named):

    import vit_keras as vk
    from apps import convert
    from tests.conftest import randomize

    source = randomize(vk.vit(config, image_size=image_size, num_classes=num_classes))
    vk.save_npz(source, tmp_path / "in.npz")
    convert.main([str(tmp_path / "in.npz"), str(tmp_path / "out.keras")])
    assert named in capsys.readouterr().out
    converted = keras.saving.load_model(tmp_path / "out.keras", safe_mode=True)
    assert converted.count_params() == source.count_params()
    for mine, theirs in zip(converted.weights, source.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine.value),
                                      keras.ops.convert_to_numpy(theirs.value), err_msg=mine.path)


def test_convert_takes_the_classifier_and_learned_position_embedding_an_npz_holds(tmp_path,
                                                                                    capsys):
    import vit_keras as vk
    from apps import convert
    from tests.conftest import randomize

    source = randomize(vk.vit(TINY, image_size=32, num_classes=3, classifier="gap",
                              posemb="learned2d"))
    vk.save_npz(source, tmp_path / "in.npz")
    convert.main([str(tmp_path / "in.npz"), str(tmp_path / "out.keras"), "--image-size", "32"])
    assert "3 classes, gap classifier, learned2d position embedding" in capsys.readouterr().out
    converted = keras.saving.load_model(tmp_path / "out.keras", safe_mode=True)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(source(images)), atol=1e-5)


def test_convert_asks_for_what_an_npz_of_fixed_position_embeddings_cannot_show(tmp_path):
    import vit_keras as vk
    from apps import convert
    from tests.conftest import randomize

    source = randomize(vk.vit(TINY, image_size=32, num_classes=3, classifier="gap",
                              posemb="sincos2d"))
    vk.save_npz(source, tmp_path / "in.npz")
    paths = [str(tmp_path / "in.npz"), str(tmp_path / "out.keras")]
    with pytest.raises(ValueError, match=r"in\.npz: holds no learned position embedding, so "
                                         r"its model's was fixed or none: pass --posemb "
                                         r"sincos2d or --posemb none"):
        convert.main(paths)
    with pytest.raises(ValueError, match=r"in\.npz: its arrays do not give the image size .*: "
                                         r"pass --image-size"):
        convert.main([*paths, "--posemb", "sincos2d"])
    convert.main([*paths, "--posemb", "sincos2d", "--image-size", "32"])
    converted = keras.saving.load_model(tmp_path / "out.keras", safe_mode=True)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(source(images)), atol=1e-5)


def test_convert_asks_for_the_variant_where_the_file_does_not_say(tmp_path):
    import vit_keras as vk
    from apps import convert

    vk.vit(TINY, image_size=32, num_classes=2).save_weights(tmp_path / "w.weights.h5")
    with pytest.raises(ValueError, match=r"w\.weights\.h5: pass --variant \(e\.g\. --variant "
                                         r"B/16\) or every shape flag"):
        convert.main([str(tmp_path / "w.weights.h5"), str(tmp_path / "w.npz")])
    with pytest.raises(ValueError, match="--family 'nope': expected a named release, one of "
                                         "augreg_in21k, "):
        convert.main([str(tmp_path / "w.weights.h5"), str(tmp_path / "w.npz"), "--variant",
                      "Ti/16", "--family", "nope"])


def saved_tiny_model(tmp_path, num_classes=2):
    import vit_keras as vk
    from tests.conftest import randomize

    model = randomize(vk.vit(TINY, image_size=32, num_classes=num_classes), scale=0.05)
    path = tmp_path / "model.keras"
    model.save(path)
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    return model, str(path)


def test_predict_prints_top_k_from_the_model(tmp_path, capsys):
    from PIL import Image

    import vit_keras as vk
    from apps import predict

    model, path = saved_tiny_model(tmp_path)
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    results = predict.main([path, str(tmp_path / "a.png"), "--top-k", "2"])
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(pixels[None]))))
    best = int(expected[0].argmax())
    assert results[0] == [(["cat", "dog"][best], pytest.approx(float(expected[0, best]),
                                                               abs=1e-5)),
                          (["cat", "dog"][1 - best], pytest.approx(float(expected[0, 1 - best]),
                                                                   abs=1e-5))]
    assert "a.png: " in capsys.readouterr().out
    (tmp_path / "labels.txt").unlink()  # a model saved by hand, without its run's labels
    numbered = predict.main([path, str(tmp_path / "a.png"), "--top-k", "2"])
    assert numbered[0][0][0] == str(best)
    assert capsys.readouterr().out.startswith("classes by number: no labels.txt beside the "
                                              "model (--labels FILE names them)\n")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n garbage")
    with pytest.raises(ValueError, match=r"cannot read image file '.*broken\.png'"):
        predict.main([path, str(tmp_path / "broken.png")])
    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        predict.main([path, str(tmp_path / "missing.png")])


def test_predict_refuses_labels_of_another_class_count(tmp_path):
    from PIL import Image

    from apps import predict

    _, path = saved_tiny_model(tmp_path)  # two classes
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "ten.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    with pytest.raises(ValueError, match=r"labels file '.*ten\.txt' has 10 names but the model "
                                         "has 2 classes"):
        predict.main([path, str(tmp_path / "a.png"), "--labels", str(tmp_path / "ten.txt")])
    with pytest.raises(FileNotFoundError, match=r"labels file '.*none\.txt' does not exist"):
        predict.main([path, str(tmp_path / "a.png"), "--labels", str(tmp_path / "none.txt")])


def write_images(root, per_class, size, seed):
    """root/cat and root/dog with per_class random PNGs of size x size pixels each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png")
    return root


@backend_independent
def test_classification_report_counts_as_a_loop_over_the_images_does():
    from vit_keras.evaluation import classification_report

    rng = np.random.default_rng(9)
    labels = np.repeat(np.arange(7), [9, 3, 1, 6, 2, 5, 4])  # unequal classes: recall, not
    logits = rng.normal(size=(len(labels), 7))  # precision, is each class's accuracy
    logits[np.arange(0, len(labels), 3), labels[::3]] += 2.0  # some right, many wrong
    names = [f"c{k}" for k in range(7)]
    report = classification_report(logits, labels, names)
    top1 = top5 = 0
    matrix = np.zeros((7, 7), int)
    for row, label in zip(logits, labels, strict=True):
        ranked = sorted(range(7), key=lambda k: -row[k])
        top1 += ranked[0] == label
        top5 += label in ranked[:5]
        matrix[label, ranked[0]] += 1
    assert report["confusion_matrix"] == matrix.tolist()
    assert report["top1"] == pytest.approx(top1 / len(labels))
    assert report["top5"] == pytest.approx(top5 / len(labels)) and report["top5"] < 1.0
    for k, name in enumerate(names):
        assert report["per_class"][name] == pytest.approx(matrix[k, k] / matrix[k].sum())
    assert len({round(value, 6) for value in report["per_class"].values()}) > 3


def test_evaluate_writes_metrics_and_a_confusion_matrix_png(tmp_path):
    """A model that answers "dog" for images brighter than mid-grey, on flat images of known
    brightness: the matrix counts its answers per true class."""
    from PIL import Image

    from apps import evaluate

    images = keras.Input((32, 32, 3))
    answer = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(images))
    model = keras.Model(images, answer)
    model.get_layer("head").set_weights([np.tile([[-1.0, 1.0]], (3, 1)), np.zeros(2)])
    model.save(tmp_path / "model.keras")
    levels = {"cat": [10, 200, 60], "dog": [230, 90, 250]}
    expected = np.zeros((2, 2), int)  # rows: the true class, columns: the model's answer
    for label, (name, greys) in enumerate(levels.items()):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i, grey in enumerate(greys):
            Image.fromarray(np.full((32, 32, 3), grey, np.uint8)).save(
                tmp_path / "images" / name / f"{i}.png")
            expected[label, int(grey > 127.5)] += 1
    report = evaluate.main([str(tmp_path / "model.keras"), "--folder", str(tmp_path / "images")])
    np.testing.assert_array_equal(report["confusion_matrix"], expected)
    assert expected.tolist() == [[2, 1], [1, 2]]
    assert report["top1"] == pytest.approx(4 / 6)
    assert report["top5"] == 1.0  # two classes: the true one is always in the top 5
    with Image.open(tmp_path / "confusion_matrix.png") as png:
        assert png.format == "PNG" and png.size[0] >= 300
    limited = evaluate.main([str(tmp_path / "model.keras"), "--folder", str(tmp_path / "images"),
                             "--limit", "4", "--out", str(tmp_path / "limited")])
    assert limited["images"] == np.sum(limited["confusion_matrix"]) == 4


def mirror_sensitive_case(num_classes=3):
    """(a linear model over 8x8 RGB pixels, which scores an image and its mirror differently;
    its kernel; 24 uint8 images; their labels, the classes in turn)."""
    rng = np.random.default_rng(4)
    pixels = keras.Input((8, 8, 3))
    model = keras.Model(pixels, keras.layers.Dense(num_classes, name="head")(
        keras.layers.Flatten()(pixels)))
    kernel = rng.normal(size=(8 * 8 * 3, num_classes)).astype("float32")
    model.get_layer("head").set_weights([kernel, np.zeros(num_classes, "float32")])
    images = rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8)
    return model, kernel, images, np.arange(24) % num_classes


def numpy_logits(images, kernel, mirror: bool) -> np.ndarray:
    """The linear model's logits on the pipeline's [-1, 1] pixels, computed here; mirror:
    averaged with those of the images flipped left to right."""
    x = images.astype("float32") / 127.5 - 1.0
    logits = x.reshape(len(x), -1) @ kernel
    if mirror:
        logits = (logits + x[:, :, ::-1].reshape(len(x), -1) @ kernel) / 2
    return logits


def numpy_top1(images, labels, kernel, mirror: bool) -> float:
    """Top-1 of numpy_logits."""
    return float(np.mean(numpy_logits(images, kernel, mirror).argmax(-1) == labels))


def test_evaluate_mirror_averages_each_images_logits_with_its_mirrors(tmp_path):
    from PIL import Image

    from apps import evaluate

    model, kernel, images, labels = mirror_sensitive_case()
    model.save(tmp_path / "model.keras")
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (tmp_path / "images" / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "images" / f"c{label}" / f"{i}.png")
    flags = [str(tmp_path / "model.keras"), "--folder", str(tmp_path / "images")]
    single, mirrored = evaluate.main(flags), evaluate.main([*flags, "--mirror"])
    assert single["top1"] == pytest.approx(numpy_top1(images, labels, kernel, mirror=False))
    assert mirrored["top1"] == pytest.approx(numpy_top1(images, labels, kernel, mirror=True))
    assert mirrored["top1"] != single["top1"] and (single["mirror"], mirrored["mirror"]) == (
        False, True)


def test_train_scores_the_recipes_test_time_flip_and_the_single_view_beside(monkeypatch):
    """held_out_scores counts right: each image's label is the class its flip-averaged logits
    (NumPy's) rank (i mod 6)th of 8, so that 4 of the 24 images are right at top-1 and 20 at
    top-5; the single view's counts are NumPy's too. Its seconds time the evaluation: every
    prediction is made to take 50 ms."""
    import tensorflow as tf

    from apps import train

    model, kernel, images, _ = mirror_sensitive_case(num_classes=8)
    ranked = np.argsort(-numpy_logits(images, kernel, mirror=True), axis=-1)
    labels = ranked[np.arange(24), np.arange(24) % 6]
    single = np.argsort(-numpy_logits(images, kernel, mirror=False), axis=-1)
    single_top1, single_top5 = (int(np.sum(np.any(single[:, :k] == labels[:, None], axis=-1)))
                                for k in (1, 5))
    assert single_top1 != 4  # the views disagree
    batches = tf.data.Dataset.from_tensor_slices(
        (images.astype("float32") / 127.5 - 1.0, np.eye(8, dtype="float32")[labels])).batch(5)
    predict = model.predict_on_batch

    def slow_predict(x):
        time.sleep(0.05)
        return predict(x)

    monkeypatch.setattr(model, "predict_on_batch", slow_predict)
    started = time.time()
    flipped = train.held_out_scores(model, batches, "test", test_time_flip=True)
    elapsed = time.time() - started
    assert {key: value for key, value in flipped.items() if key != "evaluate_seconds"} == {
        "test_accuracy": round(4 / 24, 4), "test_top5": round(20 / 24, 4),
        "test_accuracy_single_view": round(single_top1 / 24, 4)}
    # ten predictions (five batches and their mirrors), all within the call
    assert 0.5 <= flipped["evaluate_seconds"] <= round(elapsed, 1)
    plain = train.held_out_scores(model, batches, "validation", test_time_flip=False)
    assert {key: value for key, value in plain.items() if key != "evaluate_seconds"} == {
        "validation_accuracy": round(single_top1 / 24, 4),
        "validation_top5": round(single_top5 / 24, 4)}
    assert plain["evaluate_seconds"] >= 0.2  # five predictions: 0.25 s, rounded to tenths


def test_evaluate_refuses_a_folder_of_another_class_count(tmp_path):
    from apps import evaluate

    _, path = saved_tiny_model(tmp_path, num_classes=3)
    images = write_images(tmp_path / "images", 1, 32, seed=2)  # cat and dog
    with pytest.raises(ValueError, match=r"'.*images' has 2 classes \(cat, dog\), but the "
                                         "model predicts 3"):
        evaluate.main([path, "--folder", str(images)])


def test_inspect_names_a_missing_image_before_loading_the_model(tmp_path):
    from apps import inspect

    with pytest.raises(FileNotFoundError, match=r"no such image file or folder: '.*gone\.png'"):
        inspect.main([str(tmp_path / "no_model.keras"), str(tmp_path / "gone.png")])


def test_inspect_writes_valid_pngs(tmp_path):
    import json

    from PIL import Image

    import vit_keras as vk
    from apps import inspect
    from tests.conftest import randomize
    from vit_keras import analysis, data
    from vit_keras.preprocessing import preprocess

    path = str(tmp_path / "model.keras")  # weights large enough for attention that varies
    randomize(vk.vit(TINY, image_size=32, num_classes=2), scale=0.5).save(path)
    images = write_images(tmp_path / "images", 3, 32, seed=3)
    out = inspect.main([path, "--folder", str(images), "--images", "3",
                        "--distance-images", "6", "--out", str(tmp_path / "figs")])
    sizes = {"rollout.png": (600, 400), "filters.png": (700, 400),
             "posemb_similarity.png": (400, 400), "attention_distance.png": (500, 400)}
    for name, size in sizes.items():
        with Image.open(os.path.join(out, name)) as png:
            assert png.format == "PNG" and png.size == size, (name, png.size)
    numbers = json.loads((tmp_path / "figs" / "inspect.json").read_text())
    measured = data.sample_images(data.from_folder(str(images))[0], (32, 32), 3, 6)
    assert len(measured) == 6  # --distance-images, not the 3 --images drawn
    expected = analysis.mean_attention_distance(keras.saving.load_model(path),
                                                preprocess(measured))
    np.testing.assert_allclose(numbers["mean_attention_distance"], expected.round(3),
                               atol=1e-3)


def test_inspect_feeds_the_model_by_its_recorded_convention(tmp_path):
    import json

    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    import vit_keras as vk
    from apps import inspect
    from tests.conftest import randomize
    from vit_keras import analysis, data

    path = str(tmp_path / "model.keras")
    randomize(vk.vit(TINY, image_size=32, num_classes=2, input_convention="deit_in1k"),
              scale=0.5).save(path)
    images = write_images(tmp_path / "images", 3, 32, seed=3)
    inspect.main([path, "--folder", str(images), "--images", "1", "--distance-images", "3",
                  "--out", str(tmp_path / "figs")])
    numbers = json.loads((tmp_path / "figs" / "inspect.json").read_text())
    measured = data.sample_images(data.from_folder(str(images))[0], (32, 32), 3, 3)
    by_hand = ((measured / 255 - np.array(IMAGENET_DEFAULT_MEAN))
               / np.array(IMAGENET_DEFAULT_STD)).astype("float32")
    expected = analysis.mean_attention_distance(keras.saving.load_model(path), by_hand)
    np.testing.assert_allclose(numbers["mean_attention_distance"], expected.round(3),
                               atol=1e-3)


def test_inspect_draws_a_hybrid_without_patch_filters(tmp_path, capsys):
    import json

    import vit_keras as vk
    from apps import inspect

    config = {**TINY, "patch_size": 1, "resnet_layers": (1,), "resnet_width": 32}
    vk.vit(config, image_size=32, num_classes=2).save(tmp_path / "hybrid.keras")
    images = write_images(tmp_path / "images", 2, 32, seed=4)
    (tmp_path / "figs").mkdir()  # an earlier inspect of a plain ViT, and a file of the user's
    (tmp_path / "figs" / "filters.png").write_bytes(b"an earlier model's filters")
    (tmp_path / "figs" / "notes.txt").write_text("mine")
    out = inspect.main([str(tmp_path / "hybrid.keras"), "--folder", str(images), "--images", "2",
                        "--distance-images", "2", "--out", str(tmp_path / "figs"),
                        "--overwrite"])
    assert sorted(os.listdir(out)) == ["attention_distance.png", "inspect.json", "notes.txt",
                                       "posemb_similarity.png", "rollout.png"]
    numbers = json.loads((tmp_path / "figs" / "inspect.json").read_text())
    why = "not the image's 3: a hybrid's filters are not image patches"
    assert why in numbers["filters"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("no filters.png: ") and why in printed[0], printed


def test_finetune_resamples_a_checkpoint_to_a_new_resolution(tmp_path, capsys):
    import json

    from apps import finetune
    from tests import official_layout

    params = official_layout.random_checkpoint(np.random.default_rng(5), grid=(4, 4), classes=9)
    np.savez(tmp_path / "pretrained.npz", **params)
    write_images(tmp_path / "images", 8, 48, seed=6)
    shape = TINY_FLAGS
    with pytest.warns(UserWarning, match="head .* zero-initialised"):
        result = finetune.main([str(tmp_path / "pretrained.npz"), *shape, "--classifier",
                                "token", "--posemb", "learned", "--image-size", "48",
                                "--folder", str(tmp_path / "images"), "--eval-folder",
                                str(tmp_path / "images"), "--epochs", "1", "--batch-size", "4",
                                "--grad-accum", "2", "--ema", "0.99",
                                "--run-dir", str(tmp_path / "run")])
    assert result["epochs"] == 1
    assert_starts_from(tmp_path / "run" / "model.keras", params)
    printed = capsys.readouterr().out
    assert "resampled Transformer/posembed_input/pos_embedding: grid 4x4 -> 6x6" in printed
    assert "zero-initialised (new head)" in printed
    with zipfile.ZipFile(tmp_path / "run" / "model.keras") as saved:  # --grad-accum, --ema
        optimizer = json.loads(saved.read("config.json"))["compile_config"]["optimizer"]
    assert optimizer["config"]["gradient_accumulation_steps"] == 2
    assert optimizer["config"]["use_ema"] and optimizer["config"]["ema_momentum"] == 0.99
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert list(history) == ["0"]
    assert (tmp_path / "run" / "labels.txt").read_text().split() == ["cat", "dog"]


def test_finetune_takes_a_keras_model_to_a_higher_resolution_in_one_command(tmp_path, capsys):
    import vit_keras as vk
    from apps import finetune

    model = vk.vit(TINY, image_size=32, num_classes=2, classifier="gap", posemb="learned2d")
    model.save(tmp_path / "trained.keras")
    write_images(tmp_path / "images", 8, 48, seed=6)
    shape = TINY_FLAGS
    result = finetune.main([str(tmp_path / "trained.keras"), *shape, "--classifier", "gap",
                            "--posemb", "learned2d", "--image-size", "48", "--folder",
                            str(tmp_path / "images"), "--epochs", "1", "--batch-size", "4",
                            "--run-dir", str(tmp_path / "run")])
    assert result["epochs"] == 1
    printed = capsys.readouterr().out
    for axis in ("row", "col"):
        assert (f"resampled Transformer/posembed_input/{axis}_embedding: 4 -> 6 positions "
                "(zoom)") in printed


def test_pretrain_by_masked_patches_then_finetune_the_backbone(tmp_path):
    import json

    from apps import finetune, pretrain

    write_images(tmp_path / "images", 8, 32, seed=7)
    shape = TINY_FLAGS
    folder = ["--folder", str(tmp_path / "images")]
    result = pretrain.main([*shape, *folder, "--image-size", "32", "--epochs", "2",
                            "--batch-size", "4", "--target", "downsized",
                            "--run-dir", str(tmp_path / "pre")])
    assert result["epochs"] == 2 and result["color_channels"] == 3 and result["loss"] > 0
    assert json.loads((tmp_path / "pre" / "result.json").read_text()) == result
    tuned = finetune.main([result["backbone"], *shape, *folder, "--image-size", "48",
                           "--eval-folder", str(tmp_path / "images"), "--epochs", "1",
                           "--batch-size", "4", "--run-dir", str(tmp_path / "tuned")])
    assert tuned["epochs"] == 1
    assert_starts_from(tmp_path / "tuned" / "model.keras",
                       checkpoint_params(keras.saving.load_model(result["backbone"])))


def assert_starts_from(model_file, params):
    """The fine-tuned model's blocks moved a little from params' (a step or two of
    fine-tuning), not from a fresh initialisation (as far from them as the weights are
    large)."""
    tuned = checkpoint_params(keras.saving.load_model(model_file))
    blocks = [key for key in params if key.startswith("Transformer/encoderblock_")]
    assert blocks
    for key in blocks:
        moved = np.abs(tuned[key] - params[key]).max()
        assert moved < 0.1 * np.abs(params[key]).max(), (key, moved)


def test_pretrain_keeps_every_patch_unless_patch_dropout_is_asked_for(tmp_path, monkeypatch):
    import dataclasses

    from apps import pretrain

    # a recipe with patch dropout, which pretrain must undo (the built-in ones have none)
    monkeypatch.setitem(training.RECIPES, "fashion_mnist", dataclasses.replace(
        training.RECIPES["fashion_mnist"], patch_drop_rate=0.5))

    write_images(tmp_path / "images", 8, 32, seed=7)
    common = [*TINY_FLAGS, "--folder",
              str(tmp_path / "images"), "--image-size", "32", "--epochs", "1", "--batch-size",
              "4", "--recipe", "fashion_mnist", "--run-dir", str(tmp_path / "pre")]
    assert pretrain.main(common)["epochs"] == 1
    with pytest.raises(ValueError, match="build it with patch_drop_rate=0"):
        pretrain.main([*common, "--recipe-option", "patch_drop_rate=0.5", "--overwrite"])


@backend_independent
@pytest.mark.parametrize("app", ["train", "pretrain"])
def test_fewer_images_than_one_batch_are_refused_before_the_run_folder(tmp_path, capsys, app):
    """The pipeline drops a partial batch: 6 images in batches of 8 left model.fit no data."""
    from apps import common, pretrain, train

    images = write_images(tmp_path / "images", 3, 32, seed=5)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        common.run({"train": train.main, "pretrain": pretrain.main}[app],
                   [*TINY_FLAGS, "--folder", str(images), "--image-size", "32",
                    "--batch-size", "8", "--run-dir", str(run_dir)])
    printed = capsys.readouterr().err
    assert stopped.value.code == 2 and printed == (
        "error: fewer training images (6) than one batch (8): pass a smaller --batch-size\n")
    assert not run_dir.exists()


def test_a_run_folder_holds_one_run(tmp_path, capsys):
    import json

    from apps import common, train

    images = write_images(tmp_path / "images", 4, 32, seed=8)
    run_dir = tmp_path / "run"

    def flags(*more):
        return [*TINY_FLAGS, "--folder",
                str(images), "--image-size", "32", "--batch-size", "4", "--recipe", "finetune",
                "--jit-compile", "false", "--run-dir", str(run_dir), *more]

    # A finished 2-epoch run of these flags, as apps.train leaves it (training it would only
    # cost time): its arguments recorded the way apps.train records them, its files.
    earlier = train.build_parser().parse_args(flags("--epochs", "2"))
    train.fill_defaults(earlier)
    train.claim_run_dir(earlier, str(run_dir))
    (run_dir / "history.csv").write_text("epoch,loss\n0,0.7\n1,0.6\n")
    (run_dir / "result.json").write_text(json.dumps({"epochs": 2}))
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as stopped:  # the same command again: the run is finished
        common.run(train.main, flags("--epochs", "2"))
    printed = capsys.readouterr().err
    assert stopped.value.code == 2 and printed.count("\n") == 1, printed
    assert printed.startswith(f"error: run folder {str(run_dir)!r} holds a finished run "
                              "(result.json); pass --overwrite to start it anew")
    (run_dir / "result.json").unlink()  # as an interrupted run leaves it
    with pytest.raises(FileExistsError, match=r"holds a run with other arguments \(--epochs 2, "
                                              r"now 1; --num-layers 2, now 1\); pass --overwrite"):
        train.main(flags("--epochs", "1", "--num-layers", "1"))
    result = train.main(flags("--epochs", "1", "--num-layers", "1", "--overwrite"))
    assert result["epochs"] == 1
    printed = capsys.readouterr().out
    assert "no held-out images: the run is not evaluated (pass --eval-folder or " \
           "--validation-split N)" in printed  # a folder without --eval-folder
    assert " for 1 epoch of 2 steps (global batch 4 over 1 replica, " in printed
    written = json.loads((run_dir / "result.json").read_text())
    assert written["epochs"] == 1
    assert written["data"] == {"folder": str(images), "eval_folder": None,
                               "validation_split": None}  # no --dataset: a folder's run
    from apps import export as export_app  # which export verifies on, from that record

    source = export_app.data_source(export_app.build_parser().parse_args(
        [str(run_dir / "model.keras")]))
    assert (source["folder"], source["eval_folder"]) == (str(images), str(images))
    rows = (run_dir / "history.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["0"]  # the new run's epoch only
    assert json.loads((run_dir / "arguments.json").read_text())["num_layers"] == 1
    model = keras.saving.load_model(run_dir / "model.keras", safe_mode=True)
    assert sum(layer.name.startswith("Transformer_encoderblock_") for layer in model.layers) == 1
    assert (run_dir / "notes.txt").read_text() == "mine"  # not a run file: left alone


def test_committed_main_job_model_loads_after_importing_vit_keras_alone():
    import subprocess
    import sys

    code = ("import keras, vit_keras; "
            "m = keras.saving.load_model('docs/mainjob/model.keras', safe_mode=True); "
            "print(m.count_params())")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "191338"  # the figure docs/performance.md quotes


def test_convert_builds_a_family_with_its_options(tmp_path):
    import timm

    from apps import convert

    reference = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
        num_classes=0, reg_tokens=4, no_embed_class=True, init_values=1e-5)
    from safetensors.torch import save_file

    save_file(reference.state_dict(), tmp_path / "reg.safetensors")
    tiny = TINY_FLAGS
    flags = [str(tmp_path / "reg.safetensors"), str(tmp_path / "reg.npz"), *tiny,
             "--image-size", "32"]
    with pytest.raises(ValueError, match="the checkpoint has LayerScale .* build it with "
                                         "layer_scale="):
        convert.main(flags)
    convert.main([*flags, "--family", "dinov2_reg"])
    assert np.load(tmp_path / "reg.npz")["registers/tokens"].shape == (1, 4, 32)


@backend_independent
def test_training_from_a_releases_weights_records_and_feeds_its_convention():
    import tensorflow as tf
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from apps import train
    from vit_keras.preprocessing import input_convention

    args = train.build_parser().parse_args(
        [*TINY_FLAGS, "--variant", "Ti/16", "--image-size", "32", "--weights", "deit_in1k"])
    train.fill_defaults(args)
    model = train.model_from_arguments(args, num_classes=2)  # DeiT's weights, not yet loaded
    convention = input_convention(model)
    np.testing.assert_allclose([convention.mean, convention.std],
                               [IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD])
    pixels = np.full((1, 32, 32, 3), 200, np.uint8)
    held_out = tf.data.Dataset.from_tensor_slices((pixels, [1]))
    _, batches = train.pipelines(args, training.RECIPES["finetune"], held_out, held_out, 2, model)
    got = next(iter(batches))[0].numpy()[0, 0, 0]
    expected = (200 / 255 - np.array(IMAGENET_DEFAULT_MEAN)) / np.array(IMAGENET_DEFAULT_STD)
    np.testing.assert_allclose(got, expected, atol=1e-5)
