"""Fine-tunes a pre-trained checkpoint with the paper's recipe (SGD momentum 0.9, warmup then
cosine, no weight decay, a new zero-initialised head, position embeddings resampled to the new
resolution): vit-keras train with --recipe finetune and the weights given first.

vit-keras finetune WEIGHTS --variant B/16 --image-size 384 --folder DIR --eval-folder DIR
                     [--grad-accum 8] [--ema 0.9999] [--layer-decay 0.75]
                     [--head-lr-multiplier 10] [any other vit-keras train flag]

WEIGHTS is a file (.npz, .keras, .weights.h5, .safetensors, .pth) or a pre-trained name such
as augreg_in21k.
"""

from . import train
from .common import run

# The recipe fields (vit_keras.training.Recipe) that flags of this app set.
RECIPE_FLAGS = ("layer_decay", "head_lr_multiplier")


def build_parser():
    parser = train.build_parser("finetune", __doc__, convnet=False)
    parser.add_argument("weights_file", metavar="WEIGHTS",
                        help="the checkpoint to start from: a file or a pre-trained name")
    rates = parser.add_argument_group("learning rates by layer (docs/finetuning.md)")
    rates.add_argument("--layer-decay", type=float, default=None, metavar="D",
                       help="layer-wise rate decay as MAE and BEiT: block i of L trains at "
                            "D^(L - i) times the rate, the embeddings at D^(L + 1); in (0, 1]")
    rates.add_argument("--head-lr-multiplier", type=float, default=None, metavar="M",
                       help="the new head trains at M times the rate (the recipe's: 1)")
    parser.set_defaults(recipe="finetune")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.convnet:
        raise ValueError("--convnet trains a ResNet from scratch (vit-keras train --convnet); "
                         "vit-keras finetune starts from a ViT checkpoint")
    args.weights = args.weights_file
    args.recipe_option = [*args.recipe_option,
                          *(f"{field}={getattr(args, field)!r}" for field in RECIPE_FLAGS
                            if getattr(args, field) is not None)]
    return train.run_training(args)


if __name__ == "__main__":
    run(main)
