import functools
import re
import warnings

import keras
import numpy as np
import pytest
import scipy.ndimage
import timm
import torch

import vit_keras as vk
from tests import numpy_vit, official_layout
from tests.conftest import TINY, images, randomize, write_release_file
from vit_keras.weights import npz, pretrained, resample

POSEMB = "Transformer/posembed_input/pos_embedding"


def logits(model, x):
    return keras.ops.convert_to_numpy(model(x))


def timm_vit(image_size=32, classes=7, gap=False, approximate=True, **kwargs):
    act = functools.partial(torch.nn.GELU, approximate="tanh" if approximate else "none")
    # fc_norm=False: the official gap model normalises before pooling.
    options = {"global_pool": "avg" if gap else "token", "class_token": not gap,
               "fc_norm": False, **kwargs}
    options.setdefault("act_layer", act)
    return timm.models.vision_transformer.VisionTransformer(
        img_size=image_size, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
        num_classes=classes, **options).eval()


def timm_forward(model, x, **kwargs):
    with torch.no_grad():
        return model(torch.from_numpy(x).permute(0, 3, 1, 2), **kwargs).numpy()


def timm_state(seed=0, **options):
    reference = randomize_torch(timm_vit(approximate=False, **options), seed)
    return reference, {k: v.numpy() for k, v in reference.state_dict().items()}


def exact_tiny(**kwargs):
    return vk.vit(TINY, image_size=32, num_classes=7, approximate_gelu=False, **kwargs)


def write(path, params):
    np.savez(path, **params)
    return str(path)


@pytest.mark.parity
@pytest.mark.parametrize("gap", [False, True])
def test_official_npz_matches_timm_loader(tmp_path, gap):
    path = write(tmp_path / "c.npz", official_layout.random_checkpoint(
        np.random.default_rng(0), cls=not gap))
    reference = timm_vit(gap=gap)
    reference.load_pretrained(path)
    model = vk.vit(TINY, image_size=32, num_classes=7, classifier="gap" if gap else "token")
    report = vk.load_npz(model, path)
    assert report.unused == [] and report.reinitialised == []
    x = images()
    np.testing.assert_allclose(logits(model, x), timm_forward(reference, x), atol=1e-4)


def test_representation_layer_matches_timm_features(tmp_path):
    # timm dropped the representation layer; its pooled features are compared, then the
    # tanh pre_logits and head are applied in NumPy from the checkpoint's own arrays.
    params = official_layout.random_checkpoint(np.random.default_rng(1), representation=16)
    path = write(tmp_path / "c.npz", params)
    reference = timm_vit(classes=0)  # no head: timm cannot place a head behind pre_logits
    reference.load_pretrained(path)
    with torch.no_grad():
        x = images()
        features = reference.forward_head(
            reference.forward_features(torch.from_numpy(x).permute(0, 3, 1, 2)),
            pre_logits=True).numpy()
    expected = np.tanh(features @ params["pre_logits/kernel"] + params["pre_logits/bias"])
    expected = expected @ params["head/kernel"] + params["head/bias"]
    model = vk.vit(TINY, image_size=32, num_classes=7, representation_size=16, weights=path)
    np.testing.assert_allclose(logits(model, x), expected, atol=1e-4)


def test_resolution_change_matches_timm(tmp_path):
    path = write(tmp_path / "c.npz", official_layout.random_checkpoint(np.random.default_rng(2)))
    reference = timm_vit(image_size=48)
    reference.load_pretrained(path)  # timm resizes with half-pixel bilinear
    model = vk.vit(TINY, image_size=48, num_classes=7)
    report = vk.load_npz(model, path, resample="bilinear")
    assert report.resampled[POSEMB] == "grid 4x4 -> 6x6 (bilinear)"
    x = images(height=48, width=48)
    np.testing.assert_allclose(logits(model, x), timm_forward(reference, x), atol=1e-4)


def official_interpolate_posembed(posemb, num_new_tokens):
    """vit_jax checkpoint.py's algorithm, written out from the facts file."""
    tok, grid = posemb[:, :1], posemb[0, 1:]
    gs_old, gs_new = int(np.sqrt(len(grid))), int(np.sqrt(num_new_tokens - 1))
    grid = grid.reshape(gs_old, gs_old, -1)
    grid = scipy.ndimage.zoom(grid, (gs_new / gs_old, gs_new / gs_old, 1), order=1)
    return np.concatenate([tok, grid.reshape(1, gs_new * gs_new, -1)], axis=1)


