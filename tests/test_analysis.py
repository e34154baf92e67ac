import keras
import numpy as np
import pytest

import vit_keras as vk
from tests import numpy_vit
from tests.conftest import TINY, checkpoint_params, images, randomize
from vit_keras import analysis


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_rollout_equals_numpy_on_recorded_attention(classifier):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, classifier=classifier))
    x = images()
    recorded = analysis.attention_maps(model, x)
    params = checkpoint_params(model)
    posemb = params["Transformer/posembed_input/pos_embedding"][0]
    _, expected_maps = numpy_vit.forward(params, x, patch=8, heads=4, layers=2,
                                         classifier=classifier, posemb=posemb,
                                         return_attention=True)
    for got, want in zip(recorded, expected_maps, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    prefix = 1 if classifier == "token" else 0
    for b in range(len(x)):
        joint = np.eye(recorded[0].shape[-1])
        for probs in recorded:
            a = probs[b].mean(axis=0) + np.eye(probs.shape[-1])
            a = a / a.sum(axis=1, keepdims=True)
            joint = a @ joint
        row = joint[0] if prefix else joint.mean(axis=0)
        np.testing.assert_allclose(analysis.attention_rollout(model, x)[b],
                                   row[prefix:].reshape(4, 4), atol=1e-6)


def test_attention_distance_of_identity_and_uniform_attention():
    grid, patch = (2, 3), 16
    tokens = 1 + 6
    identity = np.broadcast_to(np.eye(tokens), (2, 3, tokens, tokens))
    np.testing.assert_allclose(analysis.attention_distance(identity, grid, patch, 1), 0.0)
    uniform = np.full((2, 3, tokens, tokens), 1.0 / tokens)
    centres = [(r * patch, c * patch) for r in range(2) for c in range(3)]
    pairwise = [np.hypot(a[0] - b[0], a[1] - b[1]) for a in centres for b in centres]
    np.testing.assert_allclose(analysis.attention_distance(uniform, grid, patch, 1),
                               np.mean(pairwise))
    # every query on the second patch, (row 0, column 1): the patches' order is row-major
    second = np.zeros((1, 1, tokens, tokens))
    second[..., 1 + 1] = 1.0
    to_second = [np.hypot(r - 0, c - 1) * patch for r, c in np.ndindex(*grid)]
    np.testing.assert_allclose(analysis.attention_distance(second, grid, patch, 1),
                               [np.mean(to_second)])
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3))
    assert analysis.mean_attention_distance(model, images()).shape == (2, 4)


def test_few_shot_is_exact_on_separable_features_and_respects_shots():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 5, (4, 16))
    labels = np.repeat(np.arange(4), 40)
    features = centres[labels] + rng.normal(0, 0.1, (160, 16))
    result = analysis.few_shot(features, labels, features, labels, shots=(1, 5), seeds=2)
    assert result == {1: 1.0, 5: 1.0}
    with pytest.raises(ValueError, match="41 shots of class 0, which has 40 training"):
        analysis.few_shot(features, labels, features, labels, shots=(41,))


def numpy_fewshot_lsr(train_x, train_y, test_x, test_y, classes, l2):
    """big_vision's fewshot_lsr, written out: features standardised on the shots, a bias
    feature, targets 2 * onehot - 1, ridge regression solved as a stacked least squares."""
    mean, std = train_x.mean(axis=0), train_x.std(axis=0) + 1e-5
    design = np.hstack([(train_x - mean) / std, np.ones((len(train_x), 1))])
    targets = 2.0 * np.eye(classes)[train_y] - 1.0
    width = design.shape[1]
    weights = np.linalg.lstsq(np.vstack([design, np.sqrt(l2) * np.eye(width)]),
                              np.vstack([targets, np.zeros((width, classes))]), rcond=None)[0]
    scores = np.hstack([(test_x - mean) / std, np.ones((len(test_x), 1))]) @ weights
    return float((scores.argmax(-1) == test_y).mean())


