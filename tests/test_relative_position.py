"""posemb="relative", the paper's 1-D relative attention (Appendix D.4): logits and attention
probabilities against the NumPy reference, both attention paths and kernels, a new grid,
the .keras round trip, and the errors that name it."""

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests import numpy_vit
from tests.conftest import TINY, backend_independent, checkpoint_params, images, randomize
from vit_keras.layers import MultiHeadDotProductAttention, TransformerBlock

ATTENTION = "MultiHeadDotProductAttention_1/"


def numpy_of(x):
    return keras.ops.convert_to_numpy(x)


def relative_model(**kwargs):
    kwargs = {"image_size": 32, "num_classes": 5, "posemb": "relative", **kwargs}
    return randomize(vk.vit(TINY, **kwargs))


def reference(model, x, classifier="token"):
    return numpy_vit.forward(checkpoint_params(model), x, patch=8, heads=4, layers=2,
                             classifier=classifier,
                             relative_prefix=1 if classifier == "token" else 0)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_logits_are_the_numpy_forward_pass_with_the_relative_bias(classifier):
    model = relative_model(classifier=classifier)
    attention = model.get_layer("Transformer_encoderblock_0").attention
    assert tuple(attention.relative_embedding.shape) == (2 * 16 - 1, 4, 8)
    assert hasattr(attention, "prefix_relative_embedding") == (classifier == "token")
    assert model.get_layer("Transformer_posembed_input").embedding() is None
    x = images()
    np.testing.assert_allclose(numpy_of(model(x)), reference(model, x, classifier), atol=2e-5)


def random_block(num_prefix, attention_kernel="auto", patches=16):
    block = TransformerBlock(4, 64, attention_kernel=attention_kernel, position_bias="relative",
                             num_patches=patches, num_prefix_tokens=num_prefix,
                             name="Transformer_encoderblock_0")
    block.build((None, None, 32))
    return randomize(block, seed=num_prefix)


def block_params(block):
    return {k.split("/", 2)[2]: v for k, v in checkpoint_params(block).items()}


@pytest.mark.parametrize("attention_kernel", ["fused", "einsum"])
@pytest.mark.parametrize("num_prefix", [0, 1, 3])
def test_both_paths_and_kernels_add_the_bias_and_the_probabilities_include_it(
        num_prefix, attention_kernel):
    """The direct path (the fused kernel: PyTorch's attn_mask, Keras' bias elsewhere) and the
    general one (return_attention_scores) against the NumPy block, any prefix tokens
    (class, distillation, registers) sharing the three prefix offsets."""
    block = random_block(num_prefix, attention_kernel)
    tokens = np.random.default_rng(3).normal(size=(2, num_prefix + 16, 32)).astype("float32")
    expected, expected_probs = numpy_vit.encoder_block(tokens, block_params(block), 4, True,
                                                       relative_prefix=num_prefix)
    assert block.attention.takes_direct_path()
    direct = numpy_of(block(tokens))
    general, probs = map(numpy_of, block(tokens, return_attention_scores=True))
    np.testing.assert_allclose(direct, expected, atol=2e-5)
    np.testing.assert_allclose(general, expected, atol=2e-5)
    np.testing.assert_allclose(probs, expected_probs, atol=1e-6)
    # The bias matters: without it the NumPy block computes something else.
    plain, _ = numpy_vit.encoder_block(tokens, block_params(block), 4, True)
    assert np.abs(plain - expected).max() > 1e-2


