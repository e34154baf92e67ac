"""The paper's tools for looking inside a ViT (Figures 6 and 7, Section 4.5, Appendix D):
attention rollout, mean attention distance, position-embedding similarity, patch-embedding
filters, and the few-shot linear evaluation of its representation.

The model's own blocks are called in order, so the attention comes from the trained weights
without a second model; the tools find the ViT inside a bigger model (features.find_vit) and
take images of any size a dynamic-size model takes.
"""

from __future__ import annotations

import keras
import numpy as np

from vit_keras import configs
from vit_keras.intermediates import (
    blocks_of,
    cell_size,
    fed_by,
    find_vit,
    num_prefix_tokens,
    refuse_token_budget,
    representation_layer,
)
from vit_keras.layers import PatchEmbedding
from vit_keras.position_embeddings import image_grid

__all__ = ["attention_distance", "attention_maps", "attention_rollout", "few_shot",
           "linear_fewshot_accuracy", "mean_attention_distance", "patch_distances",
           "patch_filters", "position_embedding_similarity", "representation", "ridge_solve",
           "rollout"]


def _layout(vit: keras.Model, images) -> tuple[tuple[int, int], int, int]:
    """(token grid of these images, number of prefix tokens, pixels per grid cell)."""
    stride = cell_size(vit)
    return image_grid(images, stride), num_prefix_tokens(vit), stride


def _vit_and_images(model: keras.Model, images, tool: str):
    """The ViT in model (features.find_vit) and the images as it sees them, for tool; refused
    for a model with a token budget."""
    vit, feeder = find_vit(model)
    refuse_token_budget(vit, tool)
    return vit, images if feeder is None else feeder(images, training=False)


def attention_maps(model: keras.Model, images) -> list[np.ndarray]:
    """The attention probabilities of every block, computed by calling the model's own
    blocks in order, so that they come from the trained weights without a second model.

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).
        images: model inputs (batch, height, width, channels), of any size the model takes.

    Returns:
        One array per block, each (batch, heads, tokens, tokens).

    Raises:
        ValueError: a model that merges or prunes tokens (vk.merge_tokens,
            vk.prune_tokens), whose later blocks have no grid of patches.
    """
    vit, images = _vit_and_images(model, images, "attention_maps")
    blocks = blocks_of(vit)
    tokens = keras.tree.flatten(blocks[0].input)[0]  # a block may take the images too
    x = keras.Model(vit.input, tokens)(images, training=False)
    maps = []
    for block in blocks:
        # A block with a position bias reads the images' grid (a model of any size).
        x, probs = block(x, training=False, return_attention_scores=True,
                         images=images if block.stride else None)
        maps.append(keras.ops.convert_to_numpy(probs))
    return maps


def rollout(maps: list[np.ndarray], num_prefix_tokens: int, grid) -> np.ndarray:
    """Abnar & Zuidema's attention rollout: per layer, heads averaged, the identity added
    for the residual path and rows renormalised; the layers multiplied in order. The map
    is the class token's row over the patches (the mean of all rows for a gap model).

    Args:
        maps: each block's attention probabilities (attention_maps).
        num_prefix_tokens: the tokens before the patches; 0 reads the mean of all rows.
        grid: (rows, columns) of patches.

    Returns:
        (batch, rows, columns) maps.
    """
    joint = None
    for probs in maps:
        attention = probs.mean(axis=1)
        attention = attention + np.eye(attention.shape[-1])
        attention = attention / attention.sum(axis=-1, keepdims=True)
        joint = attention if joint is None else attention @ joint
    rows = joint[:, 0] if num_prefix_tokens else joint.mean(axis=1)
    return rows[:, num_prefix_tokens:].reshape(-1, *grid)


def attention_rollout(model: keras.Model, images) -> np.ndarray:
    """Where a model looks: the attention rollout of its blocks over the patches (the paper's
    Figure 6), one map per image.

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).
        images: model inputs (batch, height, width, channels), of any size the model takes.

    Returns:
        (batch, grid_h, grid_w) maps over the patch grid.

    Raises:
        ValueError: a model that merges or prunes tokens (vk.merge_tokens,
            vk.prune_tokens), whose later blocks have no grid of patches.
    """
    vit, seen = _vit_and_images(model, images, "attention_rollout")
    grid, prefix, _ = _layout(vit, seen)
    return rollout(attention_maps(vit, seen), prefix, grid)


