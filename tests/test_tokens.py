"""vk.merge_tokens (ToMe) and vk.prune_tokens (EViT) against tests/numpy_tokens.py, a NumPy
implementation written from the papers' rules: logits, tokens and sizes per block,
proportional attention, prefix tokens, the identities, refusals, .keras files and model.fit."""

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests import numpy_tokens
from tests.conftest import checkpoint_params, images, randomize
from vit_keras.tokens.budget import default_prune_blocks, token_counts

# 32 px in 4-pixel patches: 64 patch tokens, enough to merge in every block.
CONFIG = dict(hidden_size=32, num_layers=3, num_heads=4, mlp_dim=64, patch_size=4)
PATCHES = 64
OPTIONS = {
    "token": {},
    "gap": {"classifier": "gap"},
    "gap_class_token": {"classifier": "gap", "class_token": True},
    "gap_class_token_fc_norm": {"classifier": "gap", "class_token": True, "fc_norm": True},
    "registers": {"num_register_tokens": 1},
    "distilled_registers": {"distilled": True, "num_register_tokens": 2},
}
# A float32 run takes the float64 reference's decisions when the scores behind them are
# further apart than its rounding (a few 1e-9 for the class attention, more for cosines).
MERGE_MARGIN, PRUNE_MARGIN, ORDER_MARGIN = 1e-5, 1e-6, 1e-7


def numpy_of(x):
    return keras.ops.convert_to_numpy(x)


def num_prefix(options):
    class_token = options.get("classifier", "token") == "token" or options.get("class_token")
    return (int(bool(class_token)) + int(options.get("distilled", False))
            + options.get("num_register_tokens", 0))


def build(options, layers=3, **kwargs):
    """A tiny ViT with random weights everywhere, and LayerNorm scales near 1, so that the
    attention is far from uniform and the reference's decisions have clear margins."""
    model = randomize(vk.vit({**CONFIG, "num_layers": layers}, image_size=32, num_classes=5,
                             **OPTIONS[options], **kwargs))
    rng = np.random.default_rng(1)
    for variable in model.weights:
        if variable.path.endswith("gamma"):
            variable.assign((1 + rng.normal(0, 0.2, variable.shape)).astype("float32"))
    return model


def reference(model, options, x, layers=3, **rule):
    return numpy_tokens.forward(checkpoint_params(model), x, patch=4, heads=4, layers=layers,
                                **OPTIONS[options], **rule)


def block_outputs(reduced, layers, x):
    """Every block's tokens (prefix first, before the final norm) and sizes, per vk.features."""
    out = vk.features(reduced, blocks=list(range(layers)), norm=False, spatial=False,
                      prefix_tokens=True)(x)
    out = {k: numpy_of(v) for k, v in out.items()}
    tokens = [np.concatenate([out[f"block{i}_prefix"], out[f"block{i}"]], axis=1)
              if f"block{i}_prefix" in out else out[f"block{i}"] for i in range(layers)]
    return tokens, [out[f"block{i}_sizes"] for i in range(layers)]


def assert_blocks_match(reduced, expected, options, layers, x):
    """Tokens per block in order, the patch tokens' sizes, and the counts of the rule."""
    p = num_prefix(options)
    tokens, sizes = block_outputs(reduced, layers, x)
    assert token_counts(reduced) == expected["counts"]
    for i in range(layers):
        np.testing.assert_allclose(tokens[i], expected["tokens"][i], atol=2e-4, rtol=1e-4,
                                   err_msg=f"block {i}")
        np.testing.assert_allclose(sizes[i], expected["sizes"][i][:, p:, None], atol=1e-5,
                                   err_msg=f"block {i}'s sizes")
        np.testing.assert_allclose(sizes[i].sum(axis=1)[:, 0], PATCHES, atol=1e-4)


# ------------------------------------------------------------------------------- merging


@pytest.mark.parity
@pytest.mark.parametrize("options, r", [
    ("token", 12), ("token", [0, 12, 12]), ("token", 40), ("gap", 12),
    ("gap_class_token_fc_norm", 12), ("distilled_registers", 40)])
def test_merged_logits_are_the_numpy_reference(options, r):
    """r=40 is past the cap in every block ((t - p) // 2: 32, 16, 8 for one prefix token).
    (The tests share token counts where they can: JAX compiles each new shape; [0, 12, 12]
    has r=12's counts one block later.)"""
    model = build(options)
    x = images()
    expected = reference(model, options, x, r=r)
    assert expected["margin"] > MERGE_MARGIN
    merged = vk.merge_tokens(model, r)
    np.testing.assert_allclose(numpy_of(merged(x)), expected["logits"], atol=1e-4, rtol=1e-4)
    p = num_prefix(OPTIONS[options])
    schedule = numpy_tokens.merge_schedule(r, 3)
    assert token_counts(merged) == numpy_tokens.merged_counts(PATCHES + p, p, schedule)