def test_default_resampling_is_the_official_algorithm(tmp_path):
    params = official_layout.random_checkpoint(np.random.default_rng(3), grid=(4, 4))
    path = write(tmp_path / "c.npz", params)
    model = vk.vit(TINY, image_size=56, num_classes=7, weights=path)  # 4x4 -> 7x7
    loaded = keras.ops.convert_to_numpy(
        model.get_layer("Transformer_posembed_input").pos_embedding)
    np.testing.assert_allclose(loaded, official_interpolate_posembed(params[POSEMB], 50),
                               atol=1e-6)


def test_rectangular_resampling_zooms_each_axis():
    grid = np.arange(4 * 4 * 2, dtype="float32").reshape(4, 4, 2)
    np.testing.assert_allclose(resample.resample_grid(grid, (4, 6)),
                               scipy.ndimage.zoom(grid, (1, 1.5, 1), order=1), atol=1e-6)
    half_pixel = torch.nn.functional.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=(6, 3), mode="bilinear",
        align_corners=False, antialias=False)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resample.resample_grid(grid, (6, 3), "bilinear"), half_pixel,
                               atol=1e-5)


@pytest.mark.parametrize("layout", ["linen", "scanned", "big_vision"])
def test_other_layouts_load_the_same_weights(tmp_path, layout):
    params = official_layout.random_checkpoint(np.random.default_rng(4), cls=False)
    converted = {"linen": official_layout.to_linen,
                 "scanned": lambda p: official_layout.to_scanned(p, 2),
                 "big_vision": official_layout.to_big_vision}[layout](params)
    reference = vk.vit(TINY, image_size=32, num_classes=7, classifier="gap")
    vk.load_npz(reference, write(tmp_path / "a.npz", params))
    model = vk.vit(TINY, image_size=32, num_classes=7, classifier="gap")
    report = vk.load_npz(model, write(tmp_path / "b.npz", converted))
    assert report.unused == []
    for a, b in zip(reference.weights, model.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_big_vision_token_model_gets_no_class_token_position(tmp_path):
    params = official_layout.random_checkpoint(np.random.default_rng(5))
    path = write(tmp_path / "bv.npz", official_layout.to_big_vision(params))
    model = vk.vit(TINY, image_size=32, num_classes=7, weights=path)
    table = keras.ops.convert_to_numpy(model.get_layer("Transformer_posembed_input").pos_embedding)
    np.testing.assert_array_equal(table[0, 0], 0.0)
    np.testing.assert_allclose(table[0, 1:], params[POSEMB][0, 1:])


def test_save_then_load_restores_identical_weights_and_timm_reads_it(tmp_path):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=7, representation_size=16))
    path = tmp_path / "ours.npz"
    vk.save_npz(model, path)
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        vk.save_npz(model, path)
    restored = vk.vit(TINY, image_size=32, num_classes=7, representation_size=16, weights=str(path))
    for a, b in zip(model.weights, restored.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    plain = randomize(vk.vit(TINY, image_size=32, num_classes=7))
    vk.save_npz(plain, tmp_path / "plain.npz")
    reference = timm_vit()
    reference.load_pretrained(str(tmp_path / "plain.npz"))
    np.testing.assert_allclose(logits(plain, images()), timm_forward(reference, images()),
                               atol=1e-4)


@pytest.mark.parametrize("broadcast_gn", [False, True])
def test_hybrid_checkpoint_loads_and_round_trips(tmp_path, broadcast_gn):
    stages = (1, 2)
    params = official_layout.random_checkpoint(np.random.default_rng(4), patch=1,
                                               resnet=stages, resnet_width=32)
    written = official_layout.to_broadcast_group_norm(params) if broadcast_gn else params
    assert written["block1/unit1/gn1/scale"].ndim == (4 if broadcast_gn else 1)
    path = write(tmp_path / "hybrid.npz", written)
    config = {**TINY, "patch_size": 1, "resnet_layers": stages, "resnet_width": 32}
    model = vk.vit(config, image_size=32, num_classes=7)
    report = vk.load_npz(model, path)
    assert report.unused == [] and "block2/unit2/conv3/kernel" in report.loaded
    assert ("(1, 1, 1, C) GroupNorm" in report.layout) == broadcast_gn
    x = images()
    expected = numpy_vit.forward(params, x, patch=1, heads=4, layers=2, posemb=params[POSEMB][0],
                                 resnet_stages=stages, resnet_width=32)
    np.testing.assert_allclose(logits(model, x), expected, atol=2e-4)
    vk.save_npz(model, tmp_path / "ours.npz")
    saved = npz.read_npz(tmp_path / "ours.npz")
    assert sorted(saved) == sorted(params)
    for key, value in params.items():
        np.testing.assert_array_equal(saved[key], value, err_msg=key)
    plain = official_layout.random_checkpoint(np.random.default_rng(5))
    with pytest.raises(ValueError, match="key 'conv_root/kernel' is missing from the checkpoint"):
        vk.load_npz(model, write(tmp_path / "plain.npz", plain))


def test_new_class_count_gets_zero_head_and_pre_logits_are_dropped(tmp_path):
    path = write(tmp_path / "c.npz", official_layout.random_checkpoint(
        np.random.default_rng(6), representation=16, classes=21))
    model = randomize(vk.vit(TINY, image_size=32, num_classes=5))
    with pytest.warns(UserWarning, match=r"head .* does not fit .* zero-initialised"):
        report = vk.load_npz(model, path)
    assert report.reinitialised == ["head/kernel", "head/bias"]
    assert report.dropped == ["head/bias", "head/kernel", "pre_logits/bias", "pre_logits/kernel"]
    head = model.get_layer("head")  # randomised before: both of its weights are set to zero
    assert not keras.ops.convert_to_numpy(head.kernel).any()
    assert not keras.ops.convert_to_numpy(head.bias).any()
    assert "zero-initialised (new head)" in str(report)


def test_a_head_behind_pre_logits_is_refused_on_a_model_without_them(tmp_path):
    # The paper's ImageNet-21k files: pre_logits as wide as the model, so the head fits both.
    path = write(tmp_path / "c.npz", official_layout.random_checkpoint(
        np.random.default_rng(7), representation=32, classes=21))
    model = vk.vit(TINY, image_size=32, num_classes=21)
    with pytest.raises(ValueError, match=r"head reads a pre_logits layer of width 32, the "
                                         r"model has none; build it with representation_size=32"):
        vk.load_npz(model, path)


def snapshot(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


def assert_unchanged(model, before):
    for w, b in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), b)


