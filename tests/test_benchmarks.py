import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from benchmarks import SMOKE_MODEL
from tests.conftest import backend_independent, claim_run, in_tensorflow_pass

ROOT = Path(__file__).parents[1]

def smoke_params():
    import vit_keras as vk

    return vk.vit(vk.ViTConfig(**SMOKE_MODEL), image_size=32, num_classes=1000).count_params()


def keras_auto_uses_xla() -> bool:
    """Where Keras' jit_compile="auto" resolves to XLA: JAX, and TensorFlow on an accelerator."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        return backend == "jax"
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU") + tf.config.list_physical_devices("TPU"))


def test_bench_smoke_runs_ours_and_both_peers_on_the_same_model(tmp_path):
    from benchmarks import bench, tables

    report = bench.main(["--smoke", "--peers", "timm", "keras-hub", "--json",
                         str(tmp_path / "bench.json")])
    assert report["peers"] == {"timm": True, "keras-hub": True}
    names = ["vit_keras", "timm", "keras-hub"]
    assert [(r["implementation"], r["precision"]) for r in report["results"]] == [
        (name, precision) for precision in ("float32", "bfloat16") for name in names]
    # Ours and keras-hub get Keras' "auto"; timm runs eager.
    auto = keras_auto_uses_xla()
    assert {r["implementation"]: r["jit_compile"] for r in report["results"]} == {
        "vit_keras": auto, "timm": False, "keras-hub": auto}
    # The peers are built from our config: the same architecture, hence the same count.
    assert {r["params"] for r in report["results"]} == {smoke_params()}
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
        peak = tables.run_peaks(report)[f"{key}-{result['precision']}"]
        assert peak == max(report["matmul_gflops"][f"{key}-{result['precision']}"],
                           *alongside)
        assert tables.utilisation(report, result) == pytest.approx(
            result["infer_images_s"] * result["gflops_per_image"] / peak)
    assert set(report["matmul_size"]) == set(report["matmul_gflops"]) == {
        f"{framework}-{precision}" for framework in (f"keras-{keras.backend.backend()}", "torch")
        for precision in ("float32", "bfloat16")}
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["backend"] == report["backend"]
    assert saved["machine"]["logical_cores"] == os.cpu_count()
    assert saved["machine"]["devices"]


def test_bench_jit_compile_adds_a_row_of_ours_per_value():
    from benchmarks import bench

    # "true" is left out: on PyTorch it is torch.compile (its own test below).
    report = bench.main(["--smoke", "--peers", "--precisions", "float32", "--skip-training",
                         "--jit-compile", "false", "auto"])
    assert {r["implementation"]: r["jit_compile"] for r in report["results"]} == {
        "vit_keras": False, "vit_keras jit_compile=auto": keras_auto_uses_xla()}
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--jit-compile", "auto", "auto"])
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--jit-compile", "xla"])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux's peak reset")
def test_peak_memory_reads_what_a_call_allocates():
    """Arrays of known size: 200 MiB touched by inference, 400 by each training step, freed
    after."""
    import numpy as np

    from benchmarks import memory

    mib = 2**20 // 8  # float64 elements per MiB
    runner = {"infer": lambda: np.ones(200 * mib).sum(), "train": lambda: np.ones(400 * mib).sum()}
    found = memory.peak_memory_of(runner, train=True)
    assert 195 < found["infer_peak_mib"] < 240, found
    assert 395 < found["train_peak_mib"] < 440, found
    assert 395 < found["train_again_peak_mib"] < 440, found
    untrained = memory.peak_memory_of(runner, train=False)
    assert untrained["train_peak_mib"] is None and untrained["train_again_peak_mib"] is None


@backend_independent  # the processes and their peaks; each backend's figures: the test above
def test_bench_memory_measures_each_implementation_in_its_own_process(tmp_path):
    from benchmarks import bench, render

    report = bench.main(["--smoke", "--memory", "--precisions", "float32", "--peers", "timm",
                         "--json", str(tmp_path / "memory.json")])
    assert [r["implementation"] for r in report["memory"]] == ["vit_keras", "timm"]
    for result in report["memory"]:
        assert result["params"] == smoke_params()
        assert result["infer_peak_mib"] > 0 and result["train_peak_mib"] > 0
        assert result["train_again_peak_mib"] >= 0  # reported; its sizes: the test above
        assert result["resident_mib"] > 100  # the libraries and the model
    assert json.loads((tmp_path / "memory.json").read_text())["memory"] == report["memory"]
    # the smoke model's weights are well under a MiB; its peaks are the figures above
    row = "| {} | smoke | 32 | 2 | float32 | timm | false | 0 | {:,.0f} |".format(
        report["backend"], report["memory"][1]["infer_peak_mib"])
    assert row in render.MEMORY.render([report])


@backend_independent
def test_bench_times_implementations_in_turns_with_a_rotating_first():
    from benchmarks import timing

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    medians = timing.timed_in_turns(calls, repeats=3, warmup=1)
    assert order == list("abc" "abc" "bca" "cab")
    assert set(medians) == set("abc") and all(s >= 0 for s in medians.values())


@backend_independent
def test_bench_repeats_a_fast_call_within_a_sample_and_reports_seconds_per_call():
    import time

    from benchmarks import timing

    order = []

    def sleeper(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call

    medians = timing.timed_in_turns({"fast": sleeper("fast", 0.004),
                                     "slow": sleeper("slow", 0.05)},
                                    repeats=3, warmup=0, min_sample_s=0.04)
    # One calibration call each, then per round one sample each, the first rotating; the fast
    # call is repeated to fill 0.04 s (at most 10 times: sleep never returns early).
    repeated = (order.count("fast") - 1) // 3
    fast = ["fast"] * repeated
    assert order == ["fast", "slow"] + fast + ["slow"] + ["slow"] + fast + fast + ["slow"]
    assert 3 <= repeated <= 10
    assert 0.004 <= medians["fast"] < 0.012 and 0.05 <= medians["slow"] < 0.1


@backend_independent
def test_bench_matmul_peak_chooses_the_size_by_its_median_not_one_fast_call(monkeypatch):
    import time

    from benchmarks import timing

    # Size 1 (2 FLOP): one lucky call of 1 ms among 20 ms ones; size 2 (16 FLOP): 10 ms each.
    # By the fastest call size 1 would win (2 FLOP in 1 ms beats 16 in 10); by medians size 2.
    sleeps = {1: iter([0.02, 0.001, 0.02, 0.02]), 2: iter([0.01] * 4)}
    monkeypatch.setattr(timing, "square_matmul", lambda framework, precision, size: (
        lambda: time.sleep(next(sleeps[size]))))
    gflops, size = timing.matmul_peak("keras", "float32", (1, 2), repeats=3)
    assert size == 2
    assert 16 / 0.1 / 1e9 < gflops <= 16 / 0.01 / 1e9  # a loaded machine oversleeps


def test_bench_times_the_matmul_peak_in_the_inference_turns():
    import time

    from benchmarks import timing

    order = []
    runners = {name: {"params": 1, "jit_compile": False,
                      "infer": lambda name=name: order.append(name) or (
                          time.sleep(0.02) if name == "a" else None),
                      "latency": lambda: None, "train": lambda: time.sleep(0.01)}
               for name in "ab"}

    def matmul():
        order.append("matmul-keras")
        time.sleep(0.02)

    measured, peaks = timing.measure_in_turns(runners, batch=4, repeats=3, warmup=0,
                                              matmuls={"keras": (matmul, 1e9)})
    assert order == ["a", "b", "matmul-keras", "b", "matmul-keras", "a", "matmul-keras", "a", "b"]
    # 1e9 FLOP in no less than 0.02 s: at most 50 GFLOP/s (a loaded machine sleeps longer).
    assert 10 < peaks["keras"] <= 50
    assert set(measured) == {"a", "b"}
    # 4 images in no less than 0.02 s: at most 200 images a second, likewise 400 to train
    assert 40 < measured["a"]["infer_images_s"] <= 200
    assert 80 < measured["a"]["train_images_s"] <= 400


@backend_independent
def test_bench_utilisation_divides_by_the_highest_matmul_rate_of_the_run():
    from benchmarks import render, tables

    def result(name, precision, gflops, beside):
        return {"implementation": name, "precision": precision, "variant": "B/16",
                "image_size": 224, "batch": 8, "infer_images_s": gflops / 10,
                "latency_ms": 1.0, "train_images_s": None, "gflops_per_image": 10.0,
                "infer_gflops_s": gflops, "matmul_gflops_s": beside, "jit_compile": True}

    report = {"backend": "jax", "matmul_gflops": {"keras-jax-float32": 100.0,
                                                  "torch-float32": 90.0},
              "results": [result("vit_keras", "float32", 80.0, 60.0),
                          result("keras-hub", "float32", 40.0, 120.0),
                          result("timm", "float32", 45.0, 80.0)],
              "machine": {"cpu": "x", "logical_cores": 2, "isa": [], "memory_gib": 1.0,
                          "devices": ["cpu:0"]}}
    # Keras: the in-turn 120 beats the sweep's 100; torch: the sweep's 90 beats the in-turn 80.
    assert tables.run_peaks(report) == {"keras-jax-float32": 120.0, "torch-float32": 90.0}
    assert [tables.utilisation(report, r) for r in report["results"]] == pytest.approx(
        [80 / 120, 40 / 120, 45 / 90])
    # the speed table's last column: 80 of 120 GFLOP/s; rates under 10 images/s to two places
    table = render.BENCH.render([report])
    assert ("| jax | B/16 | 224 | 8 | float32 | vit_keras | true | 8.00 | 1.0 | not run | 10.00 "
            "| 67% |") in table
    assert table.count("| 67% |") == 1 and table.count("| 50% |") == 1


@backend_independent
def test_machine_line_names_a_thread_cap_and_the_vector_extensions():
    from benchmarks import machine

    capped = {"cpu": "A", "logical_cores": 2, "isa": ["avx2", "fma", "avx512f"],
              "memory_gib": 24.0, "OMP_NUM_THREADS": "1"}
    assert machine.machine_line(capped) == (
        "A, 2 logical cores (avx2, fma, avx512f), 24 GiB, OMP_NUM_THREADS=1")
    emulated = {**capped, "OMP_NUM_THREADS": None, "ATEN_CPU_CAPABILITY": "avx2",
                "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert machine.machine_line(emulated) == (
        "A, 2 logical cores (avx2, fma, avx512f), 24 GiB, ATEN_CPU_CAPABILITY=avx2, "
        "ONEDNN_MAX_CPU_ISA=AVX2")
    allocator = {**capped, "OMP_NUM_THREADS": None, "MALLOC_MMAP_THRESHOLD_": "33554432",
                 "MALLOC_TRIM_THRESHOLD_": "4294967296"}
    assert machine.machine_line(allocator) == (
        "A, 2 logical cores (avx2, fma, avx512f), 24 GiB, MALLOC_MMAP_THRESHOLD_=33554432, "
        "MALLOC_TRIM_THRESHOLD_=4294967296")


@backend_independent
def test_machine_description_reads_the_cpu_flags():
    from benchmarks import machine

    described = machine.describe_machine()
    assert described["logical_cores"] == os.cpu_count() and described["devices"]
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags")
             for flag in line.split(":", 1)[1].split()}
    assert machine.cpu_flags() <= flags
    assert described["isa"] == [f for f in machine.ISA_FLAGS if f in flags]


@backend_independent
def test_host_description_records_the_allocator_settings_a_measurement_ran_with(monkeypatch):
    from benchmarks import machine

    for name in machine.ALLOCATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert not set(machine.ALLOCATOR_SETTINGS) & set(machine.describe_host())
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4294967296")
    assert machine.describe_host()["MALLOC_TRIM_THRESHOLD_"] == "4294967296"
    assert "MALLOC_MMAP_THRESHOLD_" not in machine.describe_host()


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile: torch backend")
@pytest.mark.over_budget(reason="torch.compile's inductor compiles our model and timm's on the "
                                "CPU, a C++ build each")
def test_bench_torch_compile_times_our_compiled_model_which_predicts_like_eager():
    # A fresh process: torch._dynamo loaded after TensorFlow segfaults, and this process's
    # import order is not the benchmark's.
    code = """if True:
        import json
        import numpy as np
        from benchmarks import SMOKE_MODEL, bench
        import vit_keras as vk
        model = vk.vit(vk.ViTConfig(**SMOKE_MODEL), image_size=32, include_top=False)
        x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
        model.compile(jit_compile=False)
        eager = model.predict_on_batch(x)
        model.compile(jit_compile=True)
        compiled = model.predict_on_batch(x)
        report = bench.main(["--smoke", "--peers", "timm", "--precisions", "float32",
                             "--skip-training", "--torch-compile", "--jit-compile", "auto",
                             "true"])
        print(json.dumps({"error": float(np.abs(eager - compiled).max()),
                          "spread": float(np.abs(eager).max()),
                          "jit": {r["implementation"]: r["jit_compile"]
                                  for r in report["results"]}}))
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "KERAS_BACKEND": "torch"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["spread"] > 0.1 and found["error"] < 1e-5
    assert found["jit"] == {"vit_keras": False, "vit_keras jit_compile=true": True,
                            "timm": False, "timm-compile": True}


