"""Fine-tunes a pre-trained checkpoint with the paper's recipe (SGD momentum 0.9, warmup then
cosine, no weight decay, a new zero-initialised head, position embeddings resampled to the new
resolution): vit-keras train with --recipe finetune and the weights given first.

vit-keras finetune WEIGHTS --variant B/16 --image-size 384 --folder DIR --eval-folder DIR
                     [--grad-accum 8] [--ema 0.9999] [any other vit-keras train flag]

WEIGHTS is a file (.npz, .keras, .weights.h5, .safetensors, .pth) or a pre-trained name such
as augreg_in21k.
"""

from . import train
from .common import run


def build_parser():
    parser = train.build_parser("finetune", __doc__)
    parser.add_argument("weights_file", metavar="WEIGHTS",
                        help="the checkpoint to start from: a file or a pre-trained name")
    parser.set_defaults(recipe="finetune")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args.weights = args.weights_file
    return train.run_training(args)


if __name__ == "__main__":
    run(main)
