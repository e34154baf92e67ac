import os
from pathlib import Path

import keras
import pytest

from tests.conftest import TINY, tf_cpu_only


def test_readme_generated_blocks_are_current():
    """Tables and measured numbers in README come from the code and docs/*.json:
    `python -m apps.readme --write` regenerates them."""
    from apps import readme

    text = (Path(__file__).parents[1] / "README.md").read_text()
    # every block is there to be rendered (a missing marker would render as "current")
    for name in readme.BLOCKS:
        assert f"<!-- {name}:begin -->" in text and f"<!-- {name}:end -->" in text, name
    assert readme.render(text) == text


def test_convert_npz_to_keras_and_back(tmp_path, capsys):
    import numpy as np

    from apps import convert
    from tests import official_layout

    params = official_layout.random_checkpoint(np.random.default_rng(0), grid=(4, 4))
    np.savez(tmp_path / "in.npz", **params)
    flags = ["--variant", "Ti/16", "--image-size", "32", "--num-classes", "7"]
    # Ti/16 does not fit the tiny checkpoint: the error says how.
    with pytest.raises(ValueError, match="checkpoint has 2 encoder blocks, the model has 12"):
        convert.main([str(tmp_path / "in.npz"), str(tmp_path / "x.keras"), *flags])
    tiny = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    convert.main([str(tmp_path / "in.npz"), str(tmp_path / "out.keras"), *tiny,
                  "--image-size", "48", "--num-classes", "7"])
    printed = capsys.readouterr().out
    assert "resampled Transformer/posembed_input/pos_embedding: grid 4x4 -> 6x6 (zoom)" in printed
    assert "wrote" in printed
    convert.main([str(tmp_path / "out.keras"), str(tmp_path / "back.npz")])
    back = np.load(tmp_path / "back.npz")
    np.testing.assert_array_equal(back["embedding/kernel"], params["embedding/kernel"])
    with pytest.raises(FileExistsError, match="back.npz' exists"):
        convert.main([str(tmp_path / "out.keras"), str(tmp_path / "back.npz")])


def saved_tiny_model(tmp_path, num_classes=2):
    import vit_keras as vk
    from tests.conftest import randomize

    model = randomize(vk.vit(TINY, image_size=32, num_classes=num_classes), scale=0.05)
    path = tmp_path / "model.keras"
    model.save(path)
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    return model, str(path)


def test_predict_prints_top_k_from_the_model(tmp_path, capsys):
    import keras
    import numpy as np
    from PIL import Image

    import vit_keras as vk
    from apps import predict

    model, path = saved_tiny_model(tmp_path)
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    results = predict.main([path, str(tmp_path / "a.png"), "--top-k", "2"])
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(vk.preprocess(pixels[None]))))
    best = int(expected[0].argmax())
    assert results[0][0] == (["cat", "dog"][best], pytest.approx(float(expected[0, best]),
                                                                 abs=1e-5))
    assert "a.png: " in capsys.readouterr().out
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n garbage")
    with pytest.raises(ValueError, match=r"cannot read image file '.*broken\.png'"):
        predict.main([path, str(tmp_path / "broken.png")])
    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        predict.main([path, str(tmp_path / "missing.png")])