def test_bench_sweeps_batch_sizes():
    from benchmarks import bench, render

    report = bench.main(["--smoke", "--peers", "--precisions", "float32", "--skip-training",
                         "--batch", "1", "3"])
    assert [(r["implementation"], r["batch"]) for r in report["results"]] == [
        ("vit_keras", 1), ("vit_keras", 3)]
    table = render.BENCH.render([report])
    assert "| smoke | 32 | 1 | float32 | vit_keras |" in table
    assert "| smoke | 32 | 3 | float32 | vit_keras |" in table


def test_bench_skip_training_measures_inference_only():
    from benchmarks import bench, render

    report = bench.main(["--smoke", "--peers", "timm", "--precisions", "float32",
                         "--skip-training", "--exact-gelu"])
    assert [r["implementation"] for r in report["results"]] == [
        "vit_keras", "vit_keras-erf-gelu", "timm"]
    for result in report["results"]:
        assert result["infer_images_s"] > 0 and result["train_images_s"] is None
    assert "| not run |" in render.BENCH.render([report])


@backend_independent
def test_flop_count_matches_timm_figure():
    import vit_keras as vk
    from benchmarks import runners

    # timm's figures: B/16 at 224 is 17.58 GMACs, at 384 55.5
    assert abs(runners.forward_flops(vk.get_config("B/16"), 224) / 2e9 - 17.58) < 0.1
    assert abs(runners.forward_flops(vk.get_config("B/16"), 384) / 2e9 - 55.5) < 0.3