def test_few_shot_accuracy_equals_numpy_fewshot_lsr_on_overlapping_classes():
    rng = np.random.default_rng(3)
    centres = rng.normal(0, 1, (3, 8))
    train_y, test_y = np.repeat(np.arange(3), 10), np.repeat(np.arange(3), 50)
    train_x = 5.0 + centres[train_y] + rng.normal(0, 1.5, (30, 8))  # offset: standardising
    test_x = 5.0 + centres[test_y] + rng.normal(0, 1.5, (150, 8))  # and the bias matter
    for l2 in (1.0, 2.0**10):
        got = analysis.linear_fewshot_accuracy(train_x, train_y, test_x, test_y, 3, l2)
        expected = numpy_fewshot_lsr(train_x, train_y, test_x, test_y, 3, l2)
        assert got == expected and 0.4 < got < 1.0, (l2, got, expected)


def test_few_shot_draws_shots_per_class_for_each_seed(monkeypatch):
    seen = []  # each draw's training rows, by the row number each feature row holds
    monkeypatch.setattr(analysis, "linear_fewshot_accuracy",
                        lambda tx, ty, *rest: seen.append(tx[:, 0].astype(int)) or 0.5)
    labels = np.repeat(np.arange(3), 10)
    features = np.stack([np.arange(30), np.zeros(30)], axis=1)
    assert analysis.few_shot(features, labels, features, labels, shots=(2, 5), seeds=3) == {
        2: 0.5, 5: 0.5}
    assert [tuple(np.bincount(labels[rows])) for rows in seen] == [(2, 2, 2)] * 3 + [
        (5, 5, 5)] * 3
    assert all(len(set(rows)) == len(rows) for rows in seen)  # no example drawn twice
    for draws in (seen[:3], seen[3:]):  # each seed draws other examples
        assert len({tuple(sorted(rows)) for rows in draws}) == 3


def test_ridge_solver_equals_numpy_least_squares():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(30, 6)), rng.normal(size=(30, 3))
    l2 = 4.0
    stacked_x = np.vstack([x, np.sqrt(l2) * np.eye(6)])
    stacked_y = np.vstack([y, np.zeros((6, 3))])
    expected = np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]
    np.testing.assert_allclose(analysis.ridge_solve(x, y, l2), expected, atol=1e-10)


def test_position_similarity_is_numpys_cosine_similarity_on_a_rectangular_grid():
    model = randomize(vk.vit(TINY, image_size=(32, 48), num_classes=3, posemb="learned"))
    table = checkpoint_params(model)["Transformer/posembed_input/pos_embedding"][0, 1:]
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    similarity = analysis.position_embedding_similarity(model)  # a 4x6 grid of 8-pixel patches
    assert similarity.shape == (4, 6, 4, 6)
    for r, c, r2, c2 in [(0, 1, 2, 5), (3, 0, 1, 4), (1, 5, 3, 2)]:
        assert similarity[r, c, r2, c2] == pytest.approx(unit[r * 6 + c] @ unit[r2 * 6 + c2])


def test_sincos_position_similarity_peaks_at_itself_and_falls_with_distance():
    model = vk.vit({**TINY, "hidden_size": 64, "num_heads": 4}, image_size=64, posemb="sincos2d")
    similarity = analysis.position_embedding_similarity(model)  # (8, 8, 8, 8)
    for r in range(8):
        for c in range(8):
            grid = similarity[r, c]
            assert grid[r, c] == pytest.approx(1.0)
            assert grid.argmax() == r * 8 + c
    row = similarity[0, 0, 0]  # along the first row, moving away from (0, 0)
    assert np.all(np.diff(row[:5]) < 0)


def test_patch_filters_are_principal_components():
    """The components against an eigendecomposition of the filters' covariance (up to sign,
    which the [0, 1] scaling turns into x -> 1 - x), with a planted dominant direction."""
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3))
    embedding = model.get_layer("embedding")
    rng = np.random.default_rng(1)
    planted = rng.normal(size=8 * 8 * 3)
    kernel = 0.01 * rng.normal(size=(8 * 8 * 3, 32)) + np.outer(planted, rng.normal(size=32))
    embedding.kernel.assign(kernel.reshape(8, 8, 3, 32).astype("float32"))
    filters = analysis.patch_filters(model, n=6)
    assert filters.shape == (6, 8, 8, 3)

    rows = kernel.T - kernel.T.mean(axis=0)
    _, vectors = np.linalg.eigh(rows.T @ rows)
    for filt, vector in zip(filters, vectors[:, ::-1].T, strict=False):
        scaled = (vector - vector.min()) / (vector.max() - vector.min())
        flat = filt.reshape(-1)
        assert min(np.abs(flat - scaled).max(), np.abs(flat - (1 - scaled)).max()) < 1e-3
    first = filters[0].reshape(-1)
    assert abs(np.corrcoef(first, planted)[0, 1]) > 0.99


