"""keras-hub's ViT into vk.vit: parity with keras-hub's own forward, on every backend."""

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, images, randomize

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install --no-deps keras-hub==0.32.0 "
                        "(the test extra brings its requirements; scripts/setup.sh does both)")


def hub_backbone(**options):
    return keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=4, hidden_dim=32,
        mlp_dim=64, **options)


def hub_classifier(intermediate_dim=None):
    classifier = keras_hub.models.ViTImageClassifier(
        backbone=hub_backbone(), num_classes=7, intermediate_dim=intermediate_dim)
    return randomize(classifier, seed=4)


def ours(**options):
    return vk.vit(TINY, image_size=32, num_classes=7, approximate_gelu=False, **options)


def numpy_of(model, x):
    return keras.ops.convert_to_numpy(model(x))


@pytest.mark.parametrize("intermediate_dim", [None, 16])
def test_image_classifier_loads_and_matches_keras_hub(intermediate_dim):
    classifier = hub_classifier(intermediate_dim)
    model = ours(representation_size=intermediate_dim)
    report = vk.load_keras_hub(model, classifier)
    assert report.layout == "keras-hub ViT" and report.unused == []
    np.testing.assert_allclose(numpy_of(model, images()), numpy_of(classifier, images()),
                               atol=1e-5)


def test_backbone_gives_the_class_token_features():
    backbone = randomize(hub_backbone(), seed=5)
    model = ours(include_top=False)
    vk.load_keras_hub(model, backbone)
    expected = numpy_of(backbone, images())[:, 0]
    np.testing.assert_allclose(numpy_of(model, images()), expected, atol=1e-5)


def test_preset_directory_loads_by_path(tmp_path):
    classifier = hub_classifier()
    classifier.save_to_preset(str(tmp_path / "preset"))
    model = ours(weights=str(tmp_path / "preset"))
    np.testing.assert_allclose(numpy_of(model, images()), numpy_of(classifier, images()),
                               atol=1e-5)


def test_options_vk_vit_lacks_are_refused_by_name():
    backbone = hub_backbone(use_mlp_bias=False)
    with pytest.raises(ValueError, match=r"the keras-hub ViT has an MLP without biases "
                                         r"\(use_mlp_bias=False\), which vk.vit does not build"):
        vk.load_keras_hub(ours(include_top=False), backbone)


def test_a_model_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="checkpoint has 2 encoder blocks, the model has 1"):
        vk.load_keras_hub(vk.vit({**TINY, "num_layers": 1}, image_size=32, include_top=False),
                          hub_backbone())
