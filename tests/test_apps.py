import re
from pathlib import Path

import pytest

from apps.variants import pretrained_table, variant_table
from tests.conftest import TINY


def readme_block(name):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", readme, re.S)
    assert block, f"README has no {name} block"
    return block.group(1)


def test_readme_tables_are_the_generated_ones():
    assert readme_block("variants") == variant_table()
    assert readme_block("pretrained") == pretrained_table()


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
