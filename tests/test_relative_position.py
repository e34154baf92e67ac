"""posemb="relative", the paper's 1-D relative attention (Appendix D.4): logits and attention
probabilities against the NumPy reference, both attention paths and kernels; on other grids
(larger, smaller, of the same count and another shape, one row) each pair's displacement read
per axis, against NumPy written from that rule (tests/numpy_vit.relative_embedding), in the
model, the loaders and .keras files moved to another size; the gradients reaching the
tables against finite differences of the NumPy model; layers saved before the grid's shape was
recorded; the .keras round trip, and the errors that name it."""

import json
import zipfile

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests import numpy_vit
from tests.conftest import TINY, backend_independent, checkpoint_params, images, randomize
from vit_keras import kernels
from vit_keras.layers import MultiHeadDotProductAttention, TransformerBlock

ATTENTION = "MultiHeadDotProductAttention_1/"
TABLE = f"Transformer/encoderblock_0/{ATTENTION}relative_embedding"
LAST_TABLE = f"Transformer/encoderblock_1/{ATTENTION}relative_embedding"
PREFIX_TABLE = f"Transformer/encoderblock_0/{ATTENTION}prefix_relative_embedding"


def numpy_of(x):
    return keras.ops.convert_to_numpy(x)


def relative_model(**kwargs):
    """A tiny relative model with random weights, large enough (scale 0.5) that how the
    offsets are read shows in the logits (the old 1-D rule moves them by 0.05 to 0.2)."""
    kwargs = {"image_size": 32, "num_classes": 5, "posemb": "relative", **kwargs}
    return randomize(vk.vit(TINY, **kwargs), scale=0.5)


def reference(model, x, classifier="token", built=None, params=None):
    return numpy_vit.forward(params or checkpoint_params(model), x, patch=8, heads=4, layers=2,
                             classifier=classifier,
                             relative_prefix=1 if classifier == "token" else 0,
                             relative_built=built)


def attention_of(model, block=0):
    return model.get_layer(f"Transformer_encoderblock_{block}").attention


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_logits_are_the_numpy_forward_pass_with_the_relative_bias(classifier):
    model = relative_model(classifier=classifier)
    attention = attention_of(model)
    assert tuple(attention.relative_embedding.shape) == (2 * 16 - 1, 4, 8)
    assert hasattr(attention, "prefix_relative_embedding") == (classifier == "token")
    assert model.get_layer("Transformer_posembed_input").embedding() is None
    x = images()
    np.testing.assert_allclose(numpy_of(model(x)), reference(model, x, classifier), atol=2e-5)


def random_block(num_prefix, attention_kernel="auto", patches=16, grid_size=None):
    block = TransformerBlock(4, 64, attention_kernel=attention_kernel, position_bias="relative",
                             num_patches=patches, num_prefix_tokens=num_prefix,
                             grid_size=grid_size, stride=8, name="Transformer_encoderblock_0")
    block.build((None, None, 32))
    return randomize(block, seed=num_prefix)


def block_params(block):
    return {k.split("/", 2)[2]: v for k, v in checkpoint_params(block).items()}


@pytest.mark.parity
@pytest.mark.parametrize("attention_kernel", ["fused", "einsum"])
@pytest.mark.parametrize("num_prefix", [0, 1, 3])
def test_both_paths_and_kernels_add_the_bias_and_the_probabilities_include_it(
        num_prefix, attention_kernel):
    """The plain call (on PyTorch the direct path, the fused kernel taking the bias as its
    attn_mask) and the one returning the probabilities (the einsums) against the NumPy block,
    any prefix tokens (class, distillation, registers) sharing the three prefix offsets."""
    block = random_block(num_prefix, attention_kernel)
    tokens = np.random.default_rng(3).normal(size=(2, num_prefix + 16, 32)).astype("float32")
    expected, expected_probs = numpy_vit.encoder_block(tokens, block_params(block), 4, True,
                                                       relative_prefix=num_prefix)
    assert block.attention.takes_direct_path() is kernels.uses("direct_layers")
    direct = numpy_of(block(tokens))
    general, probs = map(numpy_of, block(tokens, return_attention_scores=True))
    np.testing.assert_allclose(direct, expected, atol=2e-5)
    np.testing.assert_allclose(general, expected, atol=2e-5)
    np.testing.assert_allclose(probs, expected_probs, atol=1e-6)
    # The bias matters: without it the NumPy block computes something else.
    plain, _ = numpy_vit.encoder_block(tokens, block_params(block), 4, True)
    assert np.abs(plain - expected).max() > 1e-2