def write_images(root, per_class, size, seed):
    """root/cat and root/dog with per_class random PNGs of size x size pixels each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png")
    return root


def test_evaluate_writes_metrics_and_a_confusion_matrix_png(tmp_path):
    import numpy as np
    from PIL import Image

    from apps import evaluate

    _, path = saved_tiny_model(tmp_path)
    write_images(tmp_path / "images", 3, 40, seed=1)
    report = evaluate.main([path, "--folder", str(tmp_path / "images")])
    matrix = np.array(report["confusion_matrix"])
    assert matrix.sum() == 6 and matrix.sum(axis=1).tolist() == [3, 3]
    assert report["top1"] == pytest.approx(np.trace(matrix) / 6)
    assert report["top5"] == 1.0  # two classes: the true one is always in the top 5
    with Image.open(tmp_path / "confusion_matrix.png") as png:
        assert png.format == "PNG" and png.size[0] >= 300


def test_inspect_writes_valid_pngs(tmp_path):
    import json

    import numpy as np
    from PIL import Image

    from apps import inspect

    _, path = saved_tiny_model(tmp_path)
    images = write_images(tmp_path / "images", 3, 32, seed=3)
    out = inspect.main([path, "--folder", str(images), "--images", "3",
                        "--distance-images", "6", "--out", str(tmp_path / "figs")])
    sizes = {"rollout.png": (600, 400), "filters.png": (700, 400),
             "posemb_similarity.png": (400, 400), "attention_distance.png": (500, 400)}
    for name, size in sizes.items():
        with Image.open(os.path.join(out, name)) as png:
            assert png.format == "PNG" and png.size == size, (name, png.size)
    numbers = json.loads((tmp_path / "figs" / "inspect.json").read_text())
    assert np.array(numbers["mean_attention_distance"]).shape == (2, 4)


def test_inspect_draws_a_hybrid_without_patch_filters(tmp_path):
    import json

    import vit_keras as vk
    from apps import inspect

    config = {**TINY, "patch_size": 1, "resnet_layers": (1,), "resnet_width": 32}
    vk.vit(config, image_size=32, num_classes=2).save(tmp_path / "hybrid.keras")
    images = write_images(tmp_path / "images", 2, 32, seed=4)
    out = inspect.main([str(tmp_path / "hybrid.keras"), "--folder", str(images), "--images", "2",
                        "--distance-images", "2", "--out", str(tmp_path / "figs")])
    assert sorted(os.listdir(out)) == ["attention_distance.png", "inspect.json",
                                       "posemb_similarity.png", "rollout.png"]
    numbers = json.loads((tmp_path / "figs" / "inspect.json").read_text())
    assert "not the image's 3: a hybrid's filters are not image patches" in numbers[
        "filters"]


def test_bench_smoke_runs_ours_and_both_peers_on_the_same_model(tmp_path):
    import json

    from apps import bench

    report = bench.main(["--smoke", "--peers", "timm", "keras-hub", "--json",
                         str(tmp_path / "bench.json")])
    assert report["peers"] == {"timm": True, "keras-hub": True}
    runs = {(r["implementation"], r["precision"]) for r in report["results"]}
    # On TensorFlow's CPU our other XLA choice too: without it, the smoke model being narrow.
    other = ["vit_keras-no-xla"] if tf_cpu_only() else []
    names = {precision: ["vit_keras", "timm", "keras-hub"] + other
             for precision in ("float32", "bfloat16")}
    assert runs == {(name, precision) for precision in names for name in names[precision]}
    # XLA: ours on TensorFlow and JAX in both precisions, keras-hub where Keras' "auto"
    # chooses it; timm eager.
    backend = keras.backend.backend()
    keras_auto = backend == "jax" or (backend == "tensorflow" and not tf_cpu_only())
    expected_jit = {"vit_keras": backend in ("tensorflow", "jax"), "vit_keras-no-xla": False,
                    "timm": False, "keras-hub": keras_auto}
    assert {(r["implementation"], r["precision"]): r["jit_compile"]
            for r in report["results"]} == {
        (name, precision): expected_jit[name] for precision in names for name in names[precision]}
    # The peers are built from our config: the same architecture, hence the same count.
    config = bench.vk.ViTConfig(**bench.SMOKE_MODEL)
    expected = bench.vk.vit(config, image_size=32, num_classes=1000).count_params()
    assert {r["params"] for r in report["results"]} == {expected}
    for result in report["results"]:
        assert result["infer_images_s"] > 0 and result["train_images_s"] > 0
        # Utilisation is against the matmul timed beside it: torch's for timm.
        framework = "torch" if result["implementation"] == "timm" else "keras"
        alongside = {r["matmul_gflops_s"] for r in report["results"]
                     if r["precision"] == result["precision"]
                     and (r["implementation"] == "timm") == (framework == "torch")}
        assert len(alongside) == 1 and result["matmul_gflops_s"] > 0
        # Utilisation is against the run's peak: the most its sweep or any in-turn matmul did.
        key = f"keras-{keras.backend.backend()}" if framework == "keras" else "torch"
        peak = bench.run_peaks(report)[f"{key}-{result['precision']}"]
        assert peak == max(report["matmul_gflops"][f"{key}-{result['precision']}"],
                           *alongside)
        assert bench.utilisation(report, result) == pytest.approx(
            result["infer_images_s"] * result["gflops_per_image"] / peak)
    assert set(report["matmul_size"]) == set(report["matmul_gflops"]) == {
        f"{framework}-{precision}" for framework in (f"keras-{keras.backend.backend()}", "torch")
        for precision in ("float32", "bfloat16")}
    assert report["pipeline_images_s"] > 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["backend"] == report["backend"]
    assert saved["machine"]["logical_cores"] == os.cpu_count()
    assert saved["machine"]["devices"]


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux's peak reset")
def test_peak_memory_reads_what_a_call_allocates():
    """Arrays of known size: 200 MiB touched by inference, 400 by each training step, freed
    after."""
    import numpy as np

    from apps import bench

    mib = 2**20 // 8  # float64 elements per MiB
    runner = {"infer": lambda: np.ones(200 * mib).sum(), "train": lambda: np.ones(400 * mib).sum()}
    found = bench.peak_memory_of(runner, train=True)
    assert 195 < found["infer_peak_mib"] < 240, found
    assert 395 < found["train_peak_mib"] < 440, found
    assert 395 < found["train_again_peak_mib"] < 440, found
    untrained = bench.peak_memory_of(runner, train=False)
    assert untrained["train_peak_mib"] is None and untrained["train_again_peak_mib"] is None


def test_bench_memory_measures_each_implementation_in_its_own_process(tmp_path):
    import json

    from apps import bench

    report = bench.main(["--smoke", "--memory", "--precisions", "float32", "--peers", "timm",
                         "--json", str(tmp_path / "memory.json")])
    names = ["vit_keras"] + (["vit_keras-no-xla"] if tf_cpu_only() else []) + ["timm"]
    assert [r["implementation"] for r in report["memory"]] == names
    expected = bench.vk.vit(bench.vk.ViTConfig(**bench.SMOKE_MODEL), image_size=32,
                            num_classes=1000).count_params()
    for result in report["memory"]:
        assert result["params"] == expected
        assert result["infer_peak_mib"] > 0 and result["train_peak_mib"] > 0
        assert result["train_again_peak_mib"] >= 0  # reported; its sizes: the test above
        assert result["resident_mib"] > 100  # the libraries and the model
    assert json.loads((tmp_path / "memory.json").read_text())["memory"] == report["memory"]
    table = bench.main(["--markdown", str(tmp_path / "memory.json")])
    assert table[0]["memory"] == report["memory"]
    assert "| smoke | 32 | 2 | float32 | timm | 0 |" in bench.memory_markdown(table)


def test_bench_times_implementations_in_turns_with_a_rotating_first():
    from apps import bench

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    medians = bench.timed_in_turns(calls, repeats=3, warmup=1)
    assert order == list("abc" "abc" "bca" "cab")
    assert set(medians) == set("abc") and all(s >= 0 for s in medians.values())


def test_bench_repeats_a_fast_call_within_a_sample_and_reports_seconds_per_call():
    import time

    from apps import bench

    order = []

    def sleeper(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call

    medians = bench.timed_in_turns({"fast": sleeper("fast", 0.004), "slow": sleeper("slow", 0.05)},
                                   repeats=3, warmup=0, min_sample_s=0.04)
    # One calibration call each, then per round one sample each, the first rotating; the fast
    # call is repeated to fill 0.04 s (at most 10 times: sleep never returns early).
    repeated = (order.count("fast") - 1) // 3
    fast = ["fast"] * repeated
    assert order == ["fast", "slow"] + fast + ["slow"] + ["slow"] + fast + fast + ["slow"]
    assert 3 <= repeated <= 10
    assert 0.004 <= medians["fast"] < 0.012 and 0.05 <= medians["slow"] < 0.1


def test_bench_matmul_peak_chooses_the_size_by_its_median_not_one_fast_call(monkeypatch):
    import time

    from apps import bench

    # Size 1 (2 FLOP): one lucky call of 1 ms among 20 ms ones; size 2 (16 FLOP): 10 ms each.
    # By the fastest call size 1 would win (2 FLOP in 1 ms beats 16 in 10); by medians size 2.
    sleeps = {1: iter([0.02, 0.001, 0.02, 0.02]), 2: iter([0.01] * 4)}
    monkeypatch.setattr(bench, "square_matmul", lambda framework, precision, size: (
        lambda: time.sleep(next(sleeps[size]))))
    gflops, size = bench.matmul_peak("keras", "float32", (1, 2), repeats=3)
    assert size == 2
    assert 16 / 0.015 / 1e9 < gflops <= 16 / 0.01 / 1e9  # sleep overshoots by under 5 ms


def test_bench_times_the_matmul_peak_in_the_inference_turns():
    import time

    from apps import bench

    order = []
    runners = {name: {"params": 1, "jit_compile": False,
                      "infer": lambda name=name: order.append(name),
                      "latency": lambda: None, "train": lambda: None} for name in "ab"}

    def matmul():
        order.append("matmul-keras")
        time.sleep(0.02)

    measured, peaks = bench.measure_in_turns(runners, batch=4, repeats=3, warmup=0,
                                             matmuls={"keras": (matmul, 1e9)})
    assert order == ["a", "b", "matmul-keras", "b", "matmul-keras", "a", "matmul-keras", "a", "b"]
    # 1e9 FLOP in no less than 0.02 s: at most 50 GFLOP/s (a loaded machine sleeps longer).
    assert 10 < peaks["keras"] <= 50
    assert set(measured) == {"a", "b"}


def test_bench_utilisation_divides_by_the_highest_matmul_rate_of_the_run():
    from apps import bench

    def result(name, precision, gflops, beside):
        return {"implementation": name, "precision": precision, "variant": "B/16",
                "image_size": 224, "batch": 8, "infer_images_s": gflops / 10,
                "latency_ms": 1.0, "train_images_s": None, "gflops_per_image": 10.0,
                "infer_gflops_s": gflops, "matmul_gflops_s": beside}

    report = {"backend": "jax", "matmul_gflops": {"keras-jax-float32": 100.0,
                                                  "torch-float32": 90.0},
              "results": [result("vit_keras", "float32", 80.0, 60.0),
                          result("keras-hub", "float32", 40.0, 120.0),
                          result("timm", "float32", 45.0, 80.0)],
              "pipeline_images_s": 1.0,
              "machine": {"cpu": "x", "logical_cores": 2, "isa": [], "memory_gib": 1.0,
                          "devices": ["cpu:0"]}}
    # Keras: the in-turn 120 beats the sweep's 100; torch: the sweep's 90 beats the in-turn 80.
    assert bench.run_peaks(report) == {"keras-jax-float32": 120.0, "torch-float32": 90.0}
    assert [bench.utilisation(report, r) for r in report["results"]] == pytest.approx(
        [80 / 120, 40 / 120, 45 / 90])
    table = bench.markdown([report])
    assert "| vit_keras | 8.00 |" in table and table.count("| 67% |") == 1
    assert "keras-jax-float32 120; torch-float32 90" in table


def test_machines_sentence_says_which_backends_each_machine_measured():
    from apps import bench

    def report(backend, cpu):
        return {"backend": backend, "machine": {"cpu": cpu, "logical_cores": 2, "isa": ["avx2"],
                                                "memory_gib": 24.0, "devices": ["cpu:0"]}}

    line = "{}, 2 logical cores (avx2), 24 GiB, devices cpu:0"
    assert bench.machines_sentence([report("jax", "A"), report("torch", "A")]) == (
        f"Machine: {line.format('A')}.")
    assert bench.machines_sentence(
        [report("torch", "B"), report("jax", "A"), report("tensorflow", "B")]) == (
        f"Machines: jax on {line.format('A')}; tensorflow, torch on {line.format('B')}.")


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile: torch backend")
def test_bench_torch_compile_times_our_compiled_model_which_predicts_like_eager():
    import json
    import subprocess
    import sys

    # A fresh process: torch._dynamo loaded after TensorFlow (which this one has) segfaults.
    code = """if True:
        import json
        import numpy as np
        from apps import bench
        vk = bench.vk
        model = vk.vit(vk.ViTConfig(**bench.SMOKE_MODEL), image_size=32, include_top=False)
        x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
        model.compile(jit_compile=False)
        eager = model.predict_on_batch(x)
        model.compile(jit_compile=True)
        compiled = model.predict_on_batch(x)
        report = bench.main(["--smoke", "--peers", "timm", "--precisions", "float32",
                             "--skip-training", "--torch-compile"])
        print(json.dumps({"error": float(np.abs(eager - compiled).max()),
                          "spread": float(np.abs(eager).max()),
                          "jit": {r["implementation"]: r["jit_compile"]
                                  for r in report["results"]}}))
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "KERAS_BACKEND": "torch"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["spread"] > 0.1 and found["error"] < 1e-5
    assert found["jit"] == {"vit_keras": False, "vit_keras-torch-compile": True, "timm": False,
                            "timm-compile": True}