def patch_distances(grid, patch_size: int) -> np.ndarray:
    """The pixel distance between the centres of every pair of patches.

    Args:
        grid: (rows, columns) of patches.
        patch_size: pixels per patch side.

    Returns:
        An (N, N) array over the N = rows * columns patches in row-major order.
    """
    rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], axis=1) * patch_size
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def attention_distance(probs: np.ndarray, grid, patch_size: int,
                       num_prefix_tokens: int = 0) -> np.ndarray:
    """Mean attention distance per head, in pixels: sum_j a_ij d(i, j) over the patches
    (prefix tokens left out, rows renormalised over the patches), averaged over queries
    and images.

    Args:
        probs: one block's attention probabilities (batch, heads, tokens, tokens).
        grid: (rows, columns) of patches.
        patch_size: pixels per patch side (a hybrid's cell).
        num_prefix_tokens: the tokens before the patches.

    Returns:
        (heads,) distances in pixels.
    """
    patches = probs[:, :, num_prefix_tokens:, num_prefix_tokens:]
    patches = patches / patches.sum(axis=-1, keepdims=True)
    per_query = (patches * patch_distances(grid, patch_size)).sum(axis=-1)
    return per_query.mean(axis=(0, 2))


def mean_attention_distance(model: keras.Model, images) -> np.ndarray:
    """How far each head of each block attends, in pixels: the paper's Figure 7 (right),
    which shows some heads attending globally from the lowest layers.

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).
        images: model inputs (batch, height, width, channels), of any size the model takes.

    Returns:
        (layers, heads) mean attention distances in pixels.

    Raises:
        ValueError: a model that merges or prunes tokens (vk.merge_tokens,
            vk.prune_tokens), whose later blocks have no grid of patches.
    """
    vit, seen = _vit_and_images(model, images, "mean_attention_distance")
    grid, prefix, patch = _layout(vit, seen)
    return np.stack([attention_distance(p, grid, patch, prefix)
                     for p in attention_maps(vit, seen)])


def position_embedding_similarity(model: keras.Model) -> np.ndarray:
    """Cosine similarity of each patch position's embedding with every other's, as
    (grid_h, grid_w, grid_h, grid_w) (the paper's Figure 7, centre): learned embeddings
    come to encode the distance between patches.

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).

    Returns:
        (grid_h, grid_w, grid_h, grid_w) similarities.

    Raises:
        ValueError: a model without a position embedding table (posemb="none").
    """
    layer = find_vit(model)[0].get_layer(configs.POSITION_EMBEDDING)
    table = layer.embedding()
    if table is None:
        raise ValueError("the model has no position embedding (posemb='none')")
    table = keras.ops.convert_to_numpy(table)[0, layer.num_prefix_tokens:]
    unit = table / np.linalg.norm(table, axis=-1, keepdims=True)
    return (unit @ unit.T).reshape(*layer.grid_size, *layer.grid_size)


def patch_filters(model: keras.Model, n: int = 28) -> np.ndarray:
    """The top-n principal components of the patch-embedding filters E, each a
    (patch, patch, channels) image scaled to [0, 1] (the paper's Figure 7, left).

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).
        n: how many components.

    Returns:
        (n, patch, patch, channels) images in [0, 1].

    Raises:
        ValueError: a hybrid, whose filters see ResNet channels rather than pixels.
    """
    vit = find_vit(model)[0]
    embedding = vit.get_layer(configs.EMBEDDING)
    if not isinstance(embedding, PatchEmbedding):
        raise ValueError(f"model {vit.name} has no PatchEmbedding layer")
    kernel = keras.ops.convert_to_numpy(embedding.kernel)
    patch, _, channels, width = kernel.shape
    if channels != vit.input.shape[-1]:
        raise ValueError(f"the patch embedding sees {channels} ResNet channels, not the image's "
                         f"{vit.input.shape[-1]}: a hybrid's filters are not image patches")
    filters = kernel.reshape(-1, width).T  # one row per embedding dimension
    filters = filters - filters.mean(axis=0)
    _, _, components = np.linalg.svd(filters, full_matrices=False)
    components = components[:n].reshape(-1, patch, patch, channels)
    low = components.min(axis=(1, 2, 3), keepdims=True)
    high = components.max(axis=(1, 2, 3), keepdims=True)
    return (components - low) / np.maximum(high - low, 1e-12)


