"""Fine-tunes a pre-trained checkpoint with the paper's recipe (SGD momentum 0.9, warmup then
cosine, no weight decay, a new zero-initialised head, position embeddings resampled to the new
resolution): apps.train with --recipe finetune and the weights given first.

python -m apps.finetune WEIGHTS --variant B/16 --image-size 384 --folder DIR --eval-folder DIR
                        [--grad-accum 8] [--ema 0.9999] [any other apps.train flag]
"""

import sys

from apps import train


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m apps.finetune WEIGHTS [apps.train flags]")
    weights, rest = argv[0], argv[1:]
    return train.main(["--recipe", "finetune", "--weights", weights, *rest])


if __name__ == "__main__":
    main()