@backend_independent
def test_hybrid_flop_count_adds_the_resnet_convolutions():
    import vit_keras as vk
    from benchmarks import runners

    # Worked by hand for the main job's hybrid at 32 px: the 7x7/2 root on 16x16 cells, then
    # on the 8x8 map after the max-pool one unit 32 -> 32 (1x1), 32 -> 32 (3x3), 32 -> 128
    # (1x1) and the 32 -> 128 projection; 16 tokens of 2x2x128 embedded to width 64.
    config = vk.ViTConfig(64, 4, 4, 128, 2, resnet_layers=(1,), resnet_width=32)
    resnet = 16 * 16 * 49 * 3 * 32 + 64 * (32 * 32 + 9 * 32 * 32 + 32 * 128 + 32 * 128)
    assert runners.resnet_macs(config, 32) == (resnet, 128)
    blocks = 4 * (4 * 16 * 64 * 64 + 2 * 16 * 16 * 64 + 2 * 16 * 64 * 128)
    expected = 2.0 * (resnet + 16 * 4 * 128 * 64 + blocks + 64 * 10)
    assert runners.forward_flops(config, 32, num_classes=10, class_token=False) == expected
    # A later stage halves the map in its first unit's 3x3 and projection.
    deeper = vk.ViTConfig(64, 1, 4, 128, 1, resnet_layers=(1, 1), resnet_width=32)
    second = 4 * 4 * (9 * 64 * 64 + 64 * 256 + 128 * 256) + 8 * 8 * 128 * 64
    assert runners.resnet_macs(deeper, 32) == (resnet + second, 256)


def test_every_family_by_name_matches_timms_own_architecture():
    """benchmarks.parity builds each later family's timm model (its real options, shrunk)
    and loads it into vk.vit with the registry's options, on this pass's backend."""
    from benchmarks import parity

    results = parity.measure(keras.backend.backend())
    assert set(results) == {"deit_in1k", "deit3_in1k", "deit3_in21k_ft_in1k", "dino", "mae",
                            "dinov2", "dinov2_reg", "deit_distilled_in1k", "clip_openai",
                            "clip_laion2b"}
    for name, result in results.items():
        assert result["max_abs_diff"] <= 1e-5, (name, result)
        assert result["max_abs_output"] > 0.1, (name, result)


