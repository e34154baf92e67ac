"""What each speed option does to a training step of the main job on the current backend: the
main job's model and optimizer built once per option (benchmarks.step_cost), all timed in one
process, taking turns, so that the machine's drift between runs falls on every option alike.
The cost per image at each option's batch against the plain step's says what an option pays.

KERAS_BACKEND=torch python -m benchmarks.step_options [--options plain batch_256 ...]
    [--repeats 7] [--json docs/mainjob/steps/options.json]
"""

import argparse

import keras

from benchmarks import write_json
from benchmarks.machine import describe_host
from benchmarks.step_cost import main_job_model, step_call
from benchmarks.timing import timed_in_turns

# Each option: apps.train flags and the batch its step is timed at; "plain" is the main job's.
OPTIONS = {
    "plain": ([], 128),
    "batch_256": ([], 256),
    "no_gradient_clipping": (["--recipe-option", "clipnorm=None"], 128),
    "jit_compile": (["--jit-compile", "true"], 128),
    "mixed_bfloat16": (["--precision", "mixed_bfloat16"], 128),
    # No speed options but the earlier defaults' plain ViTs, for their cost: 7x7-pixel patches,
    # and 4x4-pixel patches at patch dropout 0.5.
    "plain_7x7": (["--resnet-layers", "none", "--image-size", "28", "--num-layers", "4",
                   "--patch-size", "7"], 128),
    "plain_4x4_dropout": (["--resnet-layers", "none", "--image-size", "28", "--patch-size", "4",
                           "--recipe-option", "patch_drop_rate=0.5"], 128),
}


def option_models(names: list[str]) -> dict:
    """Each option's compiled model (built under the option's precision, the global policy
    float32 again afterwards) and its parsed arguments."""
    models = {name: main_job_model(OPTIONS[name][0]) for name in names}
    keras.config.set_dtype_policy("float32")
    return models


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", nargs="+", choices=list(OPTIONS), default=list(OPTIONS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = ["plain", *(name for name in args.options if name != "plain")]
    calls = {name: step_call(model, OPTIONS[name][1], run.image_size)
             for name, (model, run) in option_models(names).items()}
    seconds = timed_in_turns(calls, repeats=args.repeats, warmup=3, min_sample_s=0.5)
    per_image = {name: seconds[name] / OPTIONS[name][1] for name in names}
    rows = [{"option": name, "flags": OPTIONS[name][0], "batch": OPTIONS[name][1],
             "ms_per_step": round(1000 * seconds[name], 2),
             "ms_per_image": round(1000 * per_image[name], 4),
             "speed_vs_plain": round(per_image["plain"] / per_image[name], 2)}
            for name in names]
    report = {"backend": keras.backend.backend(), "machine": describe_host(), "rows": rows}
    write_json(report, args.json)
    print(report)
    return report


if __name__ == "__main__":
    main()