def corrupt(params, kind):
    params = dict(params)
    if kind == "missing":
        del params["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"]
    elif kind == "shape":
        params["Transformer/encoder_norm/scale"] = np.ones(48, "float32")
    elif kind == "layers":
        params = {k: v for k, v in params.items() if "encoderblock_1" not in k}
    return params


@pytest.mark.parametrize("kind, message", [
    ("missing", r"c\.npz: key 'Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias' is missing"),
    ("shape", r"shape mismatch for 'Transformer/encoder_norm/scale': the model expects \(32,\), "
              r"the checkpoint has \(48,\)"),
    ("layers", "checkpoint has 1 encoder blocks, the model has 2"),
])
def test_bad_checkpoints_are_refused_and_change_nothing(tmp_path, kind, message):
    params = official_layout.random_checkpoint(np.random.default_rng(7))
    path = write(tmp_path / "c.npz", corrupt(params, kind))
    model = randomize(vk.vit(TINY, image_size=32, num_classes=7))
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        vk.load_npz(model, path)
    assert_unchanged(model, before)


def test_not_an_npz_and_pickled_objects_are_refused(tmp_path):
    model = vk.vit(TINY, image_size=32, num_classes=7)
    text = tmp_path / "notes.npz"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="notes.npz' is not an .npz file"):
        vk.load_npz(model, text)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, cls=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="array 'cls' holds pickled Python objects"):
        vk.load_npz(model, pickled)


def test_unused_keys_are_reported(tmp_path):
    params = official_layout.random_checkpoint(np.random.default_rng(8))
    params["optimizer/momentum"] = np.zeros(3, "float32")
    model = vk.vit(TINY, image_size=32, num_classes=7)
    with pytest.warns(UserWarning, match=r"unused keys \['optimizer/momentum'\]"):
        report = vk.load_npz(model, write(tmp_path / "c.npz", params))
    assert report.unused == ["optimizer/momentum"]


