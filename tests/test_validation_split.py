"""The validation split carved from the training images (vit_keras.data.split_last, apps.train
--validation-split) and the main job's tries that record it (benchmarks.mainjob --try)."""

import json
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import backend_independent, claim_run
from vit_keras import data, training

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
TINY_FLAGS = ["--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "32",
              "--patch-size", "7", "--resnet-layers", "none", "--image-size", "28",
              "--batch-size", "64", "--jit-compile", "false"]


@backend_independent
def test_split_last_holds_out_the_last_examples_and_refuses_an_empty_side():
    dataset = data.from_arrays(np.zeros((10, 2, 2), "uint8"), np.arange(10))
    rest, held_out = data.split_last(dataset, 3)
    assert [int(label) for _, label in rest] == list(range(7))
    assert [int(label) for _, label in held_out] == [7, 8, 9]
    unknown_size = dataset.filter(lambda image, label: label >= 0)  # cardinality unknown
    assert [int(label) for _, label in data.split_last(unknown_size, 9)[1]] == list(range(1, 10))
    for count in (10, 0):
        with pytest.raises(ValueError, match=f"a validation split of {count} images must leave "
                                             f"some to train on: expected 1 to 9, got {count}"):
            data.split_last(dataset, count)


@backend_independent
@pytest.mark.skipif(not (FASHION_MNIST / "train-labels-idx1-ubyte.gz").exists(),
                    reason="needs Debian's dataset-fashion-mnist")
def test_train_app_scores_the_last_training_images_and_never_reads_the_test_split(
        tmp_path, monkeypatch):
    import keras

    from apps import train

    labels = data.read_idx(str(FASHION_MNIST / "train-labels-idx1-ubyte.gz"))
    read_splits = []
    load_source = data.load_source

    def recording_load_source(dataset, split, *rest):
        read_splits.append(split)
        return load_source(dataset, split, *rest)

    monkeypatch.setattr(data, "load_source", recording_load_source)
    save = keras.Model.save

    def slow_final_save(model, path, *rest, **options):  # the run's model.keras, after fit
        if str(path).endswith("model.keras"):
            time.sleep(3.0)
        return save(model, path, *rest, **options)

    monkeypatch.setattr(keras.Model, "save", slow_final_save)
    args = train.build_parser().parse_args(["--validation-split", "64"])
    rest, held_out, _ = train.load_sources(args)
    assert train.count_examples(rest) == 60000 - 64
    assert [int(label) for _, label in held_out] == labels[-64:].tolist()

    result = train.main(["--validation-split", "64", "--limit", "128", "--epochs", "1",
                         "--eval-every", "1", "--run-dir", str(tmp_path), *TINY_FLAGS])
    assert set(read_splits) == {"train"}
    assert "test_accuracy" not in result and result["data"]["validation_split"] == 64
    assert result["data"]["dataset"] == "fashion_mnist" and "folder" not in result["data"]
    history = json.loads((tmp_path / "history.json").read_text())
    # the final single-view score is the epoch's evaluation of the same 64 images, with the
    # same weights; the recipe's score averages each image with its mirror
    assert result["validation_accuracy_single_view"] == round(history["0"]["val_accuracy"], 4)
    assert training.RECIPES["fashion_mnist"].test_time_flip and "validation_accuracy" in result
    assert 0 < history["0"]["epoch_seconds"] <= result["fit_seconds"] + 0.1
    # model.fit's seconds end where fit does: the save after it is counted on its own
    assert result["save_seconds"] >= 3.0
    assert result["fit_seconds"] < history["0"]["epoch_seconds"] + 3.0


@backend_independent
def test_mainjob_try_records_the_runs_result_epoch_seconds_and_cpu(tmp_path, monkeypatch):
    import subprocess

    from benchmarks import machine, mainjob

    def fake_main_sh(command, check):
        run_dir = claim_run(command[2:])
        (run_dir / "result.json").write_text(json.dumps(
            {"epochs": 2, "backend": keras.backend.backend(), "validation_accuracy": 0.9,
             "fit_seconds": 50.0}))
        (run_dir / "history.json").write_text(json.dumps(  # keys as text: "10" before "2"
            {str(epoch): {"loss": 0.5, "epoch_seconds": 30.0 - epoch}
             for epoch in sorted(range(11), key=str)}))
        calls.append(command)

    calls = []
    monkeypatch.setattr(subprocess, "run", fake_main_sh)
    monkeypatch.setattr(mainjob, "revision", lambda tree: "abc1234")
    flags = ["--validation-split", "10000", "--epochs", "2", "--seed", "1"]  # apps.train's seed
    report = mainjob.main(["--try", "e2", "--out", str(tmp_path / "runs"), "--docs",
                           str(tmp_path / "docs"), *flags])
    run_dir = str(tmp_path / "runs" / "tries" / "e2")
    assert calls == [["bash", "scripts/main.sh", "--run-dir", run_dir, *flags]]
    assert report["command"] == ("bash scripts/main.sh --validation-split 10000 --epochs 2 "
                                 "--seed 1")
    assert (report["validation_accuracy"], report["revision"]) == (0.9, "abc1234")
    assert report["epoch_seconds"] == [30.0 - epoch for epoch in range(11)]  # epoch by epoch
    assert report["backend"] == keras.backend.backend()  # the run's, as result.json says
    cpu = machine.first_cpu_info()
    assert report["machine"]["cpu"] and report["machine"]["cpu"] == cpu.get(
        "model name", report["machine"]["cpu"])
    assert set(report["machine"]["isa"]) == set(machine.ISA_FLAGS) & set(
        cpu.get("flags", "").split())
    tries = tmp_path / "docs" / "tries"
    assert json.loads((tries / "e2.json").read_text()) == report
    assert json.loads((tries / "e2.history.json").read_text())["10"]["epoch_seconds"] == 20.0
    with pytest.raises(SystemExit) as refused:  # the seeds' runs are the final, test-split ones
        mainjob.main(["--seeds", "0", "--out", str(tmp_path / "runs"), *flags])
    assert refused.value.code == 2 and len(calls) == 1