@backend_independent
def test_masked_patch_experiment_runs_both_arms_and_both_probes(tmp_path):
    from benchmarks import masked_patch

    report = masked_patch.main(["--pretrain-epochs", "1", "--finetune-epochs", "1",
                                "--limit", "300", "--out", str(tmp_path),
                                "--recipe-option", "patch_drop_rate=0",
                                "--json", str(tmp_path / "report.json")])
    for run in ("finetune", "scratch"):  # the supervised runs take the recipe option
        arguments = (tmp_path / run / "arguments.json").read_text()
        assert "patch_drop_rate=0" in arguments, run
    assert "patch_drop_rate=0" not in (tmp_path / "pretrain" / "arguments.json").read_text()
    assert json.loads((tmp_path / "report.json").read_text())["backend"] == report["backend"]
    assert report["pretrain"]["target"] == "mean_color"
    assert report["pretrain"]["color_channels"] == 1  # Fashion-MNIST is grayscale
    assert report["pretrain_then_finetune"]["epochs"] == 1 and report["scratch"]["epochs"] == 2
    for probe in report["probes"].values():
        assert list(probe["few_shot"]) == ["1", "5", "10", "25"]
        assert probe["probe_train_images"] == probe["probe_test_images"] == 300
        # features of either backbone separate Fashion-MNIST's classes well above chance (0.1)
        assert probe["linear_probe"] > 0.4 and probe["few_shot"]["25"] > 0.3
    pretrained, random_init = report["probes"].values()
    assert pretrained != random_init  # each probe read its own backbone


@backend_independent
def test_resolution_experiment_fine_tunes_at_both_sizes(tmp_path):
    from benchmarks import resolution

    base = ROOT / "docs" / "models" / "fashion_mnist_p4.keras"
    report = resolution.main(["--model", str(base), "--image-size", "40", "--limit", "128",
                              "--out", str(tmp_path)])
    assert report["token_ratio"] == round(100 / 49, 3)
    assert report["runs"]["40px"]["epochs"] == 1 and report["runs"]["28px"]["epochs"] == 2
    for size in (40, 28):  # each run trained its own size
        model = keras.saving.load_model(report["runs"][f"{size}px"]["model"], compile=False)
        assert tuple(model.input.shape[1:3]) == (size, size)


def finish_run(flags: list[str], what: str, result: dict, history: dict,
               code: str | None = None) -> None:
    """A finished main-job run of flags: its run files (each holding `what`), result and
    history; started from revision `code` where one is given (else as benchmarks.mainjob
    recorded it)."""
    from benchmarks import mainjob

    run_dir = claim_run(flags)
    if code is not None:
        (run_dir / mainjob.REVISION_FILE).write_text(f"{code}\n")
    for name in mainjob.RUN_FILES:
        (run_dir / name).write_text(what)
    (run_dir / "history.json").write_text(json.dumps(history))
    (run_dir / "result.json").write_text(json.dumps(
        {"epochs": 18, "backend": keras.backend.backend(), **result}))


@backend_independent
def test_mainjob_runs_missing_seeds_and_reports_their_mean(tmp_path, monkeypatch):
    from benchmarks import mainjob

    def fake_main_sh(command, check):
        finish_run(command[2:], "seed 1's", {"test_accuracy": 0.9, "fit_seconds": 540.0,
                                             "save_seconds": 0.2, "total_seconds": 560.0,
                                             "test_accuracy_single_view": 0.89},
                   {"0": {"epoch_seconds": 260.5}, "1": {"epoch_seconds": 270.0}})
        calls.append(command)

    calls = []
    monkeypatch.setattr(subprocess, "run", fake_main_sh)
    monkeypatch.setattr(mainjob, "revision", lambda tree: f"abc1234 of {tree}")
    runs = tmp_path / "runs"
    finish_run(["--seed", "0", "--run-dir", str(runs / "seed0"), "--epochs", "18"], "seed 0's",
               {"test_accuracy": 0.92, "fit_seconds": 480.0, "total_seconds": 500.0},
               {"0": {"epoch_seconds": 470.3}}, code="abc1234 of .")
    report = mainjob.main(["--seeds", "0", "1", "--out", str(runs), "--docs",
                           str(tmp_path / "docs"), "--epochs", "18"])
    assert calls == [["bash", "scripts/main.sh", "--seed", "1", "--run-dir",
                      str(runs / "seed1"), "--epochs", "18"]]
    assert report["command"] == "bash scripts/main.sh --seed N --epochs 18"
    assert report["backend"] == keras.backend.backend()  # the runs', as result.json says
    assert (report["mean_test_accuracy"], report["min_test_accuracy"]) == (0.91, 0.9)
    # seed 0 ran before test-time flips: no mean of single views over both seeds
    assert "mean_test_accuracy_single_view" not in report
    assert report["seeds"]["1"]["test_accuracy_single_view"] == 0.89
    assert mainjob.summarise({"0": {"test_accuracy": 0.92, "test_accuracy_single_view": 0.915,
                                    "fit_seconds": 60, "total_seconds": 60},
                              "1": report["seeds"]["1"] | {"total_seconds": 560.0}}
                             )["mean_test_accuracy_single_view"] == 0.9025
    assert (report["mean_fit_minutes"], report["max_fit_minutes"]) == (8.5, 9.0)
    assert ({seed: r["epochs_seconds"] for seed, r in report["seeds"].items()}
            == {"0": 470.3, "1": 530.5})  # the histories' epochs, summed
    # a run before save_seconds has none; the code the seeds ran is named
    assert [r.get("save_seconds") for r in report["seeds"].values()] == [None, 0.2]
    assert report["revision"] == "abc1234 of ."
    assert json.loads((tmp_path / "docs" / "seeds.json").read_text()) == report
    assert (tmp_path / "docs" / "model.keras").read_text() == "seed 0's"
    assert (runs / "seed1" / mainjob.REVISION_FILE).read_text() == "abc1234 of .\n"


