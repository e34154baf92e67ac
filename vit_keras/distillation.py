"""Training with a teacher as DeiT does (Touvron et al. 2021): hard or soft distillation of a
frozen teacher's logits into the student, on the distillation token's own head where the
student has one, through keras.distillation.Distiller.

DeiT's objectives, with class-head logits Z_cls, distillation-head logits Z_dist (the same
head where the student has no distillation token), teacher logits Z_t and labels y:
hard: 1/2 CE(Z_cls, y) + 1/2 CE(Z_dist, argmax Z_t); soft: (1 - lambda) CE(Z_cls, y) +
lambda tau^2 KL(softmax(Z_t / tau) || softmax(Z_dist / tau)). The Distiller weighs its label
term by student_loss_weight and its teacher term by 1 - student_loss_weight, which are these
weights. A student with a distillation token trains on both heads' logits stacked,
(batch, 2, classes); what it answers with, saved or evaluated, is their mean (vk.vit's
distilled output).
"""

from __future__ import annotations

import keras
from keras import ops

from vit_keras import configs
from vit_keras.preprocessing import InputConvention, feeding

__all__ = ["KINDS", "ClassHeadLoss", "TeacherLoss", "TeacherTerm", "distiller",
           "has_distillation_token", "heads", "served", "served_metric", "teacher_view",
           "training_student"]

KINDS = ("hard", "soft")
"""The teacher terms: DeiT's hard (the teacher's top-1 as a label) and soft (its tempered
distribution)."""


def heads(outputs):
    """(class-head logits, distillation-head logits) of a student's training output: the two
    rows of a two-head student's (batch, 2, classes), or the one head's (batch, classes) as
    both.

    Args:
        outputs: the student's training output.

    Returns:
        Two tensors of shape (batch, classes).
    """
    if len(outputs.shape) == 3:
        return outputs[:, 0], outputs[:, 1]
    return outputs, outputs


def served(outputs):
    """What the student answers with: the mean of its heads' logits (DeiT's and timm's
    inference), the one head's logits where it has one.

    Args:
        outputs: the student's training output.

    Returns:
        The logits, (batch, classes).
    """
    if len(outputs.shape) == 3:
        return ops.mean(outputs, axis=1)
    return outputs


