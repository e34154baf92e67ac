"""Parity of every weight family that loads by name: max |vit_keras - timm| on a small random
model of that family's own timm architecture (its timm options, at a tiny width and depth),
loaded into vk.vit with the release's options, once per Keras backend, each in a fresh process.

python -m benchmarks.parity [--backends tensorflow jax torch] [--json docs/weights/parity.json]
"""

import argparse
import json
import os
import subprocess
import sys

from benchmarks import write_json

BACKENDS = ("tensorflow", "jax", "torch")

CHILD = r"""
import json, sys
import timm  # torch and timm before TensorFlow, or torch._dynamo segfaults
import torch
import keras
import numpy as np
import vit_keras as vk
from vit_keras.weights import pretrained

SMALL = dict(embed_dim=32, depth=2, num_heads=4)
results = {}
for name, release in sorted(pretrained.PRETRAINED.items()):
    variant, entry = next(iter(release.checkpoints.items()))
    architecture = entry.timm_model
    if architecture is None:
        continue  # Google's files: the paper's model, covered by the tests against timm
    patch = vk.get_config(variant).patch_size
    reference = timm.create_model(architecture, img_size=4 * patch, **SMALL).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    config = {"hidden_size": 32, "num_layers": 2, "num_heads": 4,
              "mlp_dim": reference.blocks[0].mlp.fc1.out_features, "patch_size": patch}
    model = vk.vit(config, image_size=4 * patch, num_classes=max(entry.num_classes, 1),
                   include_top=bool(entry.num_classes), **release.architecture)
    vk.load_pytorch_weights(model, reference.state_dict())
    x = np.random.default_rng(1).uniform(-2, 2, (2, 4 * patch, 4 * patch, 3)).astype("float32")
    with torch.no_grad():
        theirs = reference(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    ours = keras.ops.convert_to_numpy(model(x))
    results[name] = {"architecture": architecture, "output_shape": list(ours.shape),
                     "max_abs_output": float(np.abs(theirs).max()),
                     "max_abs_diff": float(np.abs(ours - theirs).max())}
print(json.dumps(results))
"""


def measure(backend: str) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{backend}: the parity run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = {"backends": {backend: measure(backend) for backend in args.backends}}
    for backend, results in report["backends"].items():
        for name, result in results.items():
            print(f"{backend:<10} {name:<20} {result['architecture']:<40} "
                  f"max |ours - timm| {result['max_abs_diff']:.1e} "
                  f"(outputs up to {result['max_abs_output']:.2f})")
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
