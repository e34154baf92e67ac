"""The token budget on the command line (--merge-tokens, --prune-tokens, --prune-blocks on
export, predict and evaluate) and in the exports: each app runs the model that
vk.merge_tokens / vk.prune_tokens make of the loaded one, and every export format of such a
model is verified against it and answers like it when read back."""

import json

import keras
import numpy as np
import pytest
from PIL import Image

import vit_keras as vk
from apps import evaluate, predict
from apps import export as export_app
from apps.common import run
from tests.conftest import TINY, backend_independent, in_tensorflow_pass, randomize
from tests.numpy_tokens import merged_counts, pruned_counts
from tests.test_apps import write_images
from tests.test_export import ROOT, quadrant_data, with_small_class_token
from vit_keras.export import FORMATS, Predictor

PATCHES = (32 // TINY["patch_size"]) ** 2  # 16 patch tokens at 32 px, plus the class token


def saved_model(folder, classifier="token"):
    """A tiny random ViT (two classes, cat and dog) saved as folder/model.keras."""
    model = randomize(vk.vit(TINY, image_size=32, num_classes=2, classifier=classifier))
    model.save(folder / "model.keras")
    (folder / "labels.txt").write_text("cat\ndog\n")
    return model, str(folder / "model.keras")


def probabilities(model, images) -> np.ndarray:
    return keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(images))))


BUDGETS = {  # flags, the model they ask for, its record in the apps' reports
    "merge": (["--merge-tokens", "2"], lambda model: vk.merge_tokens(model, 2),
              {"method": "merge_tokens", "r": [2, 2],
               "tokens_per_block": merged_counts(1 + PATCHES, 1, [2, 2])}),
    # block 0: pruning in the last block cannot change what the class token reads
    "prune": (["--prune-tokens", "0.5", "--prune-blocks", "-2"],
              lambda model: vk.prune_tokens(model, 0.5, blocks=[0]),
              {"method": "prune_tokens", "keep_rate": 0.5, "blocks": [0],
               "tokens_per_block": pruned_counts(1 + PATCHES, 1, 0.5, [0], 2)}),
}


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_predict_answers_as_the_merged_or_pruned_model(tmp_path, budget):
    flags, build, _ = BUDGETS[budget]
    model, path = saved_model(tmp_path)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    for i, image in enumerate(pixels):
        Image.fromarray(image).save(tmp_path / f"{i}.png")
    files = [str(tmp_path / f"{i}.png") for i in range(2)]
    results = predict.main([path, *files, "--top-k", "2", *flags])
    expected, plain = probabilities(build(model), pixels), probabilities(model, pixels)
    assert np.abs(expected - plain).max() > 1e-3  # the budget changes the answer
    for row, answer in zip(expected, results, strict=True):
        assert [name for name, _ in answer] == [["cat", "dog"][i] for i in np.argsort(-row)]
        np.testing.assert_allclose([p for _, p in answer], np.sort(row)[::-1], atol=1e-5)


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_evaluate_scores_the_merged_or_pruned_model_and_records_its_budget(tmp_path, budget):
    flags, build, record = BUDGETS[budget]
    model, path = saved_model(tmp_path)
    images = write_images(tmp_path / "images", 3, 32, seed=5)
    report = evaluate.main([path, "--folder", str(images), "--out", str(tmp_path / "out"),
                            *flags])
    reduced = build(model)
    expected = np.zeros((2, 2), int)  # rows: the true class, columns: the model's answer
    for label, name in enumerate(("cat", "dog")):
        pixels = np.stack([np.asarray(Image.open(file))
                           for file in sorted((images / name).iterdir())])
        for answer in probabilities(reduced, pixels).argmax(-1):
            expected[label, answer] += 1
    assert report["confusion_matrix"] == expected.tolist()
    written = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert written["token_budget"] == report["token_budget"] == record


def app_call(app: str, model: str, flags: list[str]) -> tuple:
    """The app's module and its arguments: predict also takes an image."""
    module = {"export": export_app, "predict": predict, "evaluate": evaluate}[app]
    return module, [model, *(["a.png"] if app == "predict" else []), *flags]