def test_hybrid_analysis_measures_image_pixels_and_has_no_patch_filters():
    # root-only ResNet (/4) and 2x2 patches: a 4x4 grid of 8-pixel cells on a 32-pixel image
    config = {**TINY, "patch_size": 2, "resnet_layers": (), "resnet_width": 32}
    model = randomize(vk.vit(config, image_size=32, num_classes=3))
    x = images()
    recorded = analysis.attention_maps(model, x)
    params = checkpoint_params(model)
    _, expected_maps = numpy_vit.forward(
        params, x, patch=2, heads=4, layers=2, resnet_stages=(), resnet_width=32,
        posemb=params["Transformer/posembed_input/pos_embedding"][0], return_attention=True)
    for got, want in zip(recorded, expected_maps, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    centres = np.array([(8 * r, 8 * c) for r in range(4) for c in range(4)])
    distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    expected = []
    for probs in expected_maps:
        patches = probs[:, :, 1:, 1:] / probs[:, :, 1:, 1:].sum(-1, keepdims=True)
        expected.append((patches * distance).sum(-1).mean(axis=(0, 2)))
    np.testing.assert_allclose(analysis.mean_attention_distance(model, x), expected, rtol=1e-4)
    assert analysis.attention_rollout(model, x).shape == (2, 4, 4)
    with pytest.raises(ValueError, match="sees 32 ResNet channels, not the image's 3"):
        analysis.patch_filters(model)


def nested_models(vit, size=32):
    """vit as a layer of a functional and of a Sequential model, after a rescaling."""
    inputs = keras.Input((size, size, 3))
    functional = keras.Model(
        inputs, keras.layers.Dense(2)(vit(keras.layers.Rescaling(0.5)(inputs))))
    sequential = keras.Sequential([keras.Input((size, size, 3)), keras.layers.Rescaling(0.5),
                                   vit, keras.layers.Dense(2)])
    return functional, sequential


def test_tools_find_the_vit_inside_a_bigger_model():
    vit = randomize(vk.vit(TINY, image_size=32, num_classes=3))
    x = images()
    expected_rollout = analysis.attention_rollout(vit, x * 0.5)
    expected_distance = analysis.mean_attention_distance(vit, x * 0.5)
    for outer in nested_models(vit):
        np.testing.assert_allclose(analysis.attention_rollout(outer, x), expected_rollout,
                                   atol=1e-6)
        np.testing.assert_allclose(analysis.mean_attention_distance(outer, x),
                                   expected_distance, atol=1e-5)
        np.testing.assert_array_equal(analysis.patch_filters(outer), analysis.patch_filters(vit))
    with pytest.raises(ValueError, match="model 'plain' has no ViT in it"):
        analysis.attention_rollout(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)],
                                                    name="plain"), x)


def test_tools_take_the_image_sizes_of_a_dynamic_model(tmp_path):
    dynamic = randomize(vk.vit(TINY, image_size=32, num_classes=3, dynamic_image_size=True))
    vk.save_npz(dynamic, tmp_path / "weights.npz")
    fixed = vk.vit(TINY, image_size=(48, 24), num_classes=3)
    vk.load_npz(fixed, tmp_path / "weights.npz", resample="zoom")
    x = images(height=48, width=24)
    rollout = analysis.attention_rollout(dynamic, x)
    assert rollout.shape == (2, 6, 3)
    np.testing.assert_allclose(rollout, analysis.attention_rollout(fixed, x), atol=1e-5)
    np.testing.assert_allclose(analysis.mean_attention_distance(dynamic, x),
                               analysis.mean_attention_distance(fixed, x), rtol=1e-4)
