import pytest

import vit_keras as vk
from vit_keras.configs import ViTConfig, get_config, parameter_count, variant_name


def test_official_variants_have_paper_shapes():
    assert set(vk.VARIANTS) == {"Ti/16", "S/16", "S/32", "B/16", "B/32", "B/8", "L/16",
                                "L/32", "H/14", "R+Ti/16", "R26+S/32", "R26+B/32", "R50+B/16",
                                "R50+L/32"}
    b16 = vk.VARIANTS["B/16"]
    assert (b16.hidden_size, b16.num_layers, b16.mlp_dim, b16.num_heads, b16.patch_size) == (
        768, 12, 3072, 12, 16)
    h14 = vk.VARIANTS["H/14"]
    assert (h14.hidden_size, h14.num_layers, h14.mlp_dim, h14.num_heads) == (1280, 32, 5120, 16)


def test_parser_accepts_any_patch_and_custom_shapes():
    assert get_config("L/14") == ViTConfig(1024, 24, 16, 4096, 14)
    custom = get_config(dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64,
                             patch_size=8))
    assert custom.head_dim == 8


@pytest.mark.parametrize("name", ["X/16", "B16", "B/", "B/0", "b/16", 16])
def test_unknown_variant_lists_known_ones(name):
    with pytest.raises(ValueError, match=r"unknown variant .*known variants: Ti/16, S/16"):
        get_config(name)


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match="num_heads 5 does not divide hidden_size 32"):
        ViTConfig(hidden_size=32, num_layers=2, num_heads=5, mlp_dim=64, patch_size=8)


def test_hybrids_follow_the_official_configs():
    r50 = vk.VARIANTS["R50+B/16"]
    assert (r50.hidden_size, r50.resnet_layers, r50.patch_size, r50.cell_size) == (
        768, (3, 4, 9), 1, 16)
    assert vk.VARIANTS["R50+L/32"].resnet_layers == (3, 4, 6, 3)
    assert vk.VARIANTS["R50+L/32"].cell_size == 32
    r_ti = get_config("R+Ti/16")
    assert (r_ti.resnet_layers, r_ti.patch_size, r_ti.stem_stride) == ((), 8, 4)
    assert get_config(dict(hidden_size=32, num_layers=1, num_heads=4, mlp_dim=64, patch_size=1,
                           resnet_layers=[1, 1])).resnet_layers == (1, 1)


@pytest.mark.parametrize("layers", [(0,), "34", (1, 2.0)])
def test_bad_resnet_layers_are_refused(layers):
    with pytest.raises(ValueError, match="resnet_layers must be None or a tuple of positive"):
        ViTConfig(32, 1, 4, 64, 1, resnet_layers=layers)


def test_parameter_count_from_the_shape_is_the_official_count():
    from tests.test_models import HYBRID_PARAMS, OFFICIAL_PARAMS  # vit-facts.md, section 2

    for variant, count in {**OFFICIAL_PARAMS, **HYBRID_PARAMS}.items():
        assert parameter_count(variant) == count, variant


@pytest.mark.parametrize("config, image_size, num_classes", [
    (dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8), (32, 48), 3),
    (dict(hidden_size=32, num_layers=1, num_heads=2, mlp_dim=48, patch_size=1,
          resnet_layers=(1, 2), resnet_width=32), 32, 5),
    (dict(hidden_size=32, num_layers=1, num_heads=2, mlp_dim=48, patch_size=2,
          resnet_layers=(), resnet_width=32), 32, 2),
])
def test_parameter_count_is_what_a_built_model_counts(config, image_size, num_classes):
    built = vk.vit(config, image_size=image_size, num_classes=num_classes)
    assert parameter_count(config, image_size, num_classes) == built.count_params()


def test_parameter_count_refuses_an_image_of_partial_cells():
    with pytest.raises(ValueError, match="image_size 100x100 is not divisible by the 16-pixel "
                                         "cells of 'B/16'"):
        parameter_count("B/16", 100)


def test_variant_name_is_the_name_that_parses_to_a_shape():
    for name in ("Ti/16", "B/14", "R50+B/16", "R+Ti/16"):
        assert variant_name(get_config(name)) == name
    assert variant_name(ViTConfig(192, 12, 3, 768, 16, resnet_layers=(3,))) is None
    assert variant_name(ViTConfig(192, 12, 4, 768, 16)) is None  # Ti's width, not its heads