@backend_independent
@pytest.mark.parametrize("app", ["export", "predict", "evaluate"])
@pytest.mark.parametrize("flags, message", [
    (["--merge-tokens", "-1"], "argument --merge-tokens: expected a whole number of at least 0, "
                               "got '-1'"),
    (["--merge-tokens", "two"], "argument --merge-tokens: expected a whole number of at least "
                                "0, got 'two'"),
    (["--prune-tokens", "0"], "argument --prune-tokens: expected a share of the tokens in "
                              "(0, 1], got '0'"),
    (["--prune-tokens", "1.5"], "argument --prune-tokens: expected a share of the tokens in "
                                "(0, 1], got '1.5'"),
    (["--prune-tokens", "most"], "argument --prune-tokens: expected a share of the tokens in "
                                 "(0, 1], got 'most'"),
    (["--merge-tokens", "2", "--prune-tokens", "0.5"], "argument --prune-tokens: not allowed "
                                                       "with argument --merge-tokens"),
    (["--prune-blocks", "one"], "argument --prune-blocks: invalid int value: 'one'"),
])
def test_bad_token_flags_are_refused_in_one_line(app, flags, message, capsys):
    module, argv = app_call(app, "model.keras", flags)
    with pytest.raises(SystemExit) as exit:
        run(module.main, argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {message}; --help lists the flags" in err


@backend_independent
@pytest.mark.parametrize("app", ["export", "predict", "evaluate"])
def test_prune_blocks_without_prune_tokens_is_refused_before_loading(tmp_path, app, capsys):
    module, argv = app_call(app, str(tmp_path / "missing.keras"), ["--prune-blocks", "0"])
    with pytest.raises(SystemExit) as exit:
        run(module.main, argv)
    assert exit.value.code == 2
    assert capsys.readouterr().err == ("error: --prune-blocks chooses where --prune-tokens "
                                       "prunes: give --prune-tokens KEEP too\n")


@pytest.mark.parametrize("app", ["predict", "evaluate"])
@pytest.mark.parametrize("classifier, flags, message", [
    ("token", ["--prune-tokens", "0.5", "--prune-blocks", "2"],
     "block index 2 is out of range for a model of 2 blocks: expected -2 to 1"),
    ("gap", ["--prune-tokens", "0.5"], "prune_tokens ranks the patches by the class token's "
                                       "attention: model 'vit_d32_l2_p8' has no class token"),
])
def test_a_budget_the_model_cannot_take_is_refused_in_one_line(tmp_path, app, classifier,
                                                               flags, message, capsys):
    _, path = saved_model(tmp_path, classifier)
    write_images(tmp_path / "images", 1, 32, seed=1)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    module, argv = app_call(app, path, flags)
    argv = [str(tmp_path / "a.png") if arg == "a.png" else arg for arg in argv]
    if app == "evaluate":
        argv += ["--folder", str(tmp_path / "images"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit:
        run(module.main, argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {message}")


@backend_independent
def test_predict_refuses_a_budget_for_an_export(tmp_path, capsys):
    (tmp_path / "model_int8.tflite").write_bytes(b"")  # refused before it is read
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    with pytest.raises(ValueError, match=r"a token budget applies to a \.keras model or a "
                                         r"release, not to the export '.*model_int8\.tflite': "
                                         r"export the \.keras model with it"):
        predict.main([str(tmp_path / "model_int8.tflite"), str(tmp_path / "a.png"),
                      "--merge-tokens", "2"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model with a class token trained on the quadrant task under TensorFlow, saved
    in a run folder with its labels and a held-out folder of PNGs, and those images."""
    folder = tmp_path_factory.mktemp("run")
    keras.utils.set_random_seed(0)
    images, labels = quadrant_data(1024, 0)
    model = vk.vit(TINY, image_size=32, num_classes=4)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(vk.preprocess(images), labels, batch_size=32, epochs=8, verbose=0)
    model.save(folder / "model.keras")
    (folder / "labels.txt").write_text("top-left\ntop-right\nbottom-left\nbottom-right\n")
    test_images, test_labels = quadrant_data(150, 1)
    predicted = keras.ops.convert_to_numpy(model(vk.preprocess(test_images))).argmax(-1)
    assert (predicted == test_labels).mean() > 0.9  # a trained model, not noise
    for i, (image, label) in enumerate(zip(test_images, test_labels, strict=True)):
        (folder / "held_out" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / "held_out" / str(label) / f"{i:03d}.png")
    return folder, model, test_images


EXPORTS = {  # flags, the model they ask for, the folder's name ending, the report's record
    "merge": (["--merge-tokens", "4"], lambda model: vk.merge_tokens(model, 4), "_merge4",
              {"method": "merge_tokens", "r": [4, 4],
               "tokens_per_block": merged_counts(1 + PATCHES, 1, [4, 4])}),
    "prune": (["--prune-tokens", "0.5", "--prune-blocks", "0", "-1"],
              lambda model: vk.prune_tokens(model, 0.5, blocks=[0, 1]), "_prune0.5_blocks0-1",
              {"method": "prune_tokens", "keep_rate": 0.5, "blocks": [0, 1],
               "tokens_per_block": pruned_counts(1 + PATCHES, 1, 0.5, [0, 1], 2)}),
}


@in_tensorflow_pass
@pytest.mark.parametrize("budget", list(EXPORTS))
def test_every_format_of_a_merged_or_pruned_model_is_verified_and_answers_like_it(
        trained, budget, tmp_path, monkeypatch):
    """Every format within its tolerance of the reduced model (full-integer int8 by its top-1
    agreement: quantization may flip a near-tie in which tokens merge or stay, which moves the
    probabilities but, on a trained model, not the answer), read back here: the float files
    give the reduced model's probabilities, not the original's."""
    folder, model, images = trained
    flags, build, ending, record = EXPORTS[budget]
    monkeypatch.chdir(tmp_path)
    export_app.main([str(folder / "model.keras"), "--folder", str(folder / "held_out"),
                     "--samples", "150", "--calibration", "100", *flags])
    out = tmp_path / "savedmodels" / (folder.name + ending)
    report = json.loads((out / "export_report.json").read_text())
    assert set(report["formats"]) == set(FORMATS)
    assert all(result["passed"] for result in report["formats"].values())
    assert report["token_budget"] == record
    reduced = build(model)
    expected, plain = probabilities(reduced, images), probabilities(model, images)
    assert np.abs(expected - plain).max() > 1e-3  # the files must be the reduced model's
    for name in ("saved_model", "model_float32.tflite", "model.onnx"):
        got = Predictor(str(out / name))(images)["probabilities"]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=name)
    top1 = Predictor(str(out / "model_int8.tflite"))(images)["probabilities"].argmax(-1)
    agreement = float((top1 == expected.argmax(-1)).mean())  # recomputed, not the report's
    assert agreement >= 0.99 and agreement == report["formats"]["tflite_int8"]["top1_agreement"]
    answer = predict.main([str(out / "model_float32.tflite"),
                           str(sorted((folder / "held_out" / "0").iterdir())[0]), "--top-k", "1"])
    first = np.asarray(Image.open(sorted((folder / "held_out" / "0").iterdir())[0]))[None]
    assert answer[0][0][0] == (folder / "labels.txt").read_text().split()[
        int(probabilities(reduced, first).argmax())]


@backend_independent
def test_predict_merges_the_tokens_of_a_release(weights_server):
    from tests.test_predict_release import PHOTO, RELEASE
    from vit_keras.weights import pretrained

    root, _ = weights_server
    entry = pretrained.checkpoint("Ti/16", RELEASE)
    source = randomize(vk.vit("Ti/16", num_classes=entry.num_classes), scale=0.2)
    (root / entry.path).parent.mkdir(parents=True)
    vk.save_npz(source, root / entry.path)
    results = predict.main([RELEASE, "--variant", "Ti/16", str(PHOTO), "--top-k", "3",
                            "--merge-tokens", "8"])
    with Image.open(PHOTO) as image:
        pixels = np.asarray(image.convert("RGB").resize((224, 224), Image.BILINEAR))[None]
    expected = probabilities(vk.merge_tokens(source, 8), pixels)[0]
    # a random checkpoint's near-uniform probabilities: compared relative to their size
    assert np.abs(expected / probabilities(source, pixels)[0] - 1).max() > 1e-5
    best = np.argsort(expected)[::-1][:3]
    np.testing.assert_allclose([p for *_, p in results[0]], expected[best], rtol=1e-6)


@in_tensorflow_pass
@pytest.mark.parametrize("budget", list(EXPORTS))
def test_class_token_is_folded_in_a_merged_or_pruned_model(trained, budget, tmp_path):
    """Export folds block 0's class-token rows of a reduced model as of any ViT
    (ClassTokenFolded), the same function; so a class token far smaller than the patch tokens
    (the trained model's, shrunk 10x) survives the full-integer file, whose top-1 agrees
    with the reduced Keras model as the unreduced model's does (unfolded, 71% merged, 78%
    pruned)."""
    from vit_keras import export

    folder, _, images = trained
    model = with_small_class_token(keras.saving.load_model(folder / "model.keras"))
    reduced = EXPORTS[budget][1](model)
    assert export.ClassTokenFolded.applies_to(reduced)
    x = vk.preprocess(images[:8])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(export.ClassTokenFolded(reduced)(x)),
                               keras.ops.convert_to_numpy(reduced(x)), rtol=1e-5, atol=1e-5)
    report = export.export_all(reduced, str(tmp_path / "out"), images[:150],
                               representative=images[:100], formats=("tflite_int8",))
    assert report["formats"]["tflite_int8"]["top1_agreement"] >= 0.99


@in_tensorflow_pass
def test_full_integer_file_of_a_merged_fashion_mnist_model_runs_and_agrees(tmp_path):
    """The committed Fashion-MNIST model (49 tokens, 4 blocks) merging 12 tokens a block: its
    full-integer file runs in LiteRT, the sizes counted in integers (quantized, a size of 1
    became 0 and LiteRT's division failed), and agrees with the Keras model within 3 points
    of the unreduced model's file, on test images."""
    from vit_keras import data, export

    model = keras.saving.load_model(ROOT / "docs" / "models" / "fashion_mnist_p4.keras")
    images = np.repeat(data.load_fashion_mnist("test")[0][:300], 3, axis=-1)
    agreement = {}
    for name, subject in (("none", model), ("merged", vk.merge_tokens(model, 12))):
        report = export.export_all(subject, str(tmp_path / name), images[:200],
                                   representative=images[200:], formats=("tflite_int8",),
                                   tolerances={"tflite_int8": (None, 0.0)})
        agreement[name] = report["formats"]["tflite_int8"]["top1_agreement"]
    assert agreement["merged"] >= agreement["none"] - 0.03 and agreement["none"] >= 0.95
