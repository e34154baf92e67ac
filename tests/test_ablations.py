"""The appendix's ablation experiments (benchmarks.posemb, pooling, shape) on a few hundred
images: each trains what it says, scores what it says, and resumes instead of retraining."""

import json

import keras
import numpy as np
import pytest

from tests.conftest import backend_independent


def refuse(what):
    def call(argv):
        raise AssertionError(f"a finished run was {what}: {argv}")

    return call


def trained_model(run_dir):
    import vit_keras  # noqa: F401  (registers the layers the file names)

    return keras.saving.load_model(str(run_dir / "model.keras"))


def shuffle_patches(images, patch: int, order):
    """The images with their patch x patch tiles rearranged: place i (row-major) takes tile
    order[i]."""
    batch, height, width, channels = images.shape
    rows, columns = height // patch, width // patch
    tiles = images.reshape(batch, rows, patch, columns, patch, channels).transpose(
        0, 1, 3, 2, 4, 5).reshape(batch, rows * columns, patch, patch, channels)[:, order]
    return tiles.reshape(batch, rows, columns, patch, patch, channels).transpose(
        0, 1, 3, 2, 4, 5).reshape(images.shape)


def moved_patches_change(model) -> float:
    """How far the model's logits move, relative to their largest, when the images' patches
    change places: a ViT without position embeddings pooled by average cannot tell (its tokens
    are a set, so only float rounding moves them), one with relative position embeddings reads
    each pair's offset in its attention logits."""
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (4, *model.input.shape[1:])).astype("float32")
    patch = model.get_layer("embedding").patch_size
    grid = (images.shape[1] // patch) * (images.shape[2] // patch)
    shuffled = shuffle_patches(images, patch, rng.permutation(grid))
    logits, moved = (model.predict(x, verbose=0) for x in (images, shuffled))
    return float(np.abs(moved - logits).max() / np.abs(logits).max())


@backend_independent
def test_posemb_trains_each_kind_with_its_seed_and_probes_its_own_model(tmp_path, monkeypatch):
    from apps import train
    from benchmarks import posemb

    flags = ["--kinds", "none", "relative", "--seeds", "1", "--epochs", "1",
             "--limit", "256", "--out", str(tmp_path)]
    report = posemb.main([*flags, "--json", str(tmp_path / "posemb.json")])
    assert json.loads((tmp_path / "posemb.json").read_text()) == report
    assert list(report["runs"]) == ["none", "relative"]
    for kind, runs in report["runs"].items():
        assert [r["seed"] for r in runs] == [1]
        model = trained_model(tmp_path / f"{kind}_seed1")
        assert model.get_layer("Transformer_posembed_input").get_config()["kind"] == kind
        arguments = json.loads((tmp_path / f"{kind}_seed1" / "arguments.json").read_text())
        assert arguments["posemb"] == kind and arguments["seed"] == 1
        assert "patch_drop_rate=0" in arguments["recipe_option"]  # relative refuses dropout
        if kind == "none":  # float32 rounding alone: about 1e-7
            assert moved_patches_change(model) < 1e-5
        else:  # a relative model whose bias were dropped would not tell either
            assert moved_patches_change(model) > 1e-4
    five_shot = [r["five_shot"] for runs in report["runs"].values() for r in runs]
    assert len(set(five_shot)) == 2  # each probe read its own model
    assert min(five_shot) > 0.15  # above chance (0.1) after an epoch on 256 images

    monkeypatch.setattr(train, "main", refuse("trained again"))
    assert posemb.main(flags)["runs"] == report["runs"]  # resumed from the runs' files
    with pytest.raises(FileExistsError, match="other arguments.*--epochs 1, now 2"):
        posemb.main([*flags, "--epochs", "2"])  # another run's result is never taken


@backend_independent
def test_pooling_chooses_the_rate_on_validation_and_scores_only_the_chosen_model(tmp_path,
                                                                                  monkeypatch):
    import vit_keras as vk
    from apps import evaluate, train
    from benchmarks import pooling
    from vit_keras import data

    flags = ["--classifiers", "token", "--learning-rates", "1e-3", "1e-2", "--epochs", "1",
             "--limit", "384", "--validation-split", "128", "--out", str(tmp_path)]
    report = pooling.main(flags)
    images, labels = data.load_fashion_mnist("test")
    inputs = vk.preprocess(np.repeat(images, 3, axis=-1))
    for classifier, runs in report["runs"].items():
        best = max(runs, key=lambda run: run["validation_accuracy"])
        chosen = report["chosen_on_validation"][classifier]
        assert chosen["learning_rate"] == best["learning_rate"]
        model = keras.saving.load_model(best["model"])
        has_class_token = any(layer.name == "cls" for layer in model.layers)
        assert has_class_token == (classifier == "token")
        predicted = np.argmax(model.predict(inputs, batch_size=1000, verbose=0), axis=-1)
        assert chosen["test_accuracy"] == pytest.approx(np.mean(predicted == labels), abs=1e-4)
        for run in runs:  # trained without the last 128 images, scored on them
            result = json.loads((tmp_path / f"{classifier}_lr{run['learning_rate']:g}"
                                 / "result.json").read_text())
            assert result["data"]["validation_split"] == 128
            assert "test_accuracy" not in result
    scored = [path.parents[1].name for path in tmp_path.glob("**/evaluation.json")]
    assert scored == [f"token_lr{best['learning_rate']:g}"]  # the test split read once
    monkeypatch.setattr(train, "main", refuse("trained again"))
    monkeypatch.setattr(evaluate, "main", refuse("scored on the test split again"))
    assert pooling.main(flags) == report  # resumed from the runs' files


def macs_per_image(blocks, width, mlp, patch, image=28, channels=3, classes=10):
    """Multiply-accumulates of one forward pass of a GAP ViT, written out by hand."""
    tokens = (image // patch) ** 2
    embed = tokens * patch * patch * channels * width
    attention = 4 * tokens * width * width + 2 * tokens * tokens * width
    return embed + blocks * (attention + 2 * tokens * width * mlp) + width * classes


@backend_independent
def test_shape_costs_each_shape_about_twice_the_base():
    from benchmarks import shape

    base = macs_per_image(4, 64, 128, 4)
    expected = {"base": (base, 2), "base, twice the epochs": (base, 4),
                "deeper": (macs_per_image(8, 64, 128, 4), 2),
                "wider": (macs_per_image(4, 96, 192, 4), 2),
                "smaller patches": (macs_per_image(4, 32, 64, 2), 2)}
    plans = shape.costs(base_epochs=2)
    assert list(plans) == list(expected)
    for name, (macs, epochs) in expected.items():
        assert plans[name]["forward_mflop_per_image"] == pytest.approx(2 * macs / 1e6, abs=0.01)
        assert plans[name]["epochs"] == epochs
        assert plans[name]["tokens"] == (28 // plans[name]["shape"]["patch_size"]) ** 2
        assert plans[name]["training_cost"] == pytest.approx(macs * epochs / (base * 2),
                                                             abs=0.01)
    twice = [plans[name]["training_cost"] for name in expected if name != "base"]
    assert all(1.9 < cost < 2.2 for cost in twice), twice


@backend_independent
def test_shape_trains_the_shapes_it_names(tmp_path):
    import vit_keras as vk
    from benchmarks import shape

    report = shape.main(["--epochs", "1", "--shapes", "base", "smaller patches", "--limit",
                         "256", "--out", str(tmp_path)])
    assert list(report["runs"]) == ["base", "smaller patches"]
    for name, run in report["runs"].items():
        built = vk.vit(vk.ViTConfig(**run["shape"]), image_size=28, num_classes=10,
                       classifier="gap", posemb="sincos2d")  # the main job's
        assert run["trainable_parameters"] == built.count_params()
        assert run["epochs"] == 1
        model = trained_model(tmp_path / shape.run_folder(name))
        assert model.count_params() == built.count_params()
        assert model.get_layer("embedding").get_config()["patch_size"] == run["shape"][
            "patch_size"]
