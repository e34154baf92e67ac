"""The ResNet in front of the paper's hybrid models (R50+B/16 and friends), and the same
ResNet as a classifier of its own (a convnet teacher for distillation, a baseline).

BiT-style ResNet v1 as in vit_jax models_resnet.py: weight-standardised convolutions without
bias, GroupNorm with 32 groups and Flax's epsilon, SAME padding. Layers are named like the
official checkpoint tree (conv_root, gn_root, block{i}/unit{j}/{conv,gn}{1,2,3,_proj}); Keras
forbids '/' in layer names, so unit j of stage i is the layer `block{i}_unit{j}`.
"""

from __future__ import annotations

import keras

from vit_keras import configs, kernels

__all__ = ["GroupNorm", "MaxPool", "ResidualUnit", "StdConv", "classifier", "resnet_stem"]

GROUP_NORM_GROUPS = 32
GROUP_NORM_EPSILON = 1e-6  # Flax nn.GroupNorm's default
WEIGHT_STD_EPSILON = 1e-5  # added to the kernel's standard deviation, as vit_jax does

# BiT's ResNet-50: bottleneck units per stage (classifier's default)
RESNET50_UNITS = (3, 4, 6, 3)

_register = keras.saving.register_keras_serializable(package="vit_keras")


@_register
class GroupNorm(keras.layers.GroupNormalization):
    """Keras' GroupNormalization over channels-last maps, by kernels.group_norm; call can add
    a residual and apply a ReLU after the norm, which a ResidualUnit does in one pass."""

    def call(self, inputs, relu=False, residual=None):
        return kernels.group_norm(inputs, self, relu, residual)


@_register
class MaxPool(keras.layers.MaxPooling2D):
    """Keras' MaxPooling2D over channels-last maps, by kernels.max_pool."""

    def call(self, inputs):
        return kernels.max_pool(inputs, self)


def group_norm(name: str, **kwargs) -> GroupNorm:
    return GroupNorm(GROUP_NORM_GROUPS, epsilon=GROUP_NORM_EPSILON, name=name, **kwargs)


@_register
class StdConv(keras.layers.Conv2D):
    """Convolution whose kernel is standardised per output filter (zero mean, unit standard
    deviation over height, width and input channels) on every call. The variable keeps the raw
    kernel, which is what the checkpoints store. SAME padding, no bias and Flax's
    lecun_normal initialiser unless the keyword arguments say otherwise.

    Args:
        filters: the output channels.
        kernel_size: the kernel's side, or (height, width).
        strides: the convolution's stride.
        **kwargs: keras.layers.Conv2D's other arguments.
    """

    def __init__(self, filters, kernel_size, strides=1, **kwargs):
        kwargs.setdefault("padding", "same")
        kwargs.setdefault("use_bias", False)
        kwargs.setdefault("kernel_initializer", "lecun_normal")  # Flax's Conv default
        super().__init__(filters, kernel_size, strides=strides, **kwargs)

    def convolution_op(self, inputs, kernel):
        kernel = kernels.standardized_kernel(kernel, WEIGHT_STD_EPSILON, inputs.dtype)
        return kernels.conv2d(inputs, kernel, self)


