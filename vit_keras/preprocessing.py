"""The input convention: how uint8 pixels [0, 255] become the float input a model's weights
were trained on, (x / 255 - mean) / std per channel. Google's ViT and AugReg weights take
[-1, 1] (mean = std = 0.5, x / 127.5 - 1); DeiT, DINO, MAE and DINOv2 take ImageNet's mean
and standard deviation, CLIP OpenAI's. Each named release says which (weights.pretrained),
and a model built from one records it in a layer of its own, so that it travels with the
model through .keras files: `preprocessing` (vit(include_preprocessing=True), which applies
it) or `input_convention` (which passes the images through unchanged). A model without
either, such as one saved before the record existed, takes [-1, 1].
"""

from __future__ import annotations

import dataclasses

import keras

# The layer vit(include_preprocessing=True) puts before the patch embedding, and the one that
# records the convention of a model that takes normalised images.
MODEL_LAYER = "preprocessing"
RECORD_LAYER = "input_convention"


@dataclasses.dataclass(frozen=True)
class InputConvention:
    """A per-channel normalisation of images on the [0, 1] pixel scale: (x / 255 - mean) / std.

    Attributes:
        name: what the convention is called ("unit_range", "imagenet", "openai_clip").
        mean: the red, green and blue means subtracted, on the [0, 1] scale.
        std: the red, green and blue standard deviations divided by, on the [0, 1] scale.

    Raises:
        ValueError: a mean or std of other than 3 values, or a std that is not positive.
    """

    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __post_init__(self):
        for field in ("mean", "std"):
            values = tuple(float(v) for v in getattr(self, field))
            if len(values) != 3:
                raise ValueError(f"input convention {self.name!r}: expected 3 channel values "
                                 f"for {field}, got {len(values)}")
            object.__setattr__(self, field, values)
        if min(self.std) <= 0:
            raise ValueError(f"input convention {self.name!r}: expected positive std, got "
                             f"{self.std}")

    @property
    def per_channel(self) -> bool:
        """Whether the channels differ, so that only 3-channel images take the convention."""
        return len(set(self.mean)) > 1 or len(set(self.std)) > 1

    @property
    def scale(self) -> float | tuple[float, ...]:
        """What [0, 255] pixels are multiplied by: 1 / (255 std); one number where the
        channels share it, so that images of any channel count take it."""
        return _per_channel(1 / (255 * s) for s in self.std)

    @property
    def offset(self) -> float | tuple[float, ...]:
        """What is added after scaling: -mean / std."""
        return _per_channel(-m / s for m, s in zip(self.mean, self.std, strict=True))

    def layer(self, name: str | None = None, dtype=None) -> keras.layers.Rescaling:
        """The convention as a Keras Rescaling layer, for models and for tf.data pipelines
        on any backend (Keras runs it in TensorFlow there).

        Args:
            name: the layer's name.
            dtype: the layer's dtype policy (float32 for a model's first layer).

        Returns:
            A layer mapping [0, 255] pixels of any dtype to the normalised input.
        """
        return keras.layers.Rescaling(self.scale, offset=self.offset, name=name, dtype=dtype)

    def to_config(self) -> dict:
        """The convention as plain JSON values, as a layer's config keeps it."""
        return {"name": self.name, "mean": list(self.mean), "std": list(self.std)}


def _per_channel(values) -> float | tuple[float, ...]:
    values = tuple(values)
    return values[0] if len(set(values)) == 1 else values