def randomize_torch(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return module


@pytest.mark.parity
def test_timm_state_dict_import_matches_timm(tmp_path):
    from safetensors.torch import save_file

    reference = randomize_torch(timm_vit(approximate=False))
    save_file(reference.state_dict(), tmp_path / "timm.safetensors")
    path = str(tmp_path / "timm.safetensors")
    report = vk.load_pytorch_weights(exact_tiny(), path)
    assert report.unused == [] and report.layout == "timm state dict"
    model = exact_tiny(weights=path)
    np.testing.assert_allclose(logits(model, images()), timm_forward(reference, images()),
                               atol=1e-4)


# Each timm option that changes the computation, and what the refusal must name.
TIMM_REFUSALS = {
    "scale_mlp_norm": ({"scale_mlp_norm": True},
                       r"'blocks\.0\.mlp\.norm\.weight' belongs to a LayerNorm inside"),
    "scale_attn_norm": ({"scale_attn_norm": True},
                        r"'blocks\.0\.attn\.norm\.weight' belongs to a LayerNorm inside"),
    "attention_pooling": ({"global_pool": "map"},
                          r"'attn_pool\.\w+' belongs to attention pooling"),
}


@pytest.mark.parametrize("option", TIMM_REFUSALS)
def test_timm_options_the_model_lacks_are_refused_by_name(option):
    kwargs, message = TIMM_REFUSALS[option]
    _, state = timm_state(**kwargs)
    model = exact_tiny()
    before = [keras.ops.convert_to_numpy(v) for v in model.weights]
    with pytest.raises(ValueError, match=message):
        vk.load_pytorch_weights(model, state)
    for old, variable in zip(before, model.weights, strict=True):  # nothing was assigned
        np.testing.assert_array_equal(old, keras.ops.convert_to_numpy(variable))


def test_original_dino_mae_and_dinov2_files_load(tmp_path):
    # MAE's released .pth wraps the timm-layout encoder in {"model": ...}; DINOv2's hub file
    # is the timm layout with LayerScale, plus the unused masked-image-modelling mask_token.
    mae, mae_state = timm_state()
    torch.save({"model": {k: torch.from_numpy(v) for k, v in mae_state.items()}, "epoch": 799},
               tmp_path / "mae_pretrain.pth")
    # MAE's fine-tuned classifiers average the patch tokens and normalise after pooling.
    finetuned_options = {"classifier": "gap", "class_token": True, "fc_norm": True}
    finetuned, finetuned_state = timm_state(global_pool="avg", class_token=True, fc_norm=True)
    torch.save({"model": {k: torch.from_numpy(v) for k, v in finetuned_state.items()},
                "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]}},
               tmp_path / "mae_finetuned.pth")
    # DINO's released backbones (dino_vitb16_pretrain.pth): the encoder alone, no head.
    dino, dino_state = timm_state(classes=0)
    torch.save({k: torch.from_numpy(v) for k, v in dino_state.items()},
               tmp_path / "dino_pretrain.pth")
    dinov2, dinov2_state = timm_state(init_values=0.1)
    torch.save({**{k: torch.from_numpy(v) for k, v in dinov2_state.items()},
                "mask_token": torch.zeros(1, 32)}, tmp_path / "dinov2_pretrain.pth")
    # what the file holds beside the weights is reported, not read
    for name, reference, options, unused in (("mae_pretrain.pth", mae, {},
                                              ["epoch (beside 'model')"]),
                                             ("mae_finetuned.pth", finetuned,
                                              finetuned_options,
                                              ["optimizer (beside 'model')"]),
                                             ("dino_pretrain.pth", dino,
                                              {"include_top": False}, []),
                                             ("dinov2_pretrain.pth", dinov2,
                                              {"layer_scale": 1.0}, ["mask_token"])):
        model = exact_tiny(**options)
        report = vk.load_pytorch_weights(model, str(tmp_path / name))
        assert report.unused == unused
        np.testing.assert_allclose(logits(model, images()), timm_forward(reference, images()),
                                   atol=1e-5)


def test_a_class_token_is_refused_by_a_model_without_one():
    _, state = timm_state()  # token pooling, with a class token
    with pytest.raises(ValueError, match=r"has a class token, which the model "
                                         r"\(classifier='gap'\) has not"):
        vk.load_pytorch_weights(exact_tiny(classifier="gap"), state)


def deit_distilled(classes=7):
    reference = timm.models.deit.VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
        num_classes=classes).eval()
    return randomize_torch(reference, 0)


def test_deit_distilled_matches_timm_and_its_features_are_the_two_tokens_mean():
    reference = deit_distilled()
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    model = exact_tiny(distilled=True)
    report = vk.load_pytorch_weights(model, state)
    assert report.unused == [] and "head_dist/kernel" in report.loaded
    np.testing.assert_allclose(logits(model, images()), timm_forward(reference, images()),
                               atol=1e-5)
    features = exact_tiny(distilled=True, include_top=False)
    vk.load_pytorch_weights(features, state)
    with torch.no_grad():
        tokens = reference.forward_features(torch.from_numpy(images()).permute(0, 3, 1, 2))
        expected = reference.forward_head(tokens, pre_logits=True).numpy()
    np.testing.assert_allclose(logits(features, images()), expected, atol=1e-5)
    with pytest.raises(ValueError, match="the checkpoint has DeiT's distillation token "
                                         r"\('dist_token/tokens'\), the model has not; build it "
                                         "with distilled=True"):
        vk.load_pytorch_weights(exact_tiny(), state)


# timm options the model has a vk.vit() option for: (timm arguments, vk.vit arguments).
TIMM_OPTIONS = {
    "init_values": ({"init_values": 0.1}, {"layer_scale": 1.0}),
    "qkv_bias": ({"qkv_bias": False}, {"qkv_bias": False}),
    # no_embed_class (DeiT III's layout): the class token gets no position embedding
    "no_embed_class": ({"no_embed_class": True}, {}),
    "deit3": ({"init_values": 0.1, "no_embed_class": True}, {"layer_scale": 1.0}),
    "qk_norm": ({"qk_norm": True}, {"qk_norm": True}),
    "proj_bias": ({"proj_bias": False, "qkv_bias": False},
                  {"proj_bias": False, "qkv_bias": False}),
    "pre_norm": ({"pre_norm": True}, {"pre_norm": True}),
    # OpenAI's CLIP image tower as timm builds it
    "clip": ({"pre_norm": True, "act_layer": "quick_gelu",
              "norm_layer": functools.partial(torch.nn.LayerNorm, eps=1e-5)},
             {"pre_norm": True, "mlp_activation": "quick_gelu", "layer_norm_epsilon": 1e-5}),
    # DINOv2 with registers as timm lays it out: neither class token nor registers embedded
    "reg_tokens": ({"reg_tokens": 4, "no_embed_class": True, "init_values": 0.1},
                   {"num_register_tokens": 4, "layer_scale": 1.0}),
    # registers inside the position embedding: their rows fold into the tokens
    "embedded_reg_tokens": ({"reg_tokens": 2}, {"num_register_tokens": 2}),
    # MAE / BEiT fine-tuned: a class token the average leaves out, the norm after pooling
    "fc_norm": ({"global_pool": "avg", "class_token": True, "fc_norm": True},
                {"classifier": "gap", "class_token": True, "fc_norm": True}),
    "avg_with_class_token": ({"global_pool": "avg", "class_token": True},
                             {"classifier": "gap", "class_token": True}),
}


@pytest.mark.parametrize("option", TIMM_OPTIONS)
def test_timm_options_load_with_the_matching_model_and_match_timm(option, tmp_path):
    timm_options, vit_options = TIMM_OPTIONS[option]
    reference, state = timm_state(**timm_options)
    model = exact_tiny(**vit_options)
    report = vk.load_pytorch_weights(model, state)
    assert report.unused == [] and report.dropped == []
    np.testing.assert_allclose(logits(model, images()), timm_forward(reference, images()),
                               atol=1e-5)
    # the .npz and .keras files keep the option's weights
    vk.save_npz(model, tmp_path / "m.npz")
    again = exact_tiny(weights=str(tmp_path / "m.npz"), **vit_options)
    np.testing.assert_allclose(logits(again, images()), logits(model, images()), atol=1e-6)
    model.save(tmp_path / "m.keras")
    restored = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(logits(restored, images()), logits(model, images()), atol=1e-6)


@pytest.mark.parametrize(("timm_options", "vit_options", "message"), [
    ({"init_values": 0.1}, {}, "the checkpoint has LayerScale ('Transformer/encoderblock_0/"
                               "LayerScale_0/scale'), the model has not; build it with "
                               "layer_scale="),
    ({}, {"layer_scale": 1.0}, "the model has LayerScale ('Transformer/encoderblock_0/"
                               "LayerScale_0/scale'), the checkpoint has not; build it with "
                               "layer_scale=None"),
    ({"qkv_bias": False}, {}, "the model has query/key/value biases ('Transformer/"
                              "encoderblock_0/MultiHeadDotProductAttention_1/query/bias'), "
                              "the checkpoint has not; build it with qkv_bias=False"),
    ({}, {"qkv_bias": False}, "the checkpoint has query/key/value biases ('Transformer/"
                              "encoderblock_0/MultiHeadDotProductAttention_1/query/bias'), the "
                              "model has not; build it with qkv_bias=True"),
    ({"proj_bias": False}, {}, "the model has attention-output and MLP biases ('Transformer/"
                               "encoderblock_0/MultiHeadDotProductAttention_1/out/bias'), the "
                               "checkpoint has not; build it with proj_bias=False"),
    ({"qk_norm": True}, {}, "the checkpoint has query/key normalisation ('Transformer/"
                            "encoderblock_0/MultiHeadDotProductAttention_1/query_norm/scale'), "
                            "the model has not; build it with qk_norm=True"),
    ({"pre_norm": True}, {}, "the checkpoint has a LayerNorm before the blocks ('Transformer/"
                             "pre_norm/scale'), the model has not; build it with pre_norm=True"),
    ({"reg_tokens": 4, "no_embed_class": True}, {}, "the checkpoint has register tokens "
     "('registers/tokens'), the model has not; build it with num_register_tokens=<the count>"),
    ({"global_pool": "avg", "class_token": True, "fc_norm": True},
     {"classifier": "gap", "class_token": True}, "the checkpoint has a LayerNorm after pooling "
     "('fc_norm/scale'), the model has not; build it with fc_norm=True"),
    ({}, {"fc_norm": True, "class_token": True, "classifier": "gap"},
     "the model has a LayerNorm after pooling ('fc_norm/scale'), the checkpoint has not; "
     "build it with fc_norm=False"),
])
def test_a_model_without_the_checkpoints_option_is_told_which_to_set(timm_options, vit_options,
                                                                   message):
    _, state = timm_state(**timm_options)
    with pytest.raises(ValueError, match=re.escape(message)):
        vk.load_pytorch_weights(exact_tiny(**vit_options), state)


def test_unknown_keys_are_refused_and_harmless_ones_reported():
    _, state = timm_state()
    model = exact_tiny()
    with pytest.raises(ValueError, match=r"keys \['blocks\.0\.extra\.weight'\] of the timm "
                                         "state dict are not part of any model vit_keras builds"):
        vk.load_pytorch_weights(model, {**state, "blocks.0.extra.weight": np.zeros(3)})
    report = vk.load_pytorch_weights(model, {**state, "bn.num_batches_tracked": np.zeros(())})
    assert report.unused == ["bn.num_batches_tracked"]


def test_missing_timm_key_is_a_value_error_naming_it():
    _, state = timm_state()
    del state["blocks.1.norm2.bias"]
    with pytest.raises(ValueError, match=r"key 'blocks\.1\.norm2\.bias' is missing from the "
                                         r"timm state dict \(expected shape \(32,\)\)"):
        vk.load_pytorch_weights(exact_tiny(), state)


def hugging_face_images():
    return torch.from_numpy(images()).permute(0, 3, 1, 2)


@pytest.mark.parametrize("registers", [0, 2])
def test_hugging_face_dinov2_loads_and_matches_it(registers):
    import transformers

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                  image_size=32, patch_size=8, layerscale_value=0.1)
    if registers:
        reference = transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
            num_register_tokens=registers, **common))
    else:
        reference = transformers.Dinov2Model(transformers.Dinov2Config(**common))
    reference = randomize_torch(reference.eval())
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    model = exact_tiny(include_top=False, layer_scale=1.0, num_register_tokens=registers)
    report = vk.load_pytorch_weights(model, state)
    assert report.layout == "Hugging Face DINOv2 state dict"
    assert report.unused == ["mask_token"]
    with torch.no_grad():
        expected = reference(pixel_values=hugging_face_images()).pooler_output.numpy()
    np.testing.assert_allclose(logits(model, images()), expected, atol=1e-5)