@pytest.mark.parity
def test_merged_model_without_top_gives_the_size_weighted_representation():
    model = build("gap", include_top=False, representation_size=16)
    x = images()
    expected = reference(model, "gap", x, r=12, representation=True)
    assert expected["margin"] > MERGE_MARGIN
    np.testing.assert_allclose(numpy_of(vk.merge_tokens(model, 12)(x)), expected["pooled"],
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parity
@pytest.mark.parametrize("options, r", [("token", 12), ("gap", 12),
                                        ("distilled_registers", 40)])
def test_merged_tokens_and_sizes_per_block_are_the_numpy_reference(options, r):
    model = build(options)
    x = images()
    expected = reference(model, options, x, r=r)
    assert expected["margin"] > MERGE_MARGIN
    merged = vk.merge_tokens(model, r)
    assert_blocks_match(merged, expected, OPTIONS[options], 3, x)
    # Some token stands for several patches by the last block, so the sizes matter.
    assert expected["sizes"][-1].max() > 2


@pytest.mark.parity
@pytest.mark.parametrize("options", ["token", "gap"])
def test_proportional_attention_adds_log_size_to_every_key(options):
    """The reference without log(size) on the attention logits is far from the library's
    output, the reference with it is close: the bias is there and is log(size)."""
    model = build(options)
    x = images()
    with_bias = reference(model, options, x, r=12)
    without = reference(model, options, x, r=12, proportional=False)
    assert min(with_bias["margin"], without["margin"]) > MERGE_MARGIN
    got = numpy_of(vk.merge_tokens(model, 12)(x))
    np.testing.assert_allclose(got, with_bias["logits"], atol=1e-4, rtol=1e-4)
    assert np.abs(got - without["logits"]).max() > 1e-2


@pytest.mark.parametrize("options", ["token", "distilled_registers"])
def test_prefix_tokens_are_never_merged(options):
    """Merging as much as the cap allows: the prefix tokens stay in front, and block 0's are
    the original model's (its attention sees sizes of 1, and a merge would change them); the
    patch tokens' sizes add up to the patches, none taken in by a prefix token."""
    model = build(options)
    x = images()
    merged = vk.merge_tokens(model, 40)
    merged_out = vk.features(merged, blocks=[0, 1, 2], norm=False, spatial=False,
                             prefix_tokens=True)(x)
    original = vk.features(model, blocks=[0], norm=False, spatial=False, prefix_tokens=True)(x)
    p = num_prefix(OPTIONS[options])
    np.testing.assert_allclose(numpy_of(merged_out["block0_prefix"]),
                               numpy_of(original["block0_prefix"]), atol=1e-5)
    for i, count in enumerate(token_counts(merged)):
        assert merged_out[f"block{i}_prefix"].shape[1] == p
        assert merged_out[f"block{i}"].shape[1] == count - p
        np.testing.assert_allclose(numpy_of(merged_out[f"block{i}_sizes"]).sum(axis=1)[:, 0],
                                   PATCHES, atol=1e-4)
    assert token_counts(merged) == numpy_tokens.merged_counts(PATCHES + p, p, [40] * 3)


# ------------------------------------------------------------------------------- identity


@pytest.mark.parametrize("options", ["token", "gap", "distilled_registers"])
def test_r_0_and_keep_rate_1_give_the_original_model(options):
    model = build(options)
    x = images()
    expected = numpy_of(model(x))
    budgets = [vk.merge_tokens(model, 0), vk.merge_tokens(model, [0, 0, 0])]
    if num_prefix(OPTIONS[options]):
        budgets += [vk.prune_tokens(model, 1.0), vk.prune_tokens(model, 1.0, blocks=[0, 1, 2])]
    for budget in budgets:
        np.testing.assert_allclose(numpy_of(budget(x)), expected, atol=1e-6, rtol=0,
                                   err_msg=budget.name)
        assert token_counts(budget) == token_counts(model)


# ------------------------------------------------------------------------------- pruning


def test_default_prune_blocks_are_evits():
    assert default_prune_blocks(12) == [3, 6, 9]
    assert default_prune_blocks(4) == [1, 2, 3]


@pytest.mark.parity
@pytest.mark.parametrize("options, keep_rate, blocks, layers", [
    ("token", 0.7, None, 4),                       # EViT's blocks: 1, 2, 3 of 4
    ("gap_class_token", 0.6, [0, -1], 3),
    ("gap_class_token_fc_norm", 0.6, [0, -1], 3),
    ("distilled_registers", 0.5, [1], 3)])
def test_pruned_model_is_the_numpy_reference(options, keep_rate, blocks, layers):
    model = build(options, layers=layers)
    x = images()
    expected = reference(model, options, x, layers=layers, keep_rate=keep_rate, blocks=blocks)
    assert expected["margin"] > PRUNE_MARGIN and expected["order_margin"] > ORDER_MARGIN
    pruned = vk.prune_tokens(model, keep_rate, blocks=blocks)
    np.testing.assert_allclose(numpy_of(pruned(x)), expected["logits"], atol=1e-4, rtol=1e-4)
    p = num_prefix(OPTIONS[options])
    at = numpy_tokens.prune_blocks(blocks, layers)
    assert expected["counts"] == numpy_tokens.pruned_counts(PATCHES + p, p, keep_rate, at,
                                                            layers)
    assert_blocks_match(pruned, expected, OPTIONS[options], layers, x)


# ------------------------------------------------------------------------------- refusals


def tiny(**kwargs):
    return vk.vit(CONFIG, image_size=32, num_classes=5, **kwargs)


@pytest.mark.parametrize("function", [lambda m: vk.merge_tokens(m, 2),
                                      lambda m: vk.prune_tokens(m, 0.5)])
def test_models_without_a_fixed_grid_are_refused(function):
    with pytest.raises(ValueError, match="posemb='relative'"):
        function(tiny(posemb="relative"))
    with pytest.raises(ValueError, match=r"dynamic_image_size=True"):
        function(tiny(dynamic_image_size=True))
    with pytest.raises(ValueError, match="already merges or prunes tokens"):
        function(function(tiny()))


def test_bad_amounts_are_refused():
    model = tiny()
    for r in (-1, [1, 2], [1, 2, -1], [1, 2, 1.5]):
        with pytest.raises(ValueError, match=r"r must be an int >= 0 or a list of 3 of them"):
            vk.merge_tokens(model, r)
    for keep_rate in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"keep_rate must be in \(0, 1\]"):
            vk.prune_tokens(model, keep_rate)
    with pytest.raises(ValueError, match="block index 3 is out of range"):
        vk.prune_tokens(model, 0.5, blocks=[3])
    with pytest.raises(ValueError, match="has no class token"):
        vk.prune_tokens(tiny(classifier="gap"), 0.5)