@backend_independent
def test_mainjob_refuses_a_seed_run_of_other_arguments_or_another_backend(tmp_path,
                                                                          monkeypatch):
    from benchmarks import mainjob

    monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command))
    monkeypatch.setattr(mainjob, "revision", lambda tree: "abc1234")
    calls = []
    runs = tmp_path / "runs"
    finish_run(["--seed", "0", "--run-dir", str(runs / "seed0"), "--epochs", "18"], "seed 0's",
               {"test_accuracy": 0.92, "fit_seconds": 480.0, "total_seconds": 500.0},
               {"0": {"epoch_seconds": 470.3}}, code="abc1234")
    with pytest.raises(FileExistsError, match=r"other arguments \(--epochs 18, now 16\)"):
        mainjob.main(["--seeds", "0", "--out", str(runs), "--epochs", "16"])
    result = runs / "seed0" / "result.json"
    other = "jax" if keras.backend.backend() != "jax" else "torch"
    result.write_text(json.dumps({**json.loads(result.read_text()), "backend": other}))
    with pytest.raises(FileExistsError, match=f"finished on {other}, not on "
                                              f"{keras.backend.backend()}"):
        mainjob.main(["--seeds", "0", "--out", str(runs), "--epochs", "18"])
    assert calls == []  # neither was run again, nor reported


@backend_independent
def test_mainjob_refuses_a_seed_run_of_other_code(tmp_path, monkeypatch):
    """A finished run of the same flags from another revision (or one not recorded) is not
    taken for this code's run."""
    from benchmarks import mainjob

    monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command))
    monkeypatch.setattr(mainjob, "revision", lambda tree: "def5678")
    calls = []
    runs = tmp_path / "runs"
    flags = ["--seed", "0", "--run-dir", str(runs / "seed0"), "--epochs", "18"]
    finish_run(flags, "seed 0's", {"test_accuracy": 0.92, "fit_seconds": 480.0,
                                   "total_seconds": 500.0},
               {"0": {"epoch_seconds": 470.3}}, code="abc1234")
    with pytest.raises(FileExistsError, match="from code abc1234, not from def5678: move it"):
        mainjob.main(["--seeds", "0", "--out", str(runs), "--epochs", "18"])
    (runs / "seed0" / mainjob.REVISION_FILE).unlink()
    with pytest.raises(FileExistsError, match="from code of unknown revision, not from def5678"):
        mainjob.main(["--seeds", "0", "--out", str(runs), "--epochs", "18"])
    assert calls == []
    # outside a git checkout no revision is known: a run started there is taken as it is
    monkeypatch.setattr(mainjob, "revision", lambda tree: None)
    monkeypatch.setattr(subprocess, "run", lambda command, check: finish_run(
        command[2:], "seed 1's", {"test_accuracy": 0.9, "fit_seconds": 540.0,
                                  "total_seconds": 560.0}, {"0": {"epoch_seconds": 530.0}}))
    report = mainjob.main(["--seeds", "1", "--out", str(runs), "--docs", str(tmp_path / "docs"),
                           "--epochs", "18"])
    assert (runs / "seed1" / mainjob.REVISION_FILE).read_text() == "\n"
    assert report["revision"] is None and report["mean_test_accuracy"] == 0.9


def smoke_forward_flops() -> float:
    """The smoke model's forward FLOPs (2 x multiply-adds), counted here from its shape:
    32 px in 8 px patches, width 32, 2 blocks, MLP 64, 1000 classes."""
    patches, tokens, width, mlp = 16, 17, 32, 64
    embed = patches * 8 * 8 * 3 * width
    block = 4 * tokens * width * width + 2 * tokens * tokens * width + 2 * tokens * width * mlp
    return 2.0 * (embed + 2 * block + width * 1000)


def test_bench_device_mode_on_cpu_records_device_shares_of_peak_and_memory():
    """The accelerator mode, run on the CPU: the device named, one thread, no latency, shares
    of the matmul peak for inference and training consistent with the rates and an
    independent FLOP count, and no device memory on a CPU; a device the backend does not
    compute on is refused."""
    from benchmarks import bench

    # TensorFlow takes a thread count only before its first op, long past in this process
    threads = None if keras.backend.backend() == "tensorflow" else 1
    report = bench.main(["--smoke", "--peers", "timm", "--precisions", "float32",
                         "--device", "cpu", "--skip-latency",
                         *(["--threads", str(threads)] if threads else [])])
    assert report["device"]["kind"] == "cpu" and report["device"]["name"]
    assert report["threads"] == threads
    flops = smoke_forward_flops()
    for result in report["results"]:
        assert result["latency_ms"] is None and result["device_peak_mib"] is None
        assert result["gflops_per_image"] == pytest.approx(flops / 1e9)
        framework = "torch" if result["implementation"] == "timm" else f"keras-{report['backend']}"
        peak = max([report["matmul_gflops"][f"{framework}-float32"]] + [
            r["matmul_gflops_s"] for r in report["results"]
            if (r["implementation"] == "timm") == (framework == "torch")])
        assert result["infer_share_of_peak"] == pytest.approx(
            result["infer_images_s"] * flops / 1e9 / peak)
        assert result["train_share_of_peak"] == pytest.approx(
            result["train_images_s"] * 3 * flops / 1e9 / peak)
        assert 0 < result["infer_share_of_peak"] < 1
    with pytest.raises(SystemExit, match="--device cuda: the .* backend computes on cpu"):
        bench.main(["--smoke", "--peers", "--device", "cuda"])