def test_hugging_face_deit_with_teacher_loads_and_matches_it():
    import transformers

    reference = transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=7, hidden_act="gelu"))
    reference = randomize_torch(reference.eval())
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    model = exact_tiny(distilled=True)
    report = vk.load_pytorch_weights(model, state)
    assert report.unused == [] and report.layout == "Hugging Face ViT state dict"
    with torch.no_grad():
        expected = reference(pixel_values=hugging_face_images()).logits.numpy()
    np.testing.assert_allclose(logits(model, images()), expected, atol=1e-5)


def test_original_dinov2_file_with_registers_loads(tmp_path):
    # DINOv2's own layout: the class token's position is in pos_embed, the registers are not
    # embedded; timm folds the class row into cls_token (no_embed_class). Both load the same.
    reference, state = timm_state(reg_tokens=4, no_embed_class=True, init_values=0.1)
    class_row = np.random.default_rng(3).normal(size=(1, 1, 32)).astype("float32")
    original = {k: v for k, v in state.items() if k not in ("reg_token", "cls_token")}
    original.update(register_tokens=state["reg_token"], cls_token=state["cls_token"] - class_row,
                    pos_embed=np.concatenate([class_row, state["pos_embed"]], axis=1),
                    mask_token=np.zeros((1, 32), "float32"))
    torch.save({k: torch.from_numpy(v) for k, v in original.items()},
               tmp_path / "dinov2_vits14_reg4_pretrain.pth")
    model = exact_tiny(num_register_tokens=4, layer_scale=1.0)
    report = vk.load_pytorch_weights(model, str(tmp_path / "dinov2_vits14_reg4_pretrain.pth"))
    assert report.unused == ["mask_token"]
    np.testing.assert_allclose(logits(model, images()), timm_forward(reference, images()),
                               atol=1e-5)