def test_a_float_r_is_refused_by_name():
    with pytest.raises(ValueError, match=r"r must be an int >= 0 or a list of 3 of them"):
        vk.merge_tokens(tiny(), 1.5)


def test_grid_readers_refuse_a_budget_model_by_name():
    model = tiny()
    x = images()
    for budget, name in [(vk.merge_tokens(model, 4), "vk.merge_tokens"),
                         (vk.prune_tokens(model, 0.5), "vk.prune_tokens")]:
        with pytest.raises(ValueError, match="spatial=False"):
            vk.features(budget, blocks=1)
        for tool in ("attention_maps", "attention_rollout", "mean_attention_distance"):
            with pytest.raises(ValueError, match=f"{tool}.*{name}"):
                getattr(vk.analysis, tool)(budget, x)


# ------------------------------------------------------------------------------- files, fit


@pytest.mark.parametrize("make", [lambda: vk.merge_tokens(build("token"), 12),
                                  lambda: vk.prune_tokens(build("gap_class_token_fc_norm"),
                                                          0.6, blocks=[0, -1])])
def test_keras_file_round_trips_in_safe_mode(make, tmp_path):
    budget = make()
    x = images()
    budget.save(tmp_path / "budget.keras")
    for loaded in (vk.load_model(tmp_path / "budget.keras"),
                   keras.saving.load_model(tmp_path / "budget.keras", safe_mode=True)):
        np.testing.assert_allclose(numpy_of(loaded(x)), numpy_of(budget(x)), atol=1e-6)
        assert token_counts(loaded) == token_counts(budget)


@pytest.mark.parametrize("make", [lambda m: vk.merge_tokens(m, 12),
                                  lambda m: vk.prune_tokens(m, 0.6, blocks=[0, -1])])
def test_fit_trains_the_shared_weights(make):
    model = build("token")
    budget = make(model)
    assert {id(v) for v in budget.weights} == {id(v) for v in model.weights}
    before = [numpy_of(v) for v in model.weights]
    budget.compile(optimizer=keras.optimizers.SGD(0.05),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    history = budget.fit(images(batch=8), rng.integers(0, 5, 8), batch_size=4, epochs=1,
                         shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    moved = [np.abs(numpy_of(v) - b).max() for v, b in zip(model.weights, before, strict=True)]
    embedding = [i for i, v in enumerate(model.weights) if v.path == "embedding/kernel"][0]
    assert moved[embedding] > 1e-6 and sum(m > 0 for m in moved) > len(moved) // 2