def test_overhead_model_has_b16_depth_at_tiny_width_and_its_table_divides_by_timm():
    from benchmarks import render
    from benchmarks.runners import model_spec

    config, image_size = model_spec("overhead", 224)
    assert (config.hidden_size, config.num_layers, config.num_heads, config.mlp_dim,
            config.patch_size, image_size) == (64, 12, 4, 128, 16, 32)
    rows = [dict(implementation=name, jit_compile=jit, batch=2, infer_images_s=2000 / forward,
                 train_images_s=2000 / train)
            for name, jit, forward, train in (("vit_keras", False, 6.0, 30.0),
                                              ("vit_keras jit_compile=true", True, 5.0, 20.0),
                                              ("timm", False, 4.0, 15.0),
                                              ("timm-compile", True, 2.0, 10.0))]
    text = render.BLOCKS["benchoverhead"][0].render(
        [{"backend": "torch", "results": rows, "file": "torch.json"}])
    # eager against timm eager (6 ms / 4, 30 / 15), compiled against timm-compile (5 / 2, 20 / 10)
    assert ("| torch | vit_keras | false | 6.0 | 1.50x timm | 30.0 | 2.00x timm | `torch.json` "
            "|") in text
    assert ("| torch | vit_keras jit_compile=true | true | 5.0 | 2.50x timm-compile | 20.0 | "
            "2.00x timm-compile | `torch.json` |") in text


@backend_independent
def test_step_cost_counts_the_main_jobs_arithmetic():
    from benchmarks import step_cost

    report = step_cost.main(["--batches", "2", "6", "--repeats", "1"])
    assert sorted(report["ms_per_step"]) == ["2", "6"]
    # the main job's hybrid by hand: the ResNet's 7x7/2 root on 16x16 cells of 32-pixel images
    # (3 -> 32 channels), one unit on the 8x8 map (32 -> 32 1x1, 3x3, 32 -> 128 1x1 and
    # projection), 16 patches of 2x2x128 to width 64, 4 blocks of 16 tokens (qkv and out
    # 4*16*64*64, attention 2*16*16*64, MLP 2*16*64*128), a head to 10 classes; 2 FLOPs a
    # multiply-add, a training step three forward passes
    resnet = 16 * 16 * 49 * 3 * 32 + 64 * (32 * 32 + 9 * 32 * 32 + 2 * 32 * 128)
    blocks = 4 * (4 * 16 * 64 * 64 + 2 * 16 * 16 * 64 + 2 * 16 * 64 * 128)
    macs = resnet + 16 * 512 * 64 + blocks + 640
    assert report["train_gflop_per_image"] == round(3 * 2 * macs / 1e9, 5)


@backend_independent
def test_step_cost_builds_the_model_in_the_precision_asked_for():
    from benchmarks import step_cost
    from vit_keras import configs

    model, run = step_cost.main_job_model(["--precision", "mixed_bfloat16"])
    assert run.precision == "mixed_bfloat16"
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer(configs.block_name(0)).compute_dtype == "bfloat16"


MACHINE = {"cpu": "Some CPU", "logical_cores": 2, "isa": ["avx2"], "memory_gib": 24}


@backend_independent
def test_a_column_spec_renders_its_json_files_rows_as_a_table_or_a_line(tmp_path):
    from benchmarks import render

    for name, report in {"b.json": {"backend": "jax", "machine": MACHINE, "results": [
                             {"rate": 3.14159, "ms": {"128": 72.84}, "jit": True, "peak": None}]},
                         "a.json": {"backend": "torch", "machine": MACHINE, "results": [
                             {"rate": 1234.5, "ms": {"128": 5.0}, "jit": False, "peak": 2048.4},
                             {"rate": 0.5, "ms": {"128": 0.25}, "jit": False, "peak": 1.0}]}
                         }.items():
        (tmp_path / name).write_text(json.dumps(report))
    spec = render.Spec((str(tmp_path / "*.json"),), (
        ("backend", "{backend}"), ("img/s", "{rate:rate}"), ("ms of 128", "{ms.128:.1f}"),
        ("jit", "{jit}"), ("peak MiB", "{peak:,.0f}"), ("report", "`{file}`")),
        render.each("results"))
    # files in name order; rates to two decimals under 10, one above; None not run
    assert spec.render() == "\n".join([
        "| backend | img/s | ms of 128 | jit | peak MiB | report |",
        "|---|---|---|---|---|---|",
        "| torch | 1234.5 | 5.0 | false | 2,048 | `a.json` |",
        "| torch | 0.50 | 0.2 | false | 1 | `a.json` |",
        "| jax | 3.14 | 72.8 | true | not run | `b.json` |"])
    line = render.Spec((str(tmp_path / "a.json"),), (
        ("", "{backend} backend"), ("rows", "{rows}"), ("Machine", "{machine}")),
        lambda reports: [{**reports[0], "rows": len(reports[0]["results"])}], line=True)
    assert line.render() == ("torch backend; rows: 2; Machine: Some CPU, 2 logical cores (avx2), "
                             "24 GiB.")
    with pytest.raises(KeyError, match="missing"):
        render.Spec((str(tmp_path / "a.json"),), (("x", "{missing}"),)).render()
    with pytest.raises(FileNotFoundError, match=r"no report matches .*c\*\.json under"):
        render.Spec((str(tmp_path / "c*.json"),), (("x", "{x}"),)).render()