def hf_config(**kwargs):
    from transformers import ViTConfig

    return ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, image_size=32, patch_size=8, **kwargs)


def test_hugging_face_classifier_import_matches_transformers(tmp_path):
    from transformers import ViTForImageClassification

    reference = randomize_torch(ViTForImageClassification(hf_config(num_labels=5)).eval(), 1)
    reference.save_pretrained(tmp_path / "hf")
    model = vk.vit(TINY, image_size=32, num_classes=5, approximate_gelu=False)
    vk.load_pytorch_weights(model, str(tmp_path / "hf" / "model.safetensors"))
    x = images()
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits.numpy()
    np.testing.assert_allclose(logits(model, x), expected, atol=1e-4)


def test_hugging_face_without_qkv_bias_loads_into_the_matching_model():
    from transformers import ViTForImageClassification

    reference = randomize_torch(
        ViTForImageClassification(hf_config(num_labels=5, qkv_bias=False)).eval(), 3)
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    with pytest.raises(ValueError, match="the checkpoint has not; build it with qkv_bias=False"):
        vk.load_pytorch_weights(vk.vit(TINY, image_size=32, num_classes=5,
                                       approximate_gelu=False), state)
    model = vk.vit(TINY, image_size=32, num_classes=5, approximate_gelu=False, qkv_bias=False)
    vk.load_pytorch_weights(model, state)
    x = images()
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits.numpy()
    np.testing.assert_allclose(logits(model, x), expected, atol=1e-5)