UNIT_RANGE = InputConvention("unit_range", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
# Pixels as they are, [0, 255]: what a model with its own preprocessing layer is fed.
RAW_PIXELS = InputConvention("raw_pixels", (0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255))
IMAGENET = InputConvention("imagenet", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OPENAI_CLIP = InputConvention("openai_clip", (0.48145466, 0.4578275, 0.40821073),
                              (0.26862954, 0.26130258, 0.27577711))


def _from_config(convention) -> InputConvention:
    return (convention if isinstance(convention, InputConvention)
            else InputConvention(**convention))


class _Recorded:
    """The record a model's layer keeps: the convention, and the release the weights came
    from (None when the caller named a convention instead)."""

    def _init_record(self, convention: InputConvention, release: str | None) -> None:
        self.convention = convention
        self.release = release

    def _record_config(self) -> dict:
        return {"convention": self.convention.to_config(), "release": self.release}


@keras.saving.register_keras_serializable(package="vit_keras")
class InputRecord(_Recorded, keras.layers.Identity):
    """Passes the images through unchanged; its config records the input convention and
    the release of a model that takes normalised images (vit(weights=RELEASE)), so that
    vk.preprocess, the apps and the exports can normalise for it. It has no weights and no
    computation: loaders, features and exports see the model they saw without it.

    Args:
        convention: an InputConvention or its config dict.
        release: the release name the weights came from, or None.
        **kwargs: Keras layer arguments (name).
    """

    def __init__(self, convention, release: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self._init_record(_from_config(convention), release)

    def get_config(self) -> dict:
        return {**super().get_config(), **self._record_config()}


@keras.saving.register_keras_serializable(package="vit_keras")
class Normalize(_Recorded, keras.layers.Rescaling):
    """The model's own preprocessing (vit(include_preprocessing=True)): [0, 255] pixels of
    any dtype -> (x / 255 - mean) / std in float32, with the convention (and release) as its
    config.

    Args:
        convention: an InputConvention or its config dict.
        release: the release name the weights came from, or None.
        **kwargs: Keras layer arguments (name, dtype).
    """

    def __init__(self, convention, release: str | None = None, **kwargs):
        convention = _from_config(convention)
        super().__init__(convention.scale, offset=convention.offset, **kwargs)
        self._init_record(convention, release)

    def get_config(self) -> dict:
        config = {**super().get_config(), **self._record_config()}
        del config["scale"], config["offset"]
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def input_layer(include_preprocessing: bool, convention: InputConvention | None,
                release: str | None = None, channels: int = 3) -> keras.layers.Layer | None:
    """The layer vit() puts after its input: Normalize when it takes raw pixels, an
    InputRecord when there is a convention to record, else none, so that a model without a
    convention is the model it was before records existed.

    Args:
        include_preprocessing: whether the model takes raw pixels and normalises them.
        convention: the convention to record, or None ([-1, 1], recorded only by Normalize).
        release: the release the weights come from, or None.
        channels: the model's image channels.

    Returns:
        The layer, or None for no layer.

    Raises:
        ValueError: a per-channel convention for a model of other than 3 channels.
    """
    if convention is not None and convention.per_channel and channels != 3:
        raise ValueError(f"input convention {convention.name!r} normalises 3 channels, "
                         f"but the model takes {channels}")
    if include_preprocessing:
        return Normalize(convention or UNIT_RANGE, release, name=MODEL_LAYER, dtype="float32")
    if convention is None:
        return None
    return InputRecord(convention, release, name=RECORD_LAYER)


def _record(model: keras.Model) -> _Recorded | None:
    """The model's record layer, searched in nested models too (a serving model, a
    wrapper); None for a model without one."""
    for layer in model.layers:
        if isinstance(layer, _Recorded):
            return layer
    for layer in model.layers:
        if isinstance(layer, keras.Model) and (found := _record(layer)) is not None:
            return found
    return None


def release_of(model: keras.Model) -> str | None:
    """The named release a model's weights came from, as vk.vit(weights=RELEASE) records it
    in the model (it survives .keras files).

    Args:
        model: a vk.vit model, or a model with one inside.

    Returns:
        The release name (vit_keras.weights.pretrained), or None for a model built without
        one (random weights, a file path) or saved before records existed.
    """
    record = _record(model)
    return record.release if record is not None else None


def input_convention(model_or_release) -> InputConvention:
    """The input convention of a model or of a named release.

    Args:
        model_or_release: a Keras model (its record; [-1, 1] when it has none, as every
            model had before records existed), a release name such as "deit_in1k", or an
            InputConvention (returned as it is).

    Returns:
        The InputConvention.

    Raises:
        ValueError: for a name that is no release.
        TypeError: for anything else.
    """
    if isinstance(model_or_release, InputConvention):
        return model_or_release
    if isinstance(model_or_release, str):
        from vit_keras.weights import pretrained  # the registry imports this module

        return pretrained.release(model_or_release).convention
    if isinstance(model_or_release, keras.Model):
        record = _record(model_or_release)
        return record.convention if record is not None else UNIT_RANGE
    raise TypeError(f"expected a Keras model, a release name or an InputConvention, got "
                    f"{type(model_or_release).__name__}")


def takes_raw_images(model: keras.Model) -> bool:
    """Whether `model` scales [0, 255] pixels itself (vit(include_preprocessing=True)), so
    that nothing before it may scale them again; by the layer's name, which models saved
    before records existed share.

    Args:
        model: a Keras model.

    Returns:
        True when the model has a layer named "preprocessing".
    """
    return any(layer.name == MODEL_LAYER for layer in model.layers)


def feeding(model: keras.Model) -> InputConvention:
    """What a pipeline feeding `model` applies: the model's convention, or nothing (the
    pixels as they are, RAW_PIXELS) for a model that normalises them itself.

    Args:
        model: a Keras model.

    Returns:
        The InputConvention for vit_keras.data.make_pipeline(convention=...).
    """
    return RAW_PIXELS if takes_raw_images(model) else input_convention(model)


def preprocess(images, convention=None):
    """uint8 images -> the float32 input a model takes: (x / 255 - mean) / std.

    Args:
        images: uint8 (or float in [0, 255]) images, NumPy or backend tensors,
            (batch, height, width, channels).
        convention: None for [-1, 1] (Google's ViT and AugReg weights, and any model
            without a record); a vk.vit model, whose recorded convention is used (and whose
            own preprocessing, include_preprocessing=True, gets the pixels as they are); a
            release name such as "deit_in1k"; or an InputConvention.

    Returns:
        A float32 tensor of the images' shape.

    Raises:
        ValueError: a name that is no release.
        TypeError: a convention of another type.
    """
    images = keras.ops.cast(images, "float32")
    if isinstance(convention, keras.Model):
        convention = feeding(convention)
    return input_convention(UNIT_RANGE if convention is None else convention).layer()(images)
