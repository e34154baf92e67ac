"""What the appendix's ablations share: one training run of a variant of the experiments' model
(apps.train with the variant's flags), every run on every patch (no patch dropout, which
relative position embeddings refuse) with the `fashion_mnist` recipe otherwise, and the
paper's few-shot probe of the trained representation."""

import keras

from benchmarks import finished_or_trained, limit_flags
from benchmarks.probes import probes

# The paper experiments' model (these ablations, masked patch prediction): the main job's model
# when they ran, 28x28 images in 4x4-pixel patches (a 7x7 grid of 49 tokens), global average
# pooling and sincos2d position embeddings, a plain ViT; the main job has since moved on
# (notes/mainjob.md).
EXPERIMENT_SHAPE = dict(hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128, patch_size=4)
EXPERIMENT_IMAGE_SIZE = 28
EXPERIMENT_FLAGS = (*(flag for key, value in EXPERIMENT_SHAPE.items()
                      for flag in ("--" + key.replace("_", "-"), str(value))),
                    "--resnet-layers", "none", "--image-size", str(EXPERIMENT_IMAGE_SIZE),
                    "--classifier", "gap", "--posemb", "sincos2d")
# Each ablation trains every token: patch dropout is the main job's speed-up, not the paper's.
ABLATION_FLAGS = ("--recipe", "fashion_mnist", "--recipe-option", "patch_drop_rate=0",
                  *EXPERIMENT_FLAGS)
FEW_SHOT_DRAWS = 10  # draws of the 5 images per class the 5-shot probe averages over


def train_run(flags: list[str], run_dir: str, limit: int | None) -> dict:
    """apps.train's result of one ablation run with `flags` in run_dir (finished_or_trained:
    an interrupted experiment resumes where it stopped)."""
    argv = [*ABLATION_FLAGS, *flags, "--run-dir", run_dir, *limit_flags(limit)]
    return finished_or_trained(argv)


def five_shot(model_path: str, limit: int | None) -> float:
    """The paper's 5-shot linear accuracy of the trained model's pooled representation."""
    report = probes(keras.saving.load_model(model_path, compile=False), limit, shots=(5,),
                    draws=FEW_SHOT_DRAWS)
    return report["few_shot"]["5"]