# (built image size, run image size) in pixels of 8-pixel patches: from a 4x4 grid to a larger
# one, a smaller one, one of the same count and another shape (2x8), a non-square one (3x5)
# and one row; from a non-square 2x8 grid to a square one.
GRIDS = [((32, 32), (32, 32)), ((32, 32), (48, 48)), ((32, 32), (16, 16)),
         ((32, 32), (16, 64)), ((32, 32), (24, 40)), ((32, 32), (8, 32)),
         ((16, 64), (32, 32))]


@pytest.mark.parametrize("built, size", GRIDS)
def test_another_grid_reads_each_displacement_per_axis(built, size):
    """A model of any size, built at one grid and run at another, against the NumPy model
    that reads each pair's displacement per axis; at its built size it is the fixed model."""
    dynamic = relative_model(image_size=built, dynamic_image_size=True)
    x = images(height=size[0], width=size[1])
    np.testing.assert_allclose(numpy_of(dynamic(x)),
                               reference(dynamic, x, built=(built[0] // 8, built[1] // 8)),
                               atol=2e-5)
    if size == built:
        fixed = vk.vit(TINY, image_size=built, num_classes=5, posemb="relative")
        fixed.set_weights(dynamic.get_weights())
        np.testing.assert_allclose(numpy_of(dynamic(x)), numpy_of(fixed(x)), atol=1e-6)


@pytest.mark.parametrize("grid, num_prefix", [((3, 5), 1), ((4, 1), 0), ((8, 2), 3)])
def test_a_block_given_another_grid_reads_it_on_both_paths(grid, num_prefix):
    """A TransformerBlock built for a 2x8 grid, called with images of another grid: the
    direct path and the general one against the NumPy block."""
    block = random_block(num_prefix, patches=16, grid_size=(2, 8))
    patches = grid[0] * grid[1]
    tokens = np.random.default_rng(4).normal(size=(2, num_prefix + patches, 32))
    tokens = tokens.astype("float32")
    pixels = np.zeros((2, 8 * grid[0], 8 * grid[1], 3), "float32")
    expected, expected_probs = numpy_vit.encoder_block(
        tokens, block_params(block), 4, True, relative_prefix=num_prefix,
        relative_grids=((2, 8), grid))
    general, probs = map(numpy_of, block(tokens, images=pixels, return_attention_scores=True))
    np.testing.assert_allclose(numpy_of(block(tokens, images=pixels)), expected, atol=2e-5)
    np.testing.assert_allclose(general, expected, atol=2e-5)
    np.testing.assert_allclose(probs, expected_probs, atol=1e-6)


def test_attention_maps_of_a_model_of_any_size_read_the_images_grid():
    """vit_keras.analysis calls the blocks itself: at 24x40 (3x5) from a 4x4 grid, its
    probabilities are the NumPy model's."""
    dynamic = relative_model(dynamic_image_size=True)
    x = images(height=24, width=40)
    _, expected = numpy_vit.forward(checkpoint_params(dynamic), x, patch=8, heads=4, layers=2,
                                    return_attention=True, relative_prefix=1,
                                    relative_built=(4, 4))
    for got, want in zip(vk.analysis.attention_maps(dynamic, x), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def fitted_table(table, built, grid):
    """What a model built for `grid` loads from a table built for `built`: its 1-D table holds
    one embedding per offset p_q - p_k, the mean, over the grid's (query, key) pairs at that
    offset, of the embedding the per-axis rule reads for each pair."""
    rows, cols = grid
    patches = rows * cols
    sums = np.zeros((2 * patches - 1, *table.shape[1:]))
    counts = np.zeros(2 * patches - 1)
    for query in range(patches):
        for key in range(patches):
            (row_q, col_q), (row_k, col_k) = divmod(query, cols), divmod(key, cols)
            offset = query - key + patches - 1
            sums[offset] += numpy_vit.relative_embedding(table, built, grid, row_q - row_k,
                                                         col_q - col_k)
            counts[offset] += 1
    return sums / counts[:, None, None]


@pytest.mark.parametrize("size", [(48, 48), (16, 16), (16, 64), (24, 40), (8, 32), (32, 8)])
def test_loaders_fit_the_table_to_a_model_of_another_grid_by_the_same_rule(size, tmp_path):
    """vk.load_weights into a model built at another size: its table is the per-axis reading
    fitted to its own 1-D offsets (fitted_table). Where the grid is one row or one column each
    offset is one displacement, so the model computes what the model of any size does."""
    dynamic = relative_model(dynamic_image_size=True)
    vk.save_npz(dynamic, tmp_path / "relative.npz")
    fixed = vk.vit(TINY, image_size=size, num_classes=5, posemb="relative")
    report = vk.load_weights(fixed, str(tmp_path / "relative.npz"))
    grid = (size[0] // 8, size[1] // 8)
    assert report.resampled[TABLE] == f"grid 4x4 -> {grid[0]}x{grid[1]} offsets (per axis)"
    for block in range(2):
        np.testing.assert_allclose(
            numpy_of(attention_of(fixed, block).relative_embedding),
            fitted_table(numpy_of(attention_of(dynamic, block).relative_embedding), (4, 4),
                         grid), atol=1e-5)
    if 1 in grid:
        x = images(height=size[0], width=size[1])
        np.testing.assert_allclose(numpy_of(fixed(x)), numpy_of(dynamic(x)), atol=1e-5)


def test_a_keras_file_moves_to_another_grid_from_its_recorded_one(tmp_path):
    """A model built at 2x8 (16 patches, as 4x4) saved as .keras: loaded into a 4x4 model its
    table is fitted from the 2x8 grid the file records, not from a square guess; into a 2x8
    model it is the table itself."""
    dynamic = relative_model(image_size=(16, 64), dynamic_image_size=True)
    dynamic.save(tmp_path / "relative.keras")
    table = numpy_of(attention_of(dynamic).relative_embedding)
    square = vk.vit(TINY, image_size=32, num_classes=5, posemb="relative")
    vk.load_weights(square, str(tmp_path / "relative.keras"))
    np.testing.assert_allclose(numpy_of(attention_of(square).relative_embedding),
                               fitted_table(table, (2, 8), (4, 4)), atol=1e-5)
    same = vk.vit(TINY, image_size=(16, 64), num_classes=5, posemb="relative")
    report = vk.load_weights(same, str(tmp_path / "relative.keras"))
    assert TABLE not in report.resampled
    np.testing.assert_array_equal(numpy_of(attention_of(same).relative_embedding), table)


def loss_gradients(model, x, weights, readout):
    """The gradients of sum(model(x) * readout) with respect to `weights`, by the backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.ops.sum(model(x) * readout)
        grads = tape.gradient(loss, [w.value for w in weights])
    elif backend == "torch":
        import torch

        loss = keras.ops.sum(model(x) * keras.ops.convert_to_tensor(readout))
        grads = torch.autograd.grad(loss, [w.value for w in weights])
    else:
        import jax

        trainable = model.trainable_variables
        chosen = [next(i for i, v in enumerate(trainable) if v is w) for w in weights]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def loss(values):
            logits, _ = model.stateless_call(values, non_trainable, x)
            return keras.ops.sum(logits * readout)

        grads = jax.grad(loss)([v.value for v in trainable])
        grads = [grads[i] for i in chosen]
    return [numpy_of(g) for g in grads]


@pytest.mark.parametrize("size", [(32, 32), (24, 40)])
def test_gradients_reach_the_tables_as_finite_differences_of_the_numpy_model(size):
    """At the built 4x4 grid and at 3x5: the backend's gradient of a linear read-out of the
    logits of a gap model (whose logits read every patch), with respect to the first and the
    last block's offset tables, along random directions, against central differences of the
    NumPy model in float64."""
    dynamic = relative_model(dynamic_image_size=True, classifier="gap")
    x = images(height=size[0], width=size[1])
    readout = np.random.default_rng(5).normal(size=(2, 5)).astype("float32")
    weights = [attention_of(dynamic, block).relative_embedding for block in (0, 1)]
    grads = loss_gradients(dynamic, x, weights, readout)
    params = {k: v.astype("float64") for k, v in checkpoint_params(dynamic).items()}

    def loss(key, value):
        logits = reference(dynamic, x.astype("float64"), "gap", built=(4, 4),
                           params={**params, key: value})
        return float(np.sum(logits * readout))

    rng, step = np.random.default_rng(6), 1e-4
    for key, grad in zip((TABLE, LAST_TABLE), grads, strict=True):
        for _ in range(2):
            direction = rng.normal(size=grad.shape)
            direction /= np.linalg.norm(direction)
            numeric = (loss(key, params[key] + step * direction)
                       - loss(key, params[key] - step * direction)) / (2 * step)
            np.testing.assert_allclose(np.sum(grad * direction), numeric, rtol=1e-3)


def without_grid_size(path, target):
    """A copy of a .keras file as the code before grid_size wrote it: the blocks' configs
    (which build their attention layers) without grid_size and stride."""
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}

    def strip(node):
        if isinstance(node, list):
            return [strip(v) for v in node]
        if not isinstance(node, dict):
            return node
        node = {k: strip(v) for k, v in node.items()}
        if node.get("class_name") == "TransformerBlock":
            node["config"] = {k: v for k, v in node["config"].items()
                              if k not in ("grid_size", "stride")}
        return node

    config = strip(json.loads(files["config.json"]))
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return target


def test_layers_saved_before_the_grid_was_recorded(tmp_path):
    """An attention layer's config without grid_size: a square count is read as the square
    grid, so another grid reads it per axis; another count keeps its built grid and refuses a
    change of grid in one line naming the layer and what is missing. Its .keras file moves to
    another size by the grid its position-embedding layer records."""
    config = MultiHeadDotProductAttention(4, position_bias="relative", num_patches=16,
                                          grid_size=(4, 4), name="attention").get_config()
    del config["grid_size"]
    assert MultiHeadDotProductAttention.from_config(config).grid_size == (4, 4)
    config["num_patches"] = 8
    assert MultiHeadDotProductAttention.from_config(config).grid_size is None

    model = relative_model(image_size=(16, 32))  # a 2x4 grid: 8 patches, not square
    model.save(tmp_path / "model.keras")
    old = without_grid_size(tmp_path / "model.keras", tmp_path / "old.keras")
    loaded = keras.saving.load_model(old, safe_mode=True)
    attention = attention_of(loaded)
    assert attention.grid_size is None
    x = images(height=16, width=32)
    np.testing.assert_array_equal(numpy_of(loaded(x)), numpy_of(model(x)))
    query = keras.ops.convert_to_tensor(np.zeros((1, 9, 4, 8), "float32"))
    with pytest.raises(ValueError) as error:
        attention.logit_bias(query, (4, 2))
    assert str(error.value) == (
        "MultiHeadDotProductAttention_1: relative offsets built for 8 patches on an "
        "unrecorded grid (no grid_size: a file saved before it was recorded, not square) "
        "cannot be read on a 4x2 grid: build the model at its image size and load the file's "
        "weights with vk.load_weights")
    other = vk.vit(TINY, image_size=32, num_classes=5, posemb="relative")
    report = vk.load_weights(other, str(old))
    assert report.resampled[TABLE] == "grid 2x4 -> 4x4 offsets (per axis)"
    np.testing.assert_allclose(
        numpy_of(attention_of(other).relative_embedding),
        fitted_table(numpy_of(attention_of(model).relative_embedding), (2, 4), (4, 4)),
        atol=1e-5)


def test_a_graph_of_unknown_image_size_reads_the_grid_as_it_runs():
    """The exported SavedModel's case: height, width and so the grid are tensors."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("unknown shapes are traced by TensorFlow's tf.function only")
    import tensorflow as tf

    model = relative_model(dynamic_image_size=True)
    call = tf.function(model, input_signature=[tf.TensorSpec((None, None, None, 3))])
    for height, width in [(32, 32), (48, 40), (16, 64)]:
        x = images(height=height, width=width)
        np.testing.assert_allclose(numpy_of(call(x)), numpy_of(model(x)), atol=1e-6)


def test_keras_file_round_trips_in_safe_mode_with_identical_logits(tmp_path):
    model = relative_model(dynamic_image_size=True, num_register_tokens=1)
    model.save(tmp_path / "relative.keras")
    loaded = keras.saving.load_model(tmp_path / "relative.keras", safe_mode=True)
    assert attention_of(loaded).grid_size == (4, 4)
    for height, width in [(32, 32), (24, 40), (16, 64)]:
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
    with pytest.raises(ValueError, match="^grid_size 2x4 has 8 patches, not num_patches 16$"):
        MultiHeadDotProductAttention(4, position_bias="relative", num_patches=16,
                                     grid_size=(2, 4))


def test_another_count_of_patches_without_its_grid_is_refused():
    block = random_block(1)
    tokens = np.zeros((1, 1 + 36, 32), "float32")
    with pytest.raises(ValueError, match="relative offsets built for 16 patches cannot be read "
                                         "for 36 patches without their grid"):
        block(tokens)


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
