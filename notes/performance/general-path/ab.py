import sys, time, os
import numpy as np, keras
import vit_keras as vk
from vit_keras import training
print(vk.__file__, file=sys.stderr)
keras.utils.set_random_seed(0)
m = vk.vit(vk.ViTConfig(64, 12, 4, 128, 16), image_size=32, num_classes=10)
recipe = training.Recipe("adamw", 1e-3, "cosine", 0, weight_decay=0.05, clipnorm=1.0)
training.compile_model(m, recipe, total_steps=10**6, jit_compile=os.environ.get("JIT", "auto") == "true" or "auto")
x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32"); y = np.eye(10)[[1, 2]].astype("float32")
for _ in range(5): m.train_on_batch(x, y)
ts = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(20): m.train_on_batch(x, y)
    ts.append((time.perf_counter() - t) / 20 * 1000)
fw = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(20): m.predict_on_batch(x)
    fw.append((time.perf_counter() - t) / 20 * 1000)
print(f"{os.environ['KERAS_BACKEND']} train {min(ts):.1f} ms forward {min(fw):.1f} ms")
