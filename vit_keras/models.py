"""vit(): the paper's model as a functional keras.Model, named like the official checkpoint tree."""

from __future__ import annotations

import dataclasses
import re

import keras

from vit_keras import configs, kernels, preprocessing
from vit_keras.configs import ViTConfig, as_pair, get_config
from vit_keras.layers import (
    LAYER_NORM_EPSILON,
    ClassToken,
    PatchDropout,
    PatchEmbedding,
    PrefixTokens,
    TokenPooling,
    TransformerBlock,
    check_mlp_activation,
    layer_norm,
)
from vit_keras.position_embeddings import (
    POSITION_EMBEDDINGS,
    AddPositionEmbedding,
    check_position_embedding,
)
from vit_keras.preprocessing import InputConvention
from vit_keras.resnet import resnet_stem
from vit_keras.weights import load_weights, pretrained

CLASSIFIERS = TokenPooling.METHODS


def vit(
    variant: str | ViTConfig | dict = "B/16",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    classifier: str = "token",
    representation_size: int | None = None,
    posemb: str = "learned",
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    stochastic_depth_rate: float = 0.0,
    patch_drop_rate: float = 0.0,
    include_top: bool = True,
    weights: str | None = None,
    approximate_gelu: bool = True,
    attention_kernel: str = "auto",
    remat: bool = False,
    layer_scale: float | None = None,
    qkv_bias: bool = True,
    proj_bias: bool = True,
    qk_norm: bool = False,
    pre_norm: bool = False,
    mlp_activation: str = "gelu",
    num_register_tokens: int = 0,
    class_token: bool | None = None,
    fc_norm: bool = False,
    distilled: bool = False,
    layer_norm_epsilon: float = LAYER_NORM_EPSILON,
    head_bias_init: float = 0.0,
    channels: int = 3,
    dynamic_image_size: bool = False,
    include_preprocessing: bool = False,
    input_convention: str | InputConvention | keras.Model | None = None,
    name: str | None = None,
) -> keras.Model:
    """Builds a Vision Transformer as a functional keras.Model.

    Layers are named after the official checkpoint tree (embedding, cls,
    Transformer/encoderblock_{i}, Transformer/encoder_norm, pre_logits, head), so loading a
    checkpoint is a name map; the options of the weight families after the paper add layers
    of their own and leave that tree as it is. Every option has the paper's default, and the
    families' options are named as timm names them (docs/weights.md).

    The input is float images (batch, height, width, channels) normalised by the model's
    input convention ([-1, 1] unless its weights or input_convention say otherwise;
    vk.preprocess(images, model) gives it), or raw pixels with include_preprocessing. The
    output is the logits (include_top) or the pooled representation, float32 under any
    mixed-precision policy, since the read-out and the head run in float32.

    Args:
        variant: "B/16" and friends, or a hybrid such as "R50+B/16" (see vk.VARIANTS); a
            ViTConfig; or a dict of its fields.
        image_size: the input's size, an int or (height, width); a multiple of the patch size
            (of a hybrid's cell: ResNet stride times patch size).
        num_classes: the head's width; ignored when include_top is False.
        classifier: "token" reads out the class token; "gap" averages the patch tokens.
        representation_size: when given, a Dense layer of that width with tanh ("pre_logits")
            between the pooled token and the head, as the paper's pre-training head has.
        posemb: a kind of vit_keras.position_embeddings.POSITION_EMBEDDINGS: "learned",
            "learned2d", "sincos2d", "none", or "relative" (the paper's Appendix D.4), which
            biases each block's attention logits instead of adding a table to the tokens
            (docs/features.md).
        dropout_rate: dropout after the position embedding, after each block's attention
            and inside its MLP.
        attention_dropout_rate: dropout on the attention probabilities; it takes the einsum
            attention kernel, the only one that exposes them.
        stochastic_depth_rate: the drop-path rate of the last block, rising linearly from 0
            at the first.
        patch_drop_rate: the share of patch tokens each training image leaves out before the
            blocks (layers.PatchDropout): cheaper steps and an augmentation; inference sees
            every patch.
        include_top: False ends the model at the pooled representation, without a head.
        weights: None (random), a local .npz, .keras, .weights.h5 or PyTorch file, or a
            pre-trained name such as "augreg_in21k" (vit_keras.weights.pretrained), downloaded
            once into the Keras cache.
        approximate_gelu: True is the tanh GELU the official checkpoints were trained with;
            False is the exact erf GELU of timm and Hugging Face.
        attention_kernel: "auto", "fused" or "einsum" (vit_keras.kernels); "auto" takes the
            backend's fused kernel where it has one.
        remat: recompute each block in the backward pass instead of keeping its activations
            (layers.TransformerBlock), for models that do not fit otherwise.
        layer_scale: LayerScale's initial value on every residual branch (DeiT III, DINOv2);
            None for none.
        qkv_bias: False builds query, key and value without biases.
        proj_bias: False builds the attention's output projection and the MLP without
            biases.
        qk_norm: a LayerNorm on each head's query and key.
        pre_norm: a LayerNorm before the first block, and a patch embedding without bias
            (CLIP).
        mlp_activation: "gelu", or "quick_gelu" (OpenAI's CLIP).
        num_register_tokens: learned tokens after the class token that take no position
            embedding and are not read out (DINOv2 with registers).
        class_token: None gives one exactly when the classifier reads it; True with
            classifier="gap" keeps one that the average leaves out (MAE).
        fc_norm: the final LayerNorm after pooling instead of before (MAE and BEiT
            fine-tuned).
        distilled: DeiT's distillation token after the class token, with a second head; the
            logits are the two heads' mean and the features the two tokens' mean, as DeiT
            infers.
        layer_norm_epsilon: every LayerNorm's epsilon (CLIP's are 1e-5).
        head_bias_init: the initial value of every logit's bias; the head's kernel starts at
            zero, as the paper's fine-tuning head does, so a new model's logits all equal it
            (a negative value starts a sigmoid loss at low probabilities).
        channels: the images' channels.
        dynamic_image_size: take images of any height and width that are multiples of the
            patch size (a hybrid's cell), fitting the position embeddings to each image's
            grid inside the model (AddPositionEmbedding); image_size is then the size they
            are learned at, and the outputs at that size are the fixed-size model's
            (docs/features.md).
        include_preprocessing: the model takes raw pixels, uint8 or float in [0, 255], and
            normalises them itself by its input convention, as vk.preprocess(images, model)
            does: to [-1, 1], or by the mean and standard deviation of the release named in
            weights (DeiT, DINO, MAE, DINOv2: ImageNet's; CLIP: OpenAI's) or of
            input_convention (a float32 layer named "preprocessing" before the patch
            embedding, vit_keras.preprocessing.Normalize). The name is Keras Applications'
            option for the same thing. Off by default: the model takes normalised images,
            which the data pipelines, apps and exports supply.
        input_convention: how pixels are normalised for this model, recorded in it
            (vk.input_convention(model)) for vk.preprocess, vit-keras predict and evaluate
            and the exports' uint8 serving functions, and applied by include_preprocessing.
            None: the release's when weights names one (weights="deit_in1k" records
            ImageNet's mean and standard deviation, and the release itself), else nothing is
            recorded and the model takes [-1, 1]. A release name, an InputConvention
            (vit_keras.preprocessing.IMAGENET, ...) or a model records that convention
            instead, for weights from a file path. The record is a layer without weights or
            computation (vit_keras.preprocessing.InputRecord) that saves with the model.
        name: the model's name; by default from the variant, such as "vit_b_16".

    Returns:
        A functional keras.Model: images in, logits or features out.

    Raises:
        ValueError: an unknown variant, classifier, position embedding, attention kernel or
            MLP activation; a rate outside [0, 1); an image size the patches do not divide;
            a pre-trained name without a checkpoint for this variant; or options that
            contradict each other (classifier="token" without a class token, distilled
            without classifier="token", patch dropout with a relative position embedding,
            remat with dropout); an input convention of three channels for a model of
            another channel count, or a name that is no release.
    """
    config = get_config(variant)
    class_token = classifier == "token" or distilled if class_token is None else class_token
    _check_arguments(config, image_size, num_classes, classifier, posemb, include_top,
                     attention_kernel, dropout_rate=dropout_rate,
                     attention_dropout_rate=attention_dropout_rate,
                     stochastic_depth_rate=stochastic_depth_rate,
                     patch_drop_rate=patch_drop_rate)
    if patch_drop_rate and POSITION_EMBEDDINGS[posemb].biases_attention:
        raise ValueError(f"posemb={posemb!r} reads each token's place in the patch sequence, "
                         f"which patch dropout takes away: build it with patch_drop_rate=0, "
                         f"got {patch_drop_rate}")
    _check_family_options(classifier, class_token, distilled, fc_norm, representation_size,
                          num_register_tokens, mlp_activation)
    if isinstance(variant, str) and pretrained.is_name(weights):
        pretrained.checkpoint(variant, weights)  # a name without this variant: refused unbuilt
    release = weights if pretrained.is_name(weights) else None
    first = preprocessing.input_layer(include_preprocessing,
                                      _convention(input_convention, release), release, channels)
    height, width = as_pair(image_size, "image_size")
    shape = (None, None) if dynamic_image_size else (height, width)
    inputs = keras.Input((*shape, channels), name="images")
    images = first(inputs) if first is not None else inputs
    tokens = TokenLayout(class_token, distilled, num_register_tokens, pre_norm,
                         layer_norm_epsilon)
    x = _embed(images, (height, width), dynamic_image_size, config, posemb, tokens)
    if patch_drop_rate:
        x = PatchDropout(patch_drop_rate, tokens.num_prefix, name=configs.PATCH_DROPOUT)(x)
    x = keras.layers.Dropout(dropout_rate, name="Transformer_dropout")(x)
    block_options = {"approximate_gelu": approximate_gelu, "attention_kernel": attention_kernel,
                     "remat": remat, "layer_scale": layer_scale, "qkv_bias": qkv_bias,
                     "qk_norm": qk_norm, "mlp_activation": mlp_activation,
                     "norm_epsilon": layer_norm_epsilon, "proj_bias": proj_bias,
                     **_position_bias(posemb, (height, width), config, tokens)}
    x = _blocks(x, config, dropout_rate, attention_dropout_rate, stochastic_depth_rate,
                block_options,
                images if dynamic_image_size and "position_bias" in block_options else None)
    if not fc_norm:
        x = layer_norm(configs.ENCODER_NORM, layer_norm_epsilon)(x)
    x = _read_out(x, tokens, classifier, fc_norm, representation_size,
                  num_classes if include_top else None, head_bias_init)
    model = keras.Model(inputs, x, name=name or _model_name(variant, config))
    if weights is not None:
        load_weights(model, weights, variant=variant)
    return model


