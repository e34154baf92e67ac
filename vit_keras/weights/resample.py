"""Fitting a checkpoint's position embedding to a model's grid of patches."""

from __future__ import annotations

import keras
import numpy as np
import scipy.ndimage

from vit_keras.configs import RESAMPLING_METHODS
from vit_keras.position_embeddings import offset_table


def resample_grid(grid: np.ndarray, new_grid: tuple[int, int], method: str = "zoom"):
    """Resizes a (h, w, D) grid of position embeddings to new_grid.

    "zoom": the official vit_jax algorithm, scipy.ndimage.zoom(order=1) (corner-aligned
    bilinear), here with separate factors for height and width. "bilinear": half-pixel
    bilinear without antialiasing, what timm does when it loads an .npz file.
    """
    old_h, old_w, _ = grid.shape
    factors = (new_grid[0] / old_h, new_grid[1] / old_w, 1)
    if method == "zoom":
        return scipy.ndimage.zoom(grid, factors, order=1)
    if method == "bilinear":
        for axis, (old, new) in enumerate(zip((old_h, old_w), new_grid, strict=True)):
            src = np.clip((np.arange(new) + 0.5) * old / new - 0.5, 0, old - 1)
            low = np.floor(src).astype(int)
            high = np.minimum(low + 1, old - 1)
            frac = (src - low).reshape([-1 if a == axis else 1 for a in range(3)])
            grid = (np.take(grid, low, axis=axis) * (1 - frac)
                    + np.take(grid, high, axis=axis) * frac)
        return grid
    raise ValueError(f"unknown resampling method {method!r}: expected one of "
                     f"{', '.join(RESAMPLING_METHODS)}")


def resample_offsets(table: np.ndarray, built: tuple[int, int],
                     grid: tuple[int, int]) -> np.ndarray:
    """A relative-position table of the offsets of a built grid fitted to a model built for
    another grid. Its own table of 2H'W' - 1 offsets reads one embedding per 1-D offset,
    where the rule the model applies on another grid (position_embeddings.offset_table)
    reads one per 2-D displacement, and a 1-D offset of a grid of several rows and columns
    is two displacements (one column right, or one row down and W' - 1 columns left): each
    offset takes the mean of what that rule reads over the grid's pairs at that offset (the
    least-squares fit), which is the rule itself where the grid is one row or one column.

    Args:
        table: (2HW - 1, ...) offsets of the H x W grid `built`.
        built: (H, W).
        grid: (H', W'), the model's grid.

    Returns:
        The (2H'W' - 1, ...) table.
    """
    rows, cols = grid
    read = keras.ops.convert_to_numpy(offset_table(table, built, grid))
    row, col = np.arange(1 - rows, rows)[:, None], np.arange(1 - cols, cols)[None, :]
    pairs = ((rows - abs(row)) * (cols - abs(col))).ravel()  # pairs at each displacement
    offset = (row * cols + col + rows * cols - 1).ravel()
    total = np.zeros((2 * rows * cols - 1, *table.shape[1:]))
    np.add.at(total, offset, pairs.reshape(-1, *[1] * (table.ndim - 1))
              * read.reshape(len(offset), *table.shape[1:]))
    counts = np.bincount(offset, weights=pairs).reshape(-1, *[1] * (table.ndim - 1))
    return (total / counts).astype(table.dtype)


def source_grid(num_grid_tokens: int, target_grid: tuple[int, int]) -> tuple[int, int]:
    """The checkpoint's grid: square, or the model's own when the counts match."""
    side = int(round(num_grid_tokens**0.5))
    if side * side == num_grid_tokens:
        return side, side
    if target_grid[0] * target_grid[1] == num_grid_tokens:
        return target_grid
    raise ValueError(f"position embedding of {num_grid_tokens} grid tokens is not a square "
                     "grid; cannot tell its height and width")


def adapt_posemb(posemb: np.ndarray, ckpt_prefix: int, grid_size: tuple[int, int],
                 num_prefix_tokens: int, method: str) -> tuple[np.ndarray, str | None]:
    """Fits a checkpoint's (1, tokens, D) table to the model's grid and prefix tokens; returns
    the table and a note saying how the grid was resampled (None if it was not)."""
    tokens, grid = posemb[0, :ckpt_prefix], posemb[0, ckpt_prefix:]
    old_grid = source_grid(len(grid), grid_size)
    note = None
    if old_grid != tuple(grid_size):
        grid = resample_grid(grid.reshape(*old_grid, -1), grid_size, method)
        grid = grid.reshape(-1, posemb.shape[-1])
        note = (f"grid {old_grid[0]}x{old_grid[1]} -> {grid_size[0]}x{grid_size[1]} "
                f"({method})")
    if num_prefix_tokens > ckpt_prefix:  # big_vision adds no embedding to the cls token
        tokens = np.zeros((num_prefix_tokens, posemb.shape[-1]), posemb.dtype)
    tokens = tokens[:num_prefix_tokens]
    return np.concatenate([tokens, grid])[None], note