@keras.saving.register_keras_serializable(package="vit_keras")
class ClassHeadLoss(keras.losses.Loss):
    """The label term: cross-entropy of the class head's logits against the (one-hot, maybe
    mixed) labels, with the recipe's label smoothing.

    Args:
        label_smoothing: of the one-hot labels.
        name: the loss's name.
        **kwargs: keras.losses.Loss's (reduction, dtype).
    """

    def __init__(self, label_smoothing: float = 0.0, name: str = "class_head_crossentropy",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        return keras.losses.categorical_crossentropy(
            y_true, heads(y_pred)[0], from_logits=True, label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


class TeacherTerm(keras.losses.Loss):
    """The teacher term per image, averaged over the batch as Keras averages a loss (scaled
    for a tf.distribute strategy's replicas, whose gradients are summed).

    Args:
        kind: "hard" or "soft".
        temperature: soft distillation's tau.
        **kwargs: keras.losses.Loss's (reduction, dtype).
    """

    def __init__(self, kind: str, temperature: float, **kwargs):
        super().__init__(name=f"{kind}_distillation", **kwargs)
        self.kind, self.temperature = kind, temperature

    def call(self, teacher, student):
        if self.kind == "hard":
            labels = ops.one_hot(ops.argmax(teacher, axis=-1), ops.shape(teacher)[-1])
            return keras.losses.categorical_crossentropy(labels, student, from_logits=True)
        log_teacher = ops.log_softmax(teacher / self.temperature, axis=-1)
        log_student = ops.log_softmax(student / self.temperature, axis=-1)
        divergence = ops.sum(ops.exp(log_teacher) * (log_teacher - log_student), axis=-1)
        return divergence * self.temperature**2


@keras.saving.register_keras_serializable(package="vit_keras")
class TeacherLoss(keras.distillation.DistillationLoss):
    """The teacher term on the distillation head (TeacherTerm): cross-entropy against the
    teacher's top-1 ("hard"), or tau^2 times the KL divergence of the tempered distributions
    ("soft").

    Args:
        kind: "hard" or "soft".
        temperature: soft distillation's tau.

    Raises:
        ValueError: an unknown kind, or a temperature that is not positive.
    """

    def __init__(self, kind: str, temperature: float = 3.0):
        if kind not in KINDS:
            raise ValueError(f"distillation {kind!r}: expected one of {', '.join(KINDS)}")
        if not temperature > 0:
            raise ValueError(f"distillation temperature {temperature!r}: expected a positive "
                             "number")
        self.term = TeacherTerm(kind, temperature)

    def compute_loss(self, teacher_outputs, student_outputs, **kwargs):
        return self.term(heads(teacher_outputs)[0], heads(student_outputs)[1])

    def get_config(self):
        return {"kind": self.term.kind, "temperature": self.term.temperature}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def has_distillation_token(model: keras.Model) -> bool:
    """Whether `model` is a vk.vit built with distilled=True: it has the distillation head.

    Args:
        model: a Keras model.

    Returns:
        True when a layer is named head_dist.
    """
    return any(layer.name == configs.HEAD_DIST for layer in model.layers)


def training_student(model: keras.Model) -> keras.Model:
    """The student as distillation trains it: `model` itself, or for a model with a
    distillation token, the same layers answering both heads' logits stacked,
    (batch, 2, classes), so that each term reaches its own head.

    Args:
        model: a vk.vit classifier.

    Returns:
        A keras.Model sharing `model`'s layers and weights.
    """
    if not has_distillation_token(model):
        return model
    logits = [model.get_layer(name).output for name in (configs.HEAD, configs.HEAD_DIST)]
    return keras.Model(model.input, ops.stack(logits, axis=1), name=f"{model.name}_heads")


def _conversion(source: InputConvention, target: InputConvention) -> keras.layers.Rescaling:
    """Inputs normalised by `source` renormalised by `target`, one affine map per channel:
    pixels = x std_s + mean_s on the [0, 1] scale, then (pixels - mean_t) / std_t."""
    ratio = [s / t for s, t in zip(source.std, target.std, strict=True)]
    offset = [(m_s - m_t) / t for m_s, m_t, t in zip(source.mean, target.mean, target.std,
                                                     strict=True)]
    return keras.layers.Rescaling(ratio, offset=offset, dtype="float32",
                                  name="teacher_convention")


def teacher_view(teacher: keras.Model, student: keras.Model) -> keras.Model:
    """The teacher fed what the student is fed: the student's inputs renormalised to the
    teacher's input convention and resized (bilinear) to its image size where they differ,
    its logits in float32, stacked twice for a two-head student (the Distiller checks that
    teacher and student answer in the same shape).

    Args:
        teacher: a Keras classifier of fixed image size (any architecture).
        student: the vk.vit student.

    Returns:
        A keras.Model from the student's inputs to the teacher's logits.

    Raises:
        ValueError: teacher and student with different class counts or channels.
    """
    teacher_classes = teacher.outputs[0].shape[-1]
    student_classes = student.outputs[0].shape[-1]
    if teacher_classes != student_classes:
        raise ValueError(f"the teacher answers {teacher_classes} classes and the student "
                         f"{student_classes}: expected the same classes")
    student_shape, teacher_shape = student.inputs[0].shape, teacher.inputs[0].shape
    if student_shape[-1] != teacher_shape[-1]:
        raise ValueError(f"the teacher takes {teacher_shape[-1]} channels and the student "
                         f"{student_shape[-1]}: expected the same channels")
    inputs = keras.Input(student_shape[1:], name="images")
    images = inputs
    if feeding(teacher) != feeding(student):
        images = _conversion(feeding(student), feeding(teacher))(images)
    if None not in teacher_shape[1:3] and teacher_shape[1:3] != student_shape[1:3]:
        images = keras.layers.Resizing(*teacher_shape[1:3], interpolation="bilinear",
                                       dtype="float32", name="teacher_size")(images)
    logits = ops.cast(teacher(images), "float32")
    if has_distillation_token(student):
        logits = ops.stack([logits, logits], axis=1)
    return keras.Model(inputs, logits, name=f"{teacher.name}_view")


def distiller(student: keras.Model, teacher: keras.Model, kind: str, temperature: float = 3.0,
              weight: float = 0.1) -> keras.distillation.Distiller:
    """A keras.distillation.Distiller training `student` with DeiT's objective of `kind`;
    the teacher is frozen and runs in inference mode on the student's augmented batch.

    Args:
        student: the vk.vit classifier to train (its weights are the ones trained).
        teacher: a Keras classifier of the same classes (teacher_view adapts its inputs).
        kind: "hard" or "soft".
        temperature: soft distillation's tau.
        weight: soft distillation's lambda, the teacher term's weight; hard distillation
            weighs both terms 1/2.

    Returns:
        The Distiller, to compile with a ClassHeadLoss and fit; its student is
        training_student(student).

    Raises:
        ValueError: an unknown kind, a weight outside [0, 1], or a teacher the student cannot
            be taught by (teacher_view).
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"distillation weight {weight!r}: expected a number in [0, 1]")
    label_weight = 0.5 if kind == "hard" else 1.0 - weight
    distiller = keras.distillation.Distiller(
        teacher=teacher_view(teacher, student), student=training_student(student),
        distillation_losses=TeacherLoss(kind, temperature), student_loss_weight=label_weight)
    # Its teacher and student are built functional models and it has no weights of its own;
    # marked built, BackupAndRestore can restore into it before the first step on TensorFlow.
    distiller.built = True
    return distiller


def served_metric(y_true, y_pred, metric, **kwargs):
    """A Keras metric function of what the student answers with (served), for
    keras.metrics.MeanMetricWrapper.

    Args:
        y_true: one-hot (or mixed) labels, (batch, classes).
        y_pred: the student's training output.
        metric: the metric function, such as keras.metrics.categorical_accuracy.
        **kwargs: the metric's own arguments (k of top_k_categorical_accuracy).

    Returns:
        The metric per image.
    """
    return metric(y_true, served(y_pred), **kwargs)
