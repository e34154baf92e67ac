import json
import math

import pytest

import vit_keras as vk
from benchmarks import SMOKE_MODEL
from tests.conftest import backend_independent

# The memory the test says the host has: small, so that the projected batch is a few thousand
# smoke images, past the fit's, and its check runs in seconds.
AVAILABLE_MIB = 200.0


def smoke_flops(image_size: int) -> tuple[int, int]:
    """2 x multiply-accumulates of the smoke model's forward pass (hidden 32, MLP 64, 2 blocks,
    8 px patches, 1000 classes), counted term by term, and those of attention's N^2 term."""
    patches = (image_size // 8) ** 2
    n = patches + 1  # and the class token
    embedding = patches * (8 * 8 * 3) * 32
    projections = 4 * n * 32 * 32  # query, key, value and output
    attention = 2 * n * n * 32  # the scores, and their product with the values
    mlp = 2 * n * 32 * 64
    head = 32 * 1000
    return 2 * (embedding + 2 * (projections + attention + mlp) + head), 2 * 2 * attention


@backend_independent
def test_input_size_reports_costs_and_a_batch_projected_from_two_peaks(tmp_path, monkeypatch):
    from benchmarks import input_size

    assert SMOKE_MODEL == dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64,
                               patch_size=8)  # what smoke_flops counts
    # two calls of this many images at 10 ms each take longer than MEMORY_SECONDS: not run
    over = math.floor(input_size.MEMORY_SECONDS / (2 * 0.01)) + 1
    assert input_size.checked_peak(vk.ViTConfig(**SMOKE_MODEL), 32, over, 0.01) is None
    monkeypatch.setattr(input_size, "available_mib", lambda: AVAILABLE_MIB)
    # so that a loaded machine's slower rate neither stops the doubling nor skips the check
    monkeypatch.setattr(input_size, "MEMORY_SECONDS", 120.0)
    path = tmp_path / "input_size.json"
    report = input_size.main(["--smoke", "--batch", "32", "--repeats", "1", "--json", str(path)])
    rows = report["rows"]
    assert [(r["image_size"], r["tokens"]) for r in rows] == [(32, 17), (64, 65)]
    assert smoke_flops(32)[0] == 891_648  # the count at 32 px, by hand
    budget = AVAILABLE_MIB * (1 - input_size.SAFETY_MARGIN)
    for r in rows:
        size = r["image_size"]
        model = vk.vit(vk.ViTConfig(**SMOKE_MODEL), image_size=size, num_classes=1000)
        assert r["params"] == model.count_params()
        flops, attention = smoke_flops(size)
        assert r["gflop_per_image"] == pytest.approx(flops / 1e9)
        assert r["attention_share"] == pytest.approx(attention / flops)
        first, second = r["peaks"]
        # the second batch: 32 doubled, until its peak grew MIN_GROWTH_MIB over the first's
        assert first["batch"] == 32 and math.log2(second["batch"] / 32) % 1 == 0
        assert second["peak_mib"] - first["peak_mib"] >= input_size.MIN_GROWTH_MIB
        for point in r["peaks"]:
            assert r["fixed_mib"] + r["mib_per_image"] * point["batch"] == pytest.approx(
                point["peak_mib"])
        # the largest batch whose fitted peak and float32 input images fit in the budget
        assert r["input_mib_per_image"] == size * size * 3 * 4 / 2**20
        batch = r["largest_batch_projected"]
        per_image = r["mib_per_image"] + r["input_mib_per_image"]
        assert batch > 0
        assert r["fixed_mib"] + per_image * batch <= budget
        assert r["fixed_mib"] + per_image * (batch + 1) > budget
        # checked at that batch: a peak above the measured batches', near the budget
        assert batch > second["batch"]
        assert second["peak_mib"] < r["largest_batch_peak_mib"] < 2 * budget
    assert rows[0]["attention_share"] < rows[1]["attention_share"]
    assert report["memory_seconds"] == 120.0
    assert json.loads(path.read_text()) == report
    from benchmarks import render

    table = "\n\n".join(part.render([report]) for part in render.BLOCKS["inputsize"])
    assert table.count("\n| smoke | ") == 2
    assert f"; backend: {report['backend']};" in table.splitlines()[0]


@backend_independent
def test_available_memory_is_read_in_mib_below_the_hosts_total():
    from benchmarks import input_size

    with open("/proc/meminfo") as file:  # kB
        kib = {line.split(":")[0]: int(line.split()[1]) for line in file}
    # MemFree is most of what is available; MemTotal is more than all of it
    assert 0.5 * kib["MemFree"] / 1024 < input_size.available_mib() < kib["MemTotal"] / 1024