@_register
class ResidualUnit(keras.layers.Layer):
    """Bottleneck unit: 1x1 -> 3x3 (strided) -> 1x1 to 4 x features channels, GroupNorm after
    each, added to the input (projected by conv_proj + gn_proj when the shape changes), ReLU.
    gn3 starts at zero, so a fresh unit passes its shortcut through.

    Args:
        features: the bottleneck's channels; the unit outputs 4 x features.
        strides: the 3x3 convolution's stride (2 halves the map).
        **kwargs: a Keras layer's arguments (name, dtype, trainable).
    """

    def __init__(self, features: int, strides: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.features = features
        self.strides = strides
        # the unit's dtype policy: call() runs the sublayers' call, which casts nothing
        policy = self.dtype_policy
        self.conv1 = StdConv(features, 1, name="conv1", dtype=policy)
        self.gn1 = group_norm("gn1", dtype=policy)
        self.conv2 = StdConv(features, 3, strides, name="conv2", dtype=policy)
        self.gn2 = group_norm("gn2", dtype=policy)
        self.conv3 = StdConv(4 * features, 1, name="conv3", dtype=policy)
        self.gn3 = group_norm("gn3", gamma_initializer="zeros", dtype=policy)
        self.conv_proj = self.gn_proj = None  # known at build: only if the shape changes

    def _output_shape(self, input_shape, channels):
        batch, height, width, _ = input_shape
        height, width = (None if side is None else -(-side // self.strides)  # SAME: ceil
                         for side in (height, width))
        return (batch, height, width, channels)

    def build(self, input_shape):
        inner = (*input_shape[:3], self.features)
        strided = self._output_shape(input_shape, self.features)
        output = self._output_shape(input_shape, 4 * self.features)
        if input_shape[-1] != 4 * self.features or self.strides != 1:
            self.conv_proj = StdConv(4 * self.features, 1, self.strides, name="conv_proj",
                                     dtype=self.dtype_policy)
            self.gn_proj = group_norm("gn_proj", dtype=self.dtype_policy)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(output)
        for layer, shape in ((self.conv1, input_shape), (self.gn1, inner), (self.conv2, inner),
                             (self.gn2, strided), (self.conv3, strided), (self.gn3, output)):
            layer.build(shape)

    def call(self, x):
        # The sublayers' call, not their __call__: a Keras layer call costs an eager backend
        # more than a small unit's arithmetic (as TransformerBlock's sublayers).
        shortcut = x if self.conv_proj is None else self.gn_proj.call(self.conv_proj.call(x))
        y = self.gn1.call(self.conv1.call(x), relu=True)
        y = self.gn2.call(self.conv2.call(y), relu=True)
        return self.gn3.call(self.conv3.call(y), relu=True, residual=shortcut)

    def compute_output_shape(self, input_shape):
        return self._output_shape(input_shape, 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides}


def resnet_stem(images, stage_units: tuple[int, ...], width: int = 64):
    """The hybrids' ResNet on a functional model's images: the root (7x7/2 StdConv,
    GroupNorm, ReLU, 3x3/2 max-pool) and the bottleneck stages; stage i has width * 2**i
    features, and every stage after the first halves the map.

    Args:
        images: the symbolic images (batch, height, width, channels).
        stage_units: the ResidualUnits of each stage; an empty tuple is the root alone.
        width: the root's channels.

    Returns:
        The feature map, a quarter of the images' size for the root alone, halved again by
        each stage after the first.
    """
    x = StdConv(width, 7, 2, name="conv_root")(images)
    x = group_norm("gn_root")(x)
    x = keras.layers.ReLU(name="root_relu")(x)
    x = MaxPool(3, 2, padding="same", name="root_pool")(x)
    for stage, units in enumerate(stage_units):
        for unit in range(units):
            strides = 2 if stage > 0 and unit == 0 else 1
            x = ResidualUnit(width * 2**stage, strides,
                             name=f"block{stage + 1}_unit{unit + 1}")(x)
    return x


def classifier(image_size, num_classes: int, stage_units: tuple[int, ...] = RESNET50_UNITS,
               width: int = 64, channels: int = 3, name: str | None = None) -> keras.Model:
    """The hybrids' ResNet as an image classifier: resnet_stem, global average pooling and a
    zero-initialised Dense head, as BiT's ResNet v1 ends. Its units end in a ReLU after the
    residual sum (v1), so the map is pooled as it is; BiT's pre-activation v2 needs a last
    GroupNorm and ReLU there, this ResNet does not. It takes float NHWC images in [-1, 1], as
    vk.vit does, so the apps' pipelines, evaluate, predict and a distillation teacher treat
    the two alike; the pooling and the head run in float32 under any dtype policy, so the
    logits are float32.

    Args:
        image_size: an int, or (height, width).
        num_classes: the head's width.
        stage_units: bottleneck units per stage (BiT's ResNet-50 by default); an empty tuple
            is the root alone.
        width: the root's channels; stage i has width * 2**i features and outputs four times
            that.
        channels: the images' channels.
        name: the model's name (default: resnet_ and the units and width, resnet_3_4_6_3_w64).

    Returns:
        A functional keras.Model from images (batch, height, width, channels) to logits
        (batch, num_classes).

    Raises:
        ValueError: a stage of no units, a size or class count under 1, or a width that is
            no multiple of GroupNorm's 32 groups.
    """
    height, width_px = configs.as_pair(image_size, "image_size")
    stage_units = tuple(stage_units)
    if not all(isinstance(units, int) and units >= 1 for units in stage_units):
        raise ValueError(f"stage_units: expected a positive number of units per stage, got "
                         f"{stage_units}")
    for what, value in (("num_classes", num_classes), ("width", width)):
        if value < 1:
            raise ValueError(f"{what}: expected at least 1, got {value}")
    if width % GROUP_NORM_GROUPS:
        raise ValueError(f"width: expected a multiple of {GROUP_NORM_GROUPS} (GroupNorm's "
                         f"groups), got {width}")
    images = keras.Input((height, width_px, channels), name="images")
    x = resnet_stem(images, stage_units, width)
    x = keras.layers.GlobalAveragePooling2D(dtype="float32", name="pool")(x)
    logits = keras.layers.Dense(num_classes, kernel_initializer="zeros", dtype="float32",
                                name="head")(x)
    units = "_".join(map(str, stage_units)) or "root"
    return keras.Model(images, logits, name=name or f"resnet_{units}_w{width}")
