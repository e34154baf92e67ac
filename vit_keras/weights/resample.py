"""Fitting a checkpoint's position embedding to a model's grid of patches."""

from __future__ import annotations

import numpy as np
import scipy.ndimage

from vit_keras.configs import RESAMPLING_METHODS


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


def resample_offsets(table: np.ndarray, rows: int) -> np.ndarray:
    """A (2N - 1, ...) table of relative-position offsets fitted to `rows` = 2N' - 1 rows by
    the rule the model applies inside (vit_keras.position_embeddings.Relative): offset o reads
    o (N - 1) / (N' - 1), linearly between neighbours."""
    built, patches = (table.shape[0] + 1) // 2, (rows + 1) // 2
    offsets = np.arange(rows) - (patches - 1)
    source = np.clip(offsets * (built - 1) / max(patches - 1, 1) + built - 1, 0, len(table) - 1)
    low = np.floor(source).astype(int)
    high = np.minimum(low + 1, len(table) - 1)
    frac = (source - low).reshape(-1, *[1] * (table.ndim - 1))
    return table[low] * (1 - frac) + table[high] * frac


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