@backend_independent
def test_the_backends_table_puts_each_backends_seeds_beside_its_own_step(tmp_path, monkeypatch):
    from benchmarks import render

    def write(path, report):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps(report))

    def seeds(backend, accuracy, **single_view):
        return {"machine": MACHINE, "backend": backend, "seeds": {"0": {}, "1": {}},
                "command": "bash scripts/main.sh --seed N", "mean_test_accuracy": accuracy,
                "mean_fit_minutes": 5.0, **single_view}

    def steps(small, large):
        return {"ms_per_step": {"8": small, "128": large}, "fixed_ms_per_step": 1.0,
                "ms_per_image": 0.5}

    write("docs/mainjob/seeds.json", seeds("torch", 0.915, mean_test_accuracy_single_view=0.91))
    write("docs/mainjob/steps/torch.json", steps(20.0, 70.0))
    write("docs/mainjob/backends/jax/seeds.json", seeds("jax", 0.912))
    write("docs/mainjob/steps/jax.json", steps(11.0, 250.0))
    monkeypatch.setattr(render, "ROOT", str(tmp_path))
    rows = render.render_block("backends").splitlines()
    # a run scored on single views (before test-time flips) has the one accuracy in both
    assert rows[2:4] == [
        "| torch | 91.50% | 91.00% | 2 | 5.0 | 20.0 | 70.0 | 1.0 | 0.500 | "
        "`bash scripts/main.sh --seed N` |",
        "| jax | 91.20% | 91.20% | 2 | 5.0 | 11.0 | 250.0 | 1.0 | 0.500 | "
        "`KERAS_BACKEND=jax bash scripts/main.sh --seed N` |"]
    assert rows[-1] == "Machine: Some CPU, 2 logical cores (avx2), 24 GiB."


@backend_independent
def test_generated_blocks_on_the_pages_are_current_and_an_unknown_block_fails_loudly():
    """`python -m benchmarks.render --write` regenerates every block from its JSON."""
    from benchmarks import render

    assert render.main([]) == [], "stale: python -m benchmarks.render --write"
    found = {name for path in render.doc_pages() for name in render.BEGIN.findall(
        Path(path).read_text())}
    assert {"bench", "benchoverhead", "seeds", "backends", "readmemainjob"} <= found
    page = "a\n<!-- setup:begin -->\nold\n<!-- setup:end -->\nb `<!-- NAME:begin -->`\n"
    assert render.render(page) == (f"a\n<!-- setup:begin -->\n{render.render_block('setup')}\n"
                                   "<!-- setup:end -->\nb `<!-- NAME:begin -->`\n")
    with pytest.raises(ValueError, match=r"page.md has generated blocks \['benchgpu'\]"):
        render.render("<!-- benchgpu:begin -->\n<!-- benchgpu:end -->\n", "page.md")
    with pytest.raises(ValueError, match=r"\['bench'\] have a begin marker without"):
        render.render("<!-- bench:begin -->\nno end\n", "page.md")


@backend_independent
def test_token_budget_flops_count_attention_on_the_tokens_in_and_the_mlp_on_those_kept():
    import vit_keras as vk
    from benchmarks import runners, token_budget

    b16 = vk.get_config("B/16")  # no reduction: the ViT's own count
    assert token_budget.forward_flops(b16, 224, [197] * 12, False, 1000) == (
        runners.forward_flops(b16, 224))
    # Counted by hand: width 4, MLP 8, 2 heads, 8x8 patches of a 16 px RGB image (4 patches and
    # the class token), 10 classes. Embedding 4*64*3*4 = 3072 and head 4*10 = 40; block 0 takes
    # 5 tokens and keeps 3: 4*5*16 + 2*25*4 + 2*3*4*8 = 712, and merging compares its 3 A keys
    # with its 2 B keys of width 2: 12; block 1 takes and keeps 3: 4*3*16 + 2*9*4 + 2*3*32 = 456.
    tiny = vk.ViTConfig(hidden_size=4, mlp_dim=8, num_heads=2, num_layers=2, patch_size=8)
    assert token_budget.forward_flops(tiny, 16, [3, 3], True, 10) == 2 * (3072 + 40 + 724 + 456)
    assert token_budget.forward_flops(tiny, 16, [3, 3], False, 10) == 2 * (3072 + 40 + 712 + 456)


@in_tensorflow_pass  # the speed part exports TFLite files, which needs TensorFlow
@pytest.mark.over_budget(reason="the token budget benchmark's one smoke run, run once: two "
                         "fine-tunes, TFLite exports and peak-memory child processes")
def test_token_budget_smoke_run_scores_and_times_every_row_and_renders_them(tmp_path):
    from benchmarks import render, token_budget

    out = tmp_path / "tokens"
    reports = token_budget.main(["--smoke", "--out", str(tmp_path / "runs"),
                                 "--json-dir", str(out)])
    accuracy, speed = reports["accuracy.json"], reports["speed.json"]
    assert [(row["label"], row["training"]) for row in accuracy["rows"]] == [
        ("none", "fine-tuned"), ("ToMe r=4", "off the shelf"),
        ("EViT keep 0.5", "fine-tuned"), ("EViT keep 0.5", "off the shelf")]
    # 28 px: 49 patches and the class token in 4 blocks. ToMe merges 4 in each; EViT keeps
    # ceil(half) of the patches at blocks 1, 2 and 3 and fuses the rest into one token.
    tokens = {"none": [50] * 4, "ToMe r=4": [46, 42, 38, 34], "EViT keep 0.5": [50, 27, 15, 9]}
    for row in accuracy["rows"]:
        assert row["tokens_per_block"] == tokens[row["label"]]
        assert 0 <= row["validation_accuracy"] <= 1 and 0 <= row["test_accuracy"] <= 1
    assert accuracy["validation_images"] == accuracy["test_images"] == 64
    # the speed rows: the fine-tuned model's, then the smoke model's at 32 px (16 patches and
    # the class token in 2 blocks, pruned at both)
    rows = {(row["model"].split(",")[0], row["label"]): row for row in speed["rows"]}
    assert {key: row["tokens_per_block"] for key, row in rows.items()} == {
        **{("fashion_mnist_p4", label): counts for label, counts in tokens.items()},
        ("smoke", "none"): [17, 17], ("smoke", "ToMe r=2"): [15, 13],
        ("smoke", "EViT keep 0.5"): [10, 7]}
    for (model, _), row in rows.items():
        none = rows[(model, "none")]  # every ratio is to the unreduced model of its run
        assert row["infer_images_s"] > 0 and row["latency_ms"] > 0
        assert row["speedup"] == pytest.approx(row["infer_images_s"] / none["infer_images_s"])
        # peak memory for the variants, LiteRT for the fine-tuned model (--smoke exports no
        # variant)
        assert (row["infer_peak_mib"] is not None) == (model == "smoke")
        if model == "smoke":
            assert row.get("litert_float32_ms") is None
            continue
        assert row["litert_float32_ms"] > 0
        # an int8 file LiteRT cannot run is reported (the table says "fails"), not timed
        assert (row["litert_int8_ms"] or 0) > 0 or row["litert_int8_error"]
        if row["litert_int8_ms"]:
            assert 0 <= row["int8_top1_agreement"] <= 1
            assert row["litert_int8_speedup"] == pytest.approx(
                none["litert_int8_ms"] / row["litert_int8_ms"])
    text = "\n\n".join(spec.render([accuracy, speed]) for spec in
                       render.BLOCKS["token-budget"])
    assert "| none | 0 / 1.0 | fine-tuned | 50, 50, 50, 50 | 1.00x |" in text
    assert "| EViT | 0.5 | off the shelf | 50, 27, 15, 9 |" in text
    assert "| smoke, 32 px (random weights) | ToMe | 2 | 15, 13 |" in text
    assert (out / "tradeoff.png").stat().st_size > 0


