import re
from pathlib import Path

from apps.variants import variant_table


def test_readme_variant_table_is_the_generated_one():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"<!-- variants:begin -->\n(.*?)\n<!-- variants:end -->", readme, re.S)
    assert block and block.group(1) == variant_table()