def _convention(given, release: str | None) -> InputConvention | None:
    """The input convention a model records: the one given, else its release's, else none."""
    source = given if given is not None else release
    return preprocessing.input_convention(source) if source else None


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """The tokens before the patch tokens, and the LayerNorm before the blocks (pre_norm):
    [class] [distillation] [registers] patches; the position embedding covers the class and
    distillation tokens, never the registers."""

    class_token: bool
    distilled: bool
    num_register_tokens: int
    pre_norm: bool
    norm_epsilon: float

    @property
    def num_embedded_prefix(self) -> int:
        return int(self.class_token) + int(self.distilled)

    @property
    def num_prefix(self) -> int:
        return self.num_embedded_prefix + self.num_register_tokens


def _embed(images, image_size, dynamic: bool, config: ViTConfig, posemb, tokens: TokenLayout):
    """Images -> the tokens the first block takes; image_size is what the position
    embeddings are built for, fitted to each image's grid when dynamic."""
    x = images
    if config.is_hybrid:
        x = resnet_stem(x, config.resnet_layers, config.resnet_width)
    embedding = PatchEmbedding(config.patch_size, config.hidden_size,
                               use_bias=not tokens.pre_norm, name=configs.EMBEDDING)
    grid = embedding.grid_size(tuple(side // config.stem_stride for side in image_size))
    x = embedding(x)
    if tokens.class_token:
        x = ClassToken(name=configs.CLASS_TOKEN)(x)
    if tokens.distilled:
        x = PrefixTokens(1, after=1, name=configs.DISTILLATION_TOKEN)(x)
    position = AddPositionEmbedding(grid, tokens.num_embedded_prefix, posemb,
                                    stride=config.cell_size, name=configs.POSITION_EMBEDDING)
    x = position(x, images=images) if dynamic else position(x)
    if tokens.num_register_tokens:
        x = PrefixTokens(tokens.num_register_tokens, after=tokens.num_embedded_prefix,
                         stddev=1e-6, name=configs.REGISTERS)(x)
    if tokens.pre_norm:
        x = layer_norm(configs.PRE_NORM, tokens.norm_epsilon)(x)
    return x


def _position_bias(posemb: str, image_size, config: ViTConfig, tokens: TokenLayout) -> dict:
    """The blocks' options for a position embedding that biases the attention logits: the
    grid of patches it is built for, after every prefix token (registers included), and the
    pixels per grid cell, with which a model of any size reads each image's grid."""
    if not POSITION_EMBEDDINGS[posemb].biases_attention:
        return {}
    rows, cols = (side // config.cell_size for side in image_size)
    return {"position_bias": posemb, "num_patches": rows * cols, "grid_size": (rows, cols),
            "num_prefix_tokens": tokens.num_prefix, "stride": config.cell_size}


def _blocks(x, config: ViTConfig, dropout_rate, attention_dropout_rate, stochastic_depth_rate,
            block_options: dict, images=None):
    """The encoder blocks; block_options are the TransformerBlock arguments all share; images
    (a model of any size with a position bias) give each block the grid of patches."""
    depth = config.num_layers
    for i in range(depth):
        block = TransformerBlock(
            config.num_heads, config.mlp_dim, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=stochastic_depth_rate * i / max(depth - 1, 1),
            name=configs.block_name(i), **block_options)
        x = block(x) if images is None else block(x, images=images)
    return x


def _read_out(encoded, tokens: TokenLayout, classifier, fc_norm, representation_size,
              num_classes: int | None, bias_init: float):
    """The encoder's tokens -> the pooled representation, or logits when num_classes is
    given; all in float32."""
    x = TokenPooling(classifier, tokens.num_prefix, "mean" if tokens.distilled else 0,
                     dtype="float32", name=configs.POOL)(encoded)
    if fc_norm:
        x = keras.layers.LayerNormalization(epsilon=tokens.norm_epsilon, dtype="float32",
                                            name=configs.FC_NORM)(x)
    if representation_size:
        x = keras.layers.Dense(representation_size, activation="tanh", dtype="float32",
                               kernel_initializer="lecun_normal", name=configs.PRE_LOGITS)(x)
    if num_classes is None:
        return x
    if tokens.distilled:
        return _distilled_heads(encoded, num_classes, bias_init)
    return _head(configs.HEAD, num_classes, bias_init)(x)


def _head(name: str, num_classes: int, bias_init: float) -> keras.layers.Dense:
    return keras.layers.Dense(num_classes, kernel_initializer="zeros", dtype="float32",
                              bias_initializer=keras.initializers.Constant(bias_init),
                              name=name)


def _distilled_heads(encoded, num_classes: int, bias_init: float):
    """DeiT's inference output: the mean of the class token's head and the distillation
    token's head_dist."""
    logits = [_head(name, num_classes, bias_init)(
        TokenPooling("token", token=index, dtype="float32", name=pool)(encoded))
        for index, pool, name in ((0, "pool_cls", configs.HEAD),
                                  (1, configs.POOL_DIST, configs.HEAD_DIST))]
    return keras.layers.Average(dtype="float32", name="logits")(logits)


def _check_family_options(classifier, class_token, distilled, fc_norm, representation_size,
                          num_register_tokens, mlp_activation) -> None:
    check_mlp_activation(mlp_activation)
    if classifier == "token" and not class_token:
        raise ValueError("classifier='token' reads the class token: it needs class_token=True")
    if distilled and not (class_token and classifier == "token"):
        raise ValueError("distilled=True (DeiT) needs the class token and classifier='token'")
    if distilled and (fc_norm or representation_size):
        raise ValueError("distilled=True (DeiT) has neither fc_norm nor representation_size")
    if not isinstance(num_register_tokens, int) or num_register_tokens < 0:
        raise ValueError(f"num_register_tokens must be an int >= 0, got "
                         f"{num_register_tokens!r}")


def _check_arguments(config, image_size, num_classes, classifier, posemb, include_top,
                     attention_kernel, **rates) -> None:
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}: expected one of "
                         f"{', '.join(CLASSIFIERS)}")
    check_position_embedding(posemb)
    kernels.check_attention_kernel(attention_kernel)
    for rate_name, rate in rates.items():
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{rate_name} must be in [0, 1), got {rate!r}")
    if include_top and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    height, width = as_pair(image_size, "image_size")
    if config.is_hybrid and (height % config.cell_size or width % config.cell_size):
        raise ValueError(f"image_size {height}x{width} is not divisible by the hybrid's "
                         f"{config.cell_size}-pixel cells (ResNet stride {config.stem_stride} "
                         f"x patch size {config.patch_size})")


def _model_name(variant, config: ViTConfig) -> str:
    if isinstance(variant, str):
        return "vit_" + re.sub(r"[/+]", "_", variant).lower()
    return f"vit_d{config.hidden_size}_l{config.num_layers}_p{config.patch_size}"