@backend_independent
def test_distillation_summary_means_each_runs_seeds_and_marks_the_validation_choice():
    from benchmarks import distillation

    def run(name, seed, validation, test, seconds):
        return {"run": name, "seed": seed, "validation_accuracy": validation,
                "test_accuracy": test, "fit_seconds": seconds}

    rows = [run("none", 0, 0.90, 0.89, 60), run("hard/convnet", 0, 0.92, 0.90, 90),
            run("none", 1, 0.88, 0.91, 120), run("hard/convnet", 1, 0.90, 0.94, 150),
            run("soft/convnet", 0, 0.95, 0.85, 30)]
    teachers = {"convnet": {"test_accuracy": 0.93, "fit_seconds": 300}}
    summary = {row["run"]: row for row in distillation.summary(rows, teachers)}
    assert list(summary) == ["none", "hard/convnet", "soft/convnet"]
    hard = summary["hard/convnet"]
    # seeds 0 and 1: validation (0.92 + 0.90) / 2, test (0.90 + 0.94) / 2, 120 s; the change
    # is from the students without a teacher, (0.89 + 0.91) / 2 = 0.90: +2 points
    assert hard["validation_accuracy"] == pytest.approx(0.91)
    assert hard["test_accuracy"] == pytest.approx(0.92)
    assert hard["fit_seconds"] == pytest.approx(120)
    assert hard["test_change"] == pytest.approx(2.0)
    assert hard["test_accuracies"] == [0.90, 0.94] and hard["seeds"] == [0, 1]
    assert (hard["teacher_test_accuracy"], hard["teacher_fit_seconds"]) == (0.93, 300)
    assert summary["none"]["teacher_test_accuracy"] is None
    assert summary["soft/convnet"]["test_change"] == pytest.approx(-5.0)
    # the choice reads validation only: soft's 95% wins there, whatever its test accuracy
    assert [name for name, row in summary.items() if row["chosen"]] == ["soft/convnet"]


@backend_independent
@pytest.mark.over_budget(reason="the distillation benchmark's one smoke run, run once: two "
                         "teachers and five students trained and evaluated by the apps")
def test_distillation_smoke_trains_the_teachers_and_every_student_and_renders_them(
        tmp_path, monkeypatch):
    from apps import train
    from benchmarks import distillation, render
    from tests.test_convnet import bit_parameters

    argv = ["--smoke", "--out", str(tmp_path / "runs"), "--json-dir", str(tmp_path / "json")]
    report = distillation.main(argv)
    assert report == json.loads((tmp_path / "json" / "distillation.json").read_text())
    teachers = {row["teacher"]: row for row in report["teachers"]}
    assert list(teachers) == ["convnet", "vit"]
    assert teachers["convnet"]["trainable_parameters"] == bit_parameters((1,), 32, 3, 10)
    assert [row["run"] for row in report["runs"]] == list(distillation.RUNS)
    for row in report["runs"]:
        flags = row["flags"].split()
        teacher = row["teacher"]
        assert ("--teacher" in flags) == (teacher is not None)
        if teacher:
            assert flags[flags.index("--teacher") + 1] == teachers[teacher]["model"]
        assert 0 <= row["validation_accuracy"] <= 1 and 0 <= row["test_accuracy"] <= 1
        assert row["test_images"] == 64 and row["epochs"] == 1
    # the token's student is a plain .keras ViT with DeiT's two heads, answering with their mean
    token = keras.saving.load_model(tmp_path / "runs" / "hard-token-convnet" / "seed0" /
                                    "model.keras", safe_mode=True)
    assert {"head", "head_dist"} <= {layer.name for layer in token.layers}
    text = "\n\n".join(spec.render([report]) for spec in render.BLOCKS["distillation"])
    assert "| hard, distillation token | convnet |" in text
    assert "| no teacher |  |" in text and "| +0.00 |" in text
    # run again, every run is read from its folder: nothing trains
    monkeypatch.setattr(train, "main", lambda argv: pytest.fail(f"trained again: {argv}"))
    again = distillation.main(argv)
    assert [row["test_accuracy"] for row in again["runs"]] == [
        row["test_accuracy"] for row in report["runs"]]