# ------------------------------------------------------- few-shot linear evaluation


def representation(model: keras.Model) -> keras.Model:
    """The frozen representation the paper evaluates few-shot: pre_logits if the model has
    it, else the pooled token.

    Args:
        model: a vk.vit model, or a model with one inside (find_vit).

    Returns:
        A keras.Model from model's inputs to the representation (batch, width).
    """
    vit, feeder = find_vit(model)
    return fed_by(feeder, keras.Model(vit.input,
                                      vit.get_layer(representation_layer(vit)).output))


def ridge_solve(features: np.ndarray, targets: np.ndarray, l2: float) -> np.ndarray:
    """argmin_W |X W - Y|^2 + l2 |W|^2 in closed form.

    Args:
        features: X, (examples, features).
        targets: Y, (examples, outputs).
        l2: the regularisation.

    Returns:
        W, (features, outputs).
    """
    gram = features.T @ features + l2 * np.eye(features.shape[1])
    return np.linalg.solve(gram, features.T @ targets)


def linear_fewshot_accuracy(train_x, train_y, test_x, test_y, num_classes: int,
                            l2: float) -> float:
    """big_vision's fewshot_lsr: features standardised on the training shots, a constant
    bias feature appended, targets 2 * onehot - 1, regularised least squares.

    Args:
        train_x: the training shots' features (examples, width).
        train_y: their class indices.
        test_x: the test features.
        test_y: their class indices.
        num_classes: the classes.
        l2: the regularisation.

    Returns:
        The test accuracy in [0, 1].
    """
    mean, std = train_x.mean(axis=0), train_x.std(axis=0) + 1e-5

    def prepare(x):
        x = (x - mean) / std
        return np.concatenate([x, np.ones((len(x), 1))], axis=1)

    targets = 2.0 * np.eye(num_classes)[train_y] - 1.0
    weights = ridge_solve(prepare(train_x), targets, l2)
    return float(((prepare(test_x) @ weights).argmax(-1) == test_y).mean())


def few_shot(features_train: np.ndarray, labels_train: np.ndarray, features_test: np.ndarray,
             labels_test: np.ndarray, shots=(1, 5, 10, 25), l2: float = 2.0**10,
             seeds: int = 3) -> dict[int, float]:
    """The paper's few-shot linear evaluation: the mean test accuracy over several random
    draws of a few training examples per class, fitted by regularised least squares.

    Args:
        features_train: the frozen representation (representation()) of the training
            examples to draw from.
        labels_train: their class indices.
        features_test: the test examples' representation.
        labels_test: their class indices.
        shots: the examples per class of each evaluation.
        l2: the regularisation (big_vision's default, 2**10).
        seeds: the random draws per shot count.

    Returns:
        {shots: mean accuracy in [0, 1]}.

    Raises:
        ValueError: a shot count above a class's training examples.
    """
    classes, counts = np.unique(labels_train, return_counts=True)
    num_classes = int(max(labels_train.max(), labels_test.max())) + 1
    for shot in shots:
        if shot > counts.min():
            rarest = classes[counts.argmin()]
            raise ValueError(f"few-shot: {shot} shots of class {rarest}, which has "
                             f"{counts.min()} training examples")
    results = {}
    for shot in shots:
        scores = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            chosen = np.concatenate([
                rng.choice(np.flatnonzero(labels_train == c), shot, replace=False)
                for c in classes])
            scores.append(linear_fewshot_accuracy(features_train[chosen], labels_train[chosen],
                                                  features_test, labels_test, num_classes, l2))
        results[shot] = float(np.mean(scores))
    return results
