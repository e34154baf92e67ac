"""keras-hub's ViT in: a ViTBackbone or ViTImageClassifier, as a model object or a saved
preset directory, loaded into vk.vit so that keras-hub users can move over.

keras-hub's ViT is the paper's model with the exact erf GELU (build with
approximate_gelu=False). Its variables are renamed to the canonical (pre-Linen .npz) names
and loaded by vit_keras.weights.assign.load_params; a variable of no known name, or an option
vk.vit cannot build (MLP or patch embedding without biases), is refused by name.
"""

from __future__ import annotations

import os
import re

import keras
import numpy as np

from vit_keras.weights.assign import POSEMB_KEY, LoadReport, load_params

LAYOUT = "keras-hub ViT"
# keras-hub's variable paths (from the layer that names them) -> canonical names.
OUTSIDE = {
    "vit_patching_and_embedding/class_token": "cls",
    "vit_patching_and_embedding/patch_embedding/kernel": "embedding/kernel",
    "vit_patching_and_embedding/patch_embedding/bias": "embedding/bias",
    "vit_patching_and_embedding/position_embedding/embeddings": POSEMB_KEY,
    "vit_encoder/ln/gamma": "Transformer/encoder_norm/scale",
    "vit_encoder/ln/beta": "Transformer/encoder_norm/bias",
    "pre_logits/kernel": "pre_logits/kernel", "pre_logits/bias": "pre_logits/bias",
    "predictions/kernel": "head/kernel", "predictions/bias": "head/bias",
}
IN_BLOCK = {
    "ln_1/gamma": "LayerNorm_0/scale", "ln_1/beta": "LayerNorm_0/bias",
    "ln_2/gamma": "LayerNorm_2/scale", "ln_2/beta": "LayerNorm_2/bias",
    **{f"mha/{name}/{part}": f"MultiHeadDotProductAttention_1/{name}/{part}"
       for name in ("query", "key", "value") for part in ("kernel", "bias")},
    "mha/attention_output/kernel": "MultiHeadDotProductAttention_1/out/kernel",
    "mha/attention_output/bias": "MultiHeadDotProductAttention_1/out/bias",
    **{f"mlp/dense_{i + 1}/{part}": f"MlpBlock_3/Dense_{i}/{part}"
       for i in range(2) for part in ("kernel", "bias")},
}
BLOCK = re.compile(r"vit_encoder/transformer_block_(\d+)/(.+)$")
ANCHOR = re.compile(r"(vit_patching_and_embedding|vit_encoder|pre_logits|predictions)/.*$")
# Backbone options vk.vit has no counterpart for: (config key, the value it needs, what).
UNSUPPORTED = (("use_mlp_bias", True, "an MLP without biases"),
               ("use_patch_bias", True, "a patch embedding without bias"))


def keras_hub_model(source) -> keras.Model:
    """A keras-hub model object as given, or the task (else the backbone) saved in a preset
    directory."""
    if not isinstance(source, str | os.PathLike):
        return source
    import keras_hub

    path = os.fspath(source)
    if os.path.exists(os.path.join(path, "task.json")):
        return keras_hub.models.ImageClassifier.from_preset(path)
    return keras_hub.models.Backbone.from_preset(path)


def canonical_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """keras-hub's variables under the canonical names; unknown ones refused by name."""
    backbone = getattr(model, "backbone", model)
    config = backbone.get_config()
    for key, needed, what in UNSUPPORTED:
        if config.get(key, needed) != needed:
            raise ValueError(f"the keras-hub ViT has {what} ({key}={config[key]}), which "
                             "vk.vit does not build; refusing to load a different model")
    params, unknown = {}, []
    for variable in model.weights:
        match = ANCHOR.search(variable.path)
        path = match.group(0) if match else variable.path
        block = BLOCK.match(path)
        if block and block.group(2) in IN_BLOCK:  # keras-hub counts blocks from 1
            name = f"Transformer/encoderblock_{int(block.group(1)) - 1}/{IN_BLOCK[block.group(2)]}"
        elif path in OUTSIDE:
            name = OUTSIDE[path]
        else:
            unknown.append(variable.path)
            continue
        params[name] = keras.ops.convert_to_numpy(variable)
    if unknown:
        raise ValueError(f"variables {unknown} of the keras-hub model are not part of any model "
                         "vit_keras builds; refusing to load a different model")
    params[POSEMB_KEY] = params[POSEMB_KEY][None]
    return params


def load_keras_hub(model: keras.Model, source) -> LoadReport:
    """Loads a keras-hub ViT into a vk.vit model, so that keras-hub users can move over.
    keras-hub's ViT is the paper's model with the exact erf GELU, so the model is built with
    approximate_gelu=False.

    Args:
        model: a vk.vit model of the same shape, built with approximate_gelu=False.
        source: a keras_hub ViTBackbone or ViTImageClassifier object, or a preset directory
            saved from one.

    Returns:
        The LoadReport of what was loaded.

    Raises:
        ValueError: a variable of no known name, an option vk.vit cannot build (an MLP or
            patch embedding without biases), or a model of another shape.
    """
    hub_model = keras_hub_model(source)
    name = os.fspath(source) if isinstance(source, str | os.PathLike) else hub_model.name
    return load_params(model, canonical_arrays(hub_model), name, LAYOUT)
