"""One A/B reading of the notes: milliseconds of a train step and a forward pass of B/16's
depth at a tiny width, best of 7 rounds of 20, under KERAS_BACKEND (JIT=true compiles)."""

import os
import sys
import time

import keras
import numpy as np

import vit_keras as vk
from vit_keras import training


def best_ms(step, rounds=7, calls=20) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - started) / calls * 1000)
    return min(times)


print(vk.__file__, file=sys.stderr)
keras.utils.set_random_seed(0)
model = vk.vit(vk.ViTConfig(64, 12, 4, 128, 16), image_size=32, num_classes=10)
recipe = training.Recipe("adamw", 1e-3, "cosine", 0, weight_decay=0.05, clipnorm=1.0)
jit_compile = os.environ.get("JIT", "auto") == "true" or "auto"
training.compile_model(model, recipe, total_steps=10**6, jit_compile=jit_compile)
x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
y = np.eye(10)[[1, 2]].astype("float32")
for _ in range(5):
    model.train_on_batch(x, y)
train_ms = best_ms(lambda: model.train_on_batch(x, y))
forward_ms = best_ms(lambda: model.predict_on_batch(x))
print(f"{os.environ['KERAS_BACKEND']} train {train_ms:.1f} ms forward {forward_ms:.1f} ms")