def test_another_grid_reads_the_offsets_interpolated(tmp_path):
    """A dynamic-size model at its built size is the fixed one; at 48x40 (30 patches) and
    8x8 (one patch) its offsets are the table read at o (N - 1) / (N' - 1), linearly; a
    fixed-size model loaded from the file at 48x40 computes the same."""
    dynamic = relative_model(dynamic_image_size=True)
    fixed = vk.vit(TINY, image_size=32, num_classes=5, posemb="relative")
    fixed.set_weights(dynamic.get_weights())
    x = images()
    np.testing.assert_allclose(numpy_of(dynamic(x)), numpy_of(fixed(x)), atol=1e-6)
    for height, width in [(48, 40), (8, 8)]:
        x = images(height=height, width=width)
        np.testing.assert_allclose(numpy_of(dynamic(x)), reference(dynamic, x), atol=2e-5)
    other = vk.vit(TINY, image_size=(48, 40), num_classes=5, posemb="relative")
    vk.save_npz(dynamic, tmp_path / "relative.npz")
    report = vk.load_weights(other, str(tmp_path / "relative.npz"))
    assert sorted(report.resampled) == [
        f"Transformer/encoderblock_{i}/{ATTENTION}relative_embedding" for i in range(2)]
    x = images(height=48, width=40)
    np.testing.assert_allclose(numpy_of(other(x)), numpy_of(dynamic(x)), atol=1e-5)


def test_a_graph_of_unknown_image_size_fits_the_offsets_as_it_runs():
    """The exported SavedModel's case: height, width and so the patch count are tensors."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("unknown shapes are traced by TensorFlow's tf.function only")
    import tensorflow as tf

    model = relative_model(dynamic_image_size=True)
    call = tf.function(model, input_signature=[tf.TensorSpec((None, None, None, 3))])
    for height, width in [(32, 32), (48, 40)]:
        x = images(height=height, width=width)
        np.testing.assert_allclose(numpy_of(call(x)), numpy_of(model(x)), atol=1e-6)


def test_keras_file_round_trips_in_safe_mode_with_identical_logits(tmp_path):
    model = relative_model(dynamic_image_size=True, num_register_tokens=1)
    model.save(tmp_path / "relative.keras")
    loaded = keras.saving.load_model(tmp_path / "relative.keras", safe_mode=True)
    for height, width in [(32, 32), (24, 40)]:
        x = images(height=height, width=width)
        np.testing.assert_array_equal(numpy_of(loaded(x)), numpy_of(model(x)))


@backend_independent
def test_errors_name_the_kind():
    with pytest.raises(ValueError, match="posemb='relative' reads each token's place in the "
                                         "patch sequence, which patch dropout takes away"):
        vk.vit(TINY, image_size=32, posemb="relative", patch_drop_rate=0.5)
    with pytest.raises(ValueError, match="position embedding 'learned' adds a table to the "
                                         "tokens, not a bias to the attention logits: "
                                         "expected one of relative"):
        MultiHeadDotProductAttention(4, position_bias="learned", num_patches=16)
    with pytest.raises(ValueError, match="position_bias='relative' needs num_patches"):
        MultiHeadDotProductAttention(4, position_bias="relative")


@backend_independent
def test_checkpoints_without_relative_tables_are_refused_in_one_line(tmp_path):
    """Strict loading: an official-layout .npz or a timm state dict has no offset tables for
    a relative model, and a relative model's file has no place in another model."""
    import timm

    relative = vk.vit(TINY, image_size=32, num_classes=5, posemb="relative")
    learned = vk.vit(TINY, image_size=32, num_classes=5)
    vk.save_npz(learned, tmp_path / "learned.npz")
    vk.save_npz(relative, tmp_path / "relative.npz")
    state = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
        num_classes=5).state_dict()
    model_has = (r"the model has relative position embeddings \('Transformer/encoderblock_0/"
                 r"MultiHeadDotProductAttention_1/relative_embedding'\), the checkpoint has "
                 r"not; build it with the checkpoint's posemb \('learned' for the official")
    for load in (lambda: vk.load_npz(relative, tmp_path / "learned.npz"),
                 lambda: vk.load_pytorch_weights(relative, state)):
        with pytest.raises(ValueError, match=model_has) as error:
            load()
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="the checkpoint has relative position embeddings .*"
                                         "build it with posemb='relative'"):
        vk.load_npz(learned, tmp_path / "relative.npz")