def test_hugging_face_pooler_is_the_representation_layer():
    from transformers import ViTModel

    reference = randomize_torch(ViTModel(hf_config()).eval(), 2)
    model = vk.vit(TINY, image_size=32, include_top=False, representation_size=32,
                   approximate_gelu=False)
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    vk.load_pytorch_weights(model, state)
    x = images()
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).pooler_output
    np.testing.assert_allclose(logits(model, x), expected.numpy(), atol=1e-4)


def test_unknown_state_dict_is_refused():
    model = vk.vit(TINY, image_size=32, num_classes=7)
    with pytest.raises(ValueError, match="neither a timm ViT .* nor a Hugging Face ViT"):
        vk.load_pytorch_weights(model, {"conv.weight": np.zeros(3)})


def test_named_checkpoint_is_fetched_once_from_its_address(weights_server):
    root, requests = weights_server
    entry = pretrained.checkpoint("Ti/16", "augreg_in21k")
    source = randomize(vk.vit("Ti/16", num_classes=entry.num_classes), scale=0.02)
    (root / "augreg").mkdir()
    vk.save_npz(source, root / entry.path)
    x = images(batch=1, height=224, width=224)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same head shape: nothing to warn about
        first = vk.vit("Ti/16", num_classes=entry.num_classes, weights="augreg_in21k")
    second = vk.vit("Ti/16", num_classes=entry.num_classes, weights="augreg_in21k")
    np.testing.assert_allclose(logits(first, x), logits(source, x), atol=1e-4)
    np.testing.assert_allclose(logits(second, x), logits(source, x), atol=1e-4)
    assert requests == ["/" + entry.path]  # the second build read the cache


@pytest.mark.parametrize(("name", "variant"), [("deit3_in1k", "S/16"), ("dino", "S/16")])
def test_later_families_load_by_name_from_timm_files_with_their_options(weights_server, name,
                                                                         variant):
    root, requests = weights_server
    _, reference = write_release_file(root, name, variant)
    release = pretrained.PRETRAINED[name]
    model = vk.vit(variant, weights=name, **release.options)
    x = images(batch=1, height=224, width=224)
    np.testing.assert_allclose(logits(model, x), timm_forward(reference, x), atol=1e-4)
    assert requests == ["/" + pretrained.checkpoint(variant, name).path]