def test_bench_sweeps_batch_sizes():
    from apps import bench

    report = bench.main(["--smoke", "--peers", "--precisions", "float32", "--skip-training",
                         "--batch", "1", "3"])
    ours = ["vit_keras"] + (["vit_keras-no-xla"] if tf_cpu_only() else [])
    assert [(r["implementation"], r["batch"]) for r in report["results"]] == [
        (name, batch) for batch in (1, 3) for name in ours]
    table = bench.markdown([report])
    assert "| smoke | 32 | 1 | float32 | vit_keras |" in table
    assert "| smoke | 32 | 3 | float32 | vit_keras |" in table


def test_bench_skip_training_measures_inference_only():
    from apps import bench

    report = bench.main(["--smoke", "--peers", "timm", "--precisions", "float32",
                         "--skip-training", "--exact-gelu"])
    assert {r["implementation"] for r in report["results"]} - {"vit_keras-no-xla"} == {
        "vit_keras", "vit_keras-erf-gelu", "timm"}
    for result in report["results"]:
        assert result["infer_images_s"] > 0 and result["train_images_s"] is None
    assert "| not run |" in bench.markdown([report])


def test_flop_count_matches_timm_figure():
    from apps import bench

    # facts section 8: B/16 at 224 is 17.58 GMACs, at 384 55.5
    assert abs(bench.forward_flops(bench.vk.get_config("B/16"), 224) / 2e9 - 17.58) < 0.1
    assert abs(bench.forward_flops(bench.vk.get_config("B/16"), 384) / 2e9 - 55.5) < 0.3


