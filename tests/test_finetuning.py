"""Fine-tuning that fits in memory: LoRA adapters, quantization of every dense kernel, and
rematerialisation, on every backend."""

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, images, randomize

DENSE = ("query", "key", "value", "out", "Dense_0", "Dense_1")


def dense_layers(model, block=0):
    layer = model.get_layer(f"Transformer_encoderblock_{block}")
    attention, mlp = layer.attention, layer.mlp
    return dict(zip(DENSE, (attention.query, attention.key, attention.value, attention.out,
                            mlp.dense_0, mlp.dense_1), strict=True))


def outputs(model, x):
    return keras.ops.convert_to_numpy(model(x))


def one_hot(labels, classes=3):
    return np.eye(classes, dtype="float32")[labels]


# Each format's relative rounding error, half a step: (kernel, input) of a quantized matmul.
# int8 and int4 scale by the abs-max (steps of 1/127, 1/7 of it; int4 kernels see int8
# inputs); float8 (e4m3) keeps 3 mantissa bits, a relative step of 1/8.
HALF_STEPS = {"int8": (0.5 / 127, 0.5 / 127), "int4": (0.5 / 7, 0.5 / 127),
              "float8": (0.5 / 8, 0.5 / 8)}


def quantization_tolerance(mode: str) -> float:
    """The largest error relative to the largest logit: the roundings of TINY's 12 dense
    layers (2 blocks x query, key, value, out, Dense_0, Dense_1), independent and so adding in
    quadrature, with a margin of 1.5."""
    kernel, inputs = HALF_STEPS[mode]
    matmuls = 6 * TINY["num_layers"]
    return 1.5 * float(np.sqrt(matmuls * (kernel**2 + inputs**2)))


@pytest.mark.parametrize("mode", ["int8", "float8", "int4"])
def test_quantize_reaches_every_dense_kernel_and_reloads_identically(mode, tmp_path):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3))
    x = images(batch=4)
    reference = outputs(model, x)
    model.quantize(mode)
    for block in range(TINY["num_layers"]):
        for name, layer in dense_layers(model, block).items():
            assert layer.quantization_mode == mode, (block, name)
    quantized = outputs(model, x)
    error = np.abs(quantized - reference).max()
    assert 0 < error < quantization_tolerance(mode) * np.abs(reference).max(), error
    model.save(tmp_path / "quantized.keras")
    reloaded = keras.saving.load_model(tmp_path / "quantized.keras", safe_mode=True)
    np.testing.assert_array_equal(outputs(reloaded, x), quantized)


def lora_parameter_count(model, rank, targets):
    """Keras' EinsumDense factors a kernel of shape (*in, out) as A (*in, rank) B (rank, out),
    Dense's (in, out) as A (in, rank) B (rank, out)."""
    count = 0
    for block in range(TINY["num_layers"]):
        for name, layer in dense_layers(model, block).items():
            if name in targets:
                shape = tuple(layer._kernel.shape)
                count += int(np.prod(shape[:-1])) * rank + rank * shape[-1]
    return count


def test_lora_trains_only_the_adapters_and_the_head():
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3), scale=0.1)
    x, y = images(batch=8), one_hot(np.arange(8) % 3)
    reference = outputs(model, x)
    vk.lora(model, rank=2, targets=("query", "value", "Dense_0"))
    before = {v.path: keras.ops.convert_to_numpy(v.value) for v in model.weights}  # adapters too
    head = 32 * 3 + 3
    expected = lora_parameter_count(model, 2, ("query", "value", "Dense_0")) + head
    assert sum(int(np.prod(v.shape)) for v in model.trainable_weights) == expected
    np.testing.assert_allclose(outputs(model, x), reference, atol=1e-6)  # B starts at zero
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.CategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    changed = {v.path for v in model.weights
               if not np.array_equal(keras.ops.convert_to_numpy(v.value), before[v.path])}
    assert changed and all("lora_kernel" in p or p.startswith("head/") for p in changed), changed
    assert any("lora_kernel_b" in p for p in changed)  # trained, not just created


def test_merged_lora_model_computes_what_the_lora_model_computes(tmp_path):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3), scale=0.1)
    vk.lora(model, rank=4, alpha=8, targets=("query", "key", "value", "out", "Dense_0",
                                             "Dense_1"))
    for variable in model.weights:  # adapters that change the function
        if "lora_kernel" in variable.path:
            variable.assign(np.random.default_rng(7).normal(0, 0.1, variable.shape))
    x = images(batch=4)
    adapted = outputs(model, x)
    merged = vk.merge_lora(model)
    # kernel + alpha / rank * A B, computed here: the merged kernel and the adapted layer's
    query, merged_query = (dense_layers(m, 0)["query"] for m in (model, merged))
    a, b, raw = (keras.ops.convert_to_numpy(w) for w in (query.lora_kernel_a,
                                                          query.lora_kernel_b, query._kernel))
    expected = raw + 8 / 4 * np.einsum("dhr,ro->dho", a, b)  # (D, heads, rank) (rank, D_h)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(merged_query.kernel), expected,
                               atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(query.kernel), expected, atol=1e-6)
    assert not any("lora" in v.path for v in merged.weights)
    assert merged.count_params() == vk.vit(TINY, image_size=32, num_classes=3).count_params()
    np.testing.assert_allclose(outputs(merged, x), adapted, atol=1e-5)
    vk.save_npz(model, tmp_path / "merged.npz")  # the official layout, adapters merged
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    vk.load_npz(plain, tmp_path / "merged.npz")
    np.testing.assert_allclose(outputs(plain, x), adapted, atol=1e-5)
    model.save(tmp_path / "lora.keras")
    reloaded = keras.saving.load_model(tmp_path / "lora.keras", safe_mode=True)
    np.testing.assert_allclose(outputs(reloaded, x), adapted, atol=1e-5)


def test_lora_refuses_unknown_targets():
    model = vk.vit(TINY, image_size=32, num_classes=3)
    with pytest.raises(ValueError, match=r"LoRA targets must be some of query, key, value, "
                                         r"out, Dense_0, Dense_1, got \['qkv'\]"):
        vk.lora(model, targets=("qkv",))


def gradients(model, x, y):
    """The loss's gradients with respect to every trainable weight, as NumPy arrays."""
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    backend = keras.backend.backend()
    weights = model.trainable_weights
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, weights)
    elif backend == "torch":
        value = loss(y, model(x, training=True))
        grads = [g for g in __import__("torch").autograd.grad(value, [w.value for w in weights])]
    else:
        import jax

        values = [w.value for w in weights]
        non_trainable = [w.value for w in model.non_trainable_weights]

        def compute(trainable):
            logits, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            return loss(y, logits)

        grads = jax.grad(compute)(values)
    return [keras.ops.convert_to_numpy(g) for g in grads]


def test_remat_gives_the_same_outputs_and_gradients():
    x, y = images(batch=4), one_hot(np.arange(4) % 3)
    plain = randomize(vk.vit(TINY, image_size=32, num_classes=3), scale=0.2)
    remat = vk.vit(TINY, image_size=32, num_classes=3, remat=True)
    remat.set_weights(plain.get_weights())
    assert remat.get_layer("Transformer_encoderblock_0").remat
    np.testing.assert_allclose(outputs(remat, x), outputs(plain, x), atol=1e-6)
    for got, expected in zip(gradients(remat, x, y), gradients(plain, x, y), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_remat_with_dropout_is_refused():
    with pytest.raises(ValueError, match="remat recomputes the block .* needs dropout_rate 0"):
        vk.vit(TINY, image_size=32, num_classes=3, remat=True, dropout_rate=0.1)