def test_a_family_loaded_without_its_options_names_them(weights_server):
    root, _ = weights_server
    write_release_file(root, "deit3_in1k", "S/16")
    with pytest.raises(ValueError, match="the checkpoint has LayerScale .* build it with "
                                         "layer_scale="):
        vk.vit("S/16", weights="deit3_in1k")


def test_timm_family_names_point_at_timms_hub_files(monkeypatch):
    monkeypatch.delenv("VIT_KERAS_WEIGHTS_URL", raising=False)
    assert pretrained.url(pretrained.checkpoint("B/14", "dinov2")) == (
        "https://huggingface.co/timm/vit_base_patch14_dinov2.lvd142m/resolve/main/"
        "model.safetensors")
    assert pretrained.url(pretrained.checkpoint("B/16", "deit_in1k")) == (
        "https://huggingface.co/timm/deit_base_patch16_224.fb_in1k/resolve/main/"
        "model.safetensors")


def test_unknown_pretrained_names_and_variants_are_refused():
    with pytest.raises(ValueError, match=r"no 'augreg_in21k' checkpoint for variant 'H/14'"):
        vk.vit("H/14", weights="augreg_in21k")
    with pytest.raises(ValueError, match="weights 'imagenet' is neither a pre-trained name "
                                         r"\(one of augreg_in21k, augreg_in21k_ft_in1k, .*\)"):
        vk.vit(TINY, image_size=32, weights="imagenet")
    with pytest.raises(FileNotFoundError, match="'missing.npz' does not exist"):
        vk.vit(TINY, image_size=32, weights="missing.npz")


def test_a_failed_download_names_the_address_the_cache_path_and_the_mirror_setting(
        tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_KERAS_WEIGHTS_URL", "http://127.0.0.1:9/")  # nothing listens
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    entry = pretrained.checkpoint("Ti/16", "augreg_in21k")
    cached = tmp_path / "keras_home" / "models" / "vit_keras" / entry.path.replace("/", "__")
    model = vk.vit(TINY, image_size=32)
    with pytest.raises(ValueError) as failure:
        vk.load_weights(model, "augreg_in21k", variant="Ti/16")
    message = str(failure.value)
    assert "\n" not in message and failure.value.__suppress_context__
    assert f"from http://127.0.0.1:9/{entry.path} (" in message
    assert f"place that file at {cached}, or set VIT_KERAS_WEIGHTS_URL" in message
    assert not cached.exists()
    # The file placed there by hand is read, still without network.
    source = randomize(vk.vit(TINY, image_size=32))
    vk.save_npz(source, cached)
    vk.load_weights(model, "augreg_in21k", variant="Ti/16")
    x = images()
    np.testing.assert_allclose(logits(model, x), logits(source, x), atol=1e-5)


def test_hybrid_names_point_at_the_official_files(monkeypatch):
    monkeypatch.delenv("VIT_KERAS_WEIGHTS_URL", raising=False)
    base = "https://storage.googleapis.com/vit_models/"
    assert pretrained.url(pretrained.checkpoint("R50+B/16", "imagenet21k")) == (
        base + "imagenet21k/R50%2BViT-B_16.npz")
    assert pretrained.url(pretrained.checkpoint("R50+L/32", "augreg_in21k")) == (
        base + "augreg/R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1.npz")


@pytest.mark.parametrize(("timm_options", "vit_options"), [
    ({"reg_tokens": 4, "no_embed_class": True, "init_values": 0.1},
     {"num_register_tokens": 4, "layer_scale": 1.0}),
    ({"global_pool": "avg", "class_token": True, "fc_norm": True},
     {"classifier": "gap", "class_token": True, "fc_norm": True}),
])
def test_features_of_registers_and_fc_norm_models_are_timms_intermediates(timm_options,
                                                                         vit_options):
    reference, state = timm_state(**timm_options)
    model = exact_tiny(**vit_options)
    vk.load_pytorch_weights(model, state)
    extract = vk.features(model, blocks=[0, 1], prefix_tokens=True)
    ours = {k: keras.ops.convert_to_numpy(v) for k, v in extract(images()).items()}
    with torch.no_grad():
        theirs = reference.forward_intermediates(
            torch.from_numpy(images()).permute(0, 3, 1, 2), indices=[0, 1], norm=True,
            output_fmt="NCHW", return_prefix_tokens=True, intermediates_only=True)
    for index, (spatial, prefix) in enumerate(theirs):
        np.testing.assert_allclose(ours[f"block{index}"], spatial.permute(0, 2, 3, 1).numpy(),
                                   atol=1e-5)
        np.testing.assert_allclose(ours[f"block{index}_prefix"], prefix.numpy(), atol=1e-5)