def test_finetune_resamples_a_checkpoint_to_a_new_resolution(tmp_path, capsys):
    import json

    import numpy as np

    from apps import finetune
    from tests import official_layout

    params = official_layout.random_checkpoint(np.random.default_rng(5), grid=(4, 4), classes=9)
    np.savez(tmp_path / "pretrained.npz", **params)
    write_images(tmp_path / "images", 8, 48, seed=6)
    shape = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    with pytest.warns(UserWarning, match="head .* zero-initialised"):
        result = finetune.main([str(tmp_path / "pretrained.npz"), *shape, "--classifier",
                                "token", "--posemb", "learned", "--image-size", "48",
                                "--folder", str(tmp_path / "images"), "--eval-folder",
                                str(tmp_path / "images"), "--epochs", "1", "--batch-size", "4",
                                "--grad-accum", "2", "--ema", "0.99",
                                "--run-dir", str(tmp_path / "run")])
    assert result["epochs"] == 1 and 0.0 <= result["test_accuracy"] <= 1.0
    printed = capsys.readouterr().out
    assert "resampled Transformer/posembed_input/pos_embedding: grid 4x4 -> 6x6" in printed
    assert "zero-initialised (new head)" in printed
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert list(history) == ["0"]
    assert (tmp_path / "run" / "labels.txt").read_text().split() == ["cat", "dog"]


def test_committed_main_job_model_loads_after_importing_vit_keras_alone():
    import subprocess
    import sys

    code = ("import keras, vit_keras; "
            "m = keras.saving.load_model('docs/mainjob/model.keras', safe_mode=True); "
            "print(m.count_params())")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "137802"  # the figure README quotes
