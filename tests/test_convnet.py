"""vk.resnet.classifier, the hybrids' ResNet as a classifier (a convnet teacher), and
`vit-keras train --convnet`."""

import json

import keras
import numpy as np
import pytest

from tests import numpy_vit
from tests.conftest import backend_independent, checkpoint_params, images, randomize
from vit_keras import resnet


def bit_parameters(stage_units, width, channels, num_classes):
    """The parameters of BiT's ResNet v1 counted from its definition: a 7x7 root convolution
    without bias and its GroupNorm (scale, bias); per bottleneck unit of f features, 1x1 in ->
    f, 3x3 f -> f, 1x1 f -> 4f, each with a GroupNorm, plus a 1x1 projection with its
    GroupNorm where the input is not 4f wide or the unit strides; a Dense head with bias."""
    count = 7 * 7 * channels * width + 2 * width
    inputs = width
    for stage, units in enumerate(stage_units):
        f = width * 2**stage
        for unit in range(units):
            count += inputs * f + 2 * f + 9 * f * f + 2 * f + f * 4 * f + 2 * 4 * f
            if inputs != 4 * f or (stage > 0 and unit == 0):
                count += inputs * 4 * f + 2 * 4 * f
            inputs = 4 * f
    return count + inputs * num_classes + num_classes


@pytest.mark.parametrize("stage_units, image_size, side", [
    ((), 32, 8), ((1,), 32, 8), ((1, 2), (32, 48), (4, 6)), ((2, 1, 1), 40, 3)])
def test_classifier_has_bits_parameters_and_map_size(stage_units, image_size, side):
    model = resnet.classifier(image_size, 7, stage_units=stage_units, width=32)
    assert model.count_params() == bit_parameters(stage_units, 32, 3, 7)
    # the root quarters the images (SAME: rounded up), each stage after the first halves them
    rows, cols = side if isinstance(side, tuple) else (side, side)
    stem = model.get_layer("pool").input
    assert tuple(stem.shape[1:3]) == (rows, cols)
    assert stem.shape[-1] == (32 if not stage_units else 4 * 32 * 2 ** (len(stage_units) - 1))
    assert tuple(model.output.shape) == (None, 7)


# torchvision's ResNet-50 (the weights' "num_params"): the same layer shapes, bias-free
# convolutions with a norm's scale and bias after each and a projection opening each stage.
RESNET50_PARAMETERS = 25_557_032


def test_resnet50_default_has_torchvisions_resnet50_count():
    model = resnet.classifier(224, 1000)
    assert model.name == "resnet_3_4_6_3_w64"
    assert model.count_params() == RESNET50_PARAMETERS
    assert bit_parameters((3, 4, 6, 3), 64, 3, 1000) == RESNET50_PARAMETERS  # the counter too


def test_classifier_logits_are_the_numpy_resnet_averaged_then_the_head():
    stages = (1, 2)
    model = randomize(resnet.classifier(32, 5, stage_units=stages, width=32), seed=3)
    params = checkpoint_params(model)
    x = images(batch=2, height=32, width=32)
    features = numpy_vit.resnet(params, x.astype("float64"), stages, 32)
    expected = features.mean(axis=(1, 2)) @ params["head/kernel"] + params["head/bias"]
    got = keras.ops.convert_to_numpy(model(x))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)


def test_a_new_classifier_predicts_uniformly_its_head_at_zero():
    """BiT's head starts at zero, so every class starts at the same logit."""
    model = resnet.classifier(32, 4, stage_units=(1,), width=32)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images())),
                                  np.zeros((2, 4), "float32"))


def test_keras_file_reloads_in_safe_mode_with_identical_logits(tmp_path):
    model = randomize(resnet.classifier(32, 3, stage_units=(1, 1), width=32), seed=1)
    model.save(tmp_path / "convnet.keras")
    loaded = keras.saving.load_model(tmp_path / "convnet.keras", safe_mode=True)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]
    x = images()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)),
                                  keras.ops.convert_to_numpy(model(x)))


def test_mixed_precision_keeps_the_logits_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = resnet.classifier(32, 3, stage_units=(1,), width=32)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.get_layer("conv_root").compute_dtype == "bfloat16"
    assert keras.backend.standardize_dtype(model(images()).dtype) == "float32"


@pytest.mark.parametrize("kwargs, message", [
    (dict(stage_units=(1, 0)), r"stage_units: expected a positive number of units per stage, "
                               r"got \(1, 0\)"),
    (dict(width=48), r"width: expected a multiple of 32 \(GroupNorm's groups\), got 48"),
    (dict(num_classes=0), "num_classes: expected at least 1, got 0"),
])
def test_classifier_refuses_shapes_it_cannot_build(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resnet.classifier(32, **{"num_classes": 3, "stage_units": (1,), "width": 32, **kwargs})


# --- vit-keras train --convnet --------------------------------------------------------------

CONVNET_FLAGS = ["--convnet", "--resnet-layers", "1", "--image-size", "32", "--limit", "64",
                 "--eval-limit", "64", "--epochs", "1", "--batch-size", "32"]


@backend_independent
def test_train_convnet_saves_a_resnet_that_evaluate_and_predict_take(tmp_path, capsys):
    from apps import evaluate, predict, train

    run_dir = tmp_path / "run"
    result = train.main([*CONVNET_FLAGS, "--run-dir", str(run_dir)])
    model = keras.saving.load_model(run_dir / "model.keras", safe_mode=True)
    assert model.name == "resnet_1_w32"
    assert result["trainable_parameters"] == bit_parameters((1,), 32, 3, 10)
    assert 0 <= result["test_accuracy"] <= 1
    with open(run_dir / "arguments.json") as file:
        assert json.load(file)["convnet"] is True
    report = evaluate.main([str(run_dir / "model.keras"), "--limit", "64",
                            "--out", str(tmp_path / "eval")])
    assert report["images"] == 64
    picture = tmp_path / "shoe.png"
    keras.utils.save_img(picture, np.zeros((28, 28, 3), "uint8"))
    capsys.readouterr()
    [best] = predict.main([str(run_dir / "model.keras"), str(picture), "--top-k", "2"])
    assert len(best) == 2 and sum(p for _, p in best) <= 1.0 + 1e-6


@backend_independent
@pytest.mark.parametrize("flags, message", [
    (["--hidden-size", "64", "--posemb", "learned"],
     "--convnet trains a ResNet, which has no use for --hidden-size, --posemb: leave them out"),
    (["--lora-rank", "4"], "--convnet trains a ResNet, which has no use for --lora-rank: leave "
                           "it out"),
    (["--resnet-layers", "none"], "--convnet trains a ResNet, not --resnet-layers none"),
    (["--distillation-token"], "--convnet trains a ResNet, which has no use for "
                               "--distillation-token: leave it out"),
])
def test_train_convnet_refuses_the_vits_flags_in_one_line(tmp_path, flags, message):
    from apps import train

    argv = ["--convnet", *flags, "--run-dir", str(tmp_path / "run"), "--limit", "64"]
    with pytest.raises(ValueError, match=message):
        train.main(argv)
    assert not (tmp_path / "run").exists()


@backend_independent
def test_train_convnet_defaults_to_the_main_jobs_images_and_a_three_stage_resnet():
    from apps import train

    args = train.build_parser().parse_args(["--convnet"])
    train.fill_defaults(args)
    assert (args.resnet_layers, args.resnet_width, args.image_size) == ((2, 2, 2), 32, 32)
    assert (args.recipe, args.epochs) == ("fashion_mnist", train.MAIN_JOB_EPOCHS)
    assert args.hidden_size is None and args.classifier is None
