"""The reference pages are complete and current: the API reference (docs/api/, rendered by
mkdocstrings from the docstrings) covers every public name of vit_keras and of its public
submodules, each function and class with a docstring whose Args section names every
parameter; docs/cli.md is each app's --help as the apps print it now."""

import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

import vit_keras
from tests.conftest import backend_independent

ROOT = Path(__file__).parents[1]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
DIRECTIVE = re.compile(r"^::: ([\w.]+)", re.M)
SECTION = re.compile(r"^(\w[\w ]*):$")
ARGUMENT = re.compile(r"^(\*{0,2}\w+)(?: \([^)]*\))?:")


def public_modules() -> list:
    """vit_keras and the submodules in its __all__."""
    return [vit_keras, *(getattr(vit_keras, name) for name in vit_keras.__all__
                         if inspect.ismodule(getattr(vit_keras, name)))]


def public_names(module) -> list[str]:
    """A module's __all__; without one, the functions and classes it defines that are not
    private, as mkdocstrings lists them."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module.__name__]


def resolve(path: str):
    """The object a `::: path` directive renders."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            value = getattr(value, part)
        return value
    raise ImportError(path)


def rendered() -> dict[int, str]:
    """id -> where, of every object the API pages render: a directive's object, and each
    public name of a module directive."""
    objects = {}
    for page in API_PAGES:
        for path in DIRECTIVE.findall(page.read_text()):
            value = resolve(path)
            objects[id(value)] = path
            if inspect.ismodule(value):
                objects.update({id(getattr(value, name)): f"{path}.{name}"
                                for name in public_names(value)})
    return objects


def documented_objects() -> dict[str, object]:
    """qualified name -> each public function and class of the public modules."""
    objects = {}
    for module in public_modules():
        for name in public_names(module):
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                objects.setdefault(f"{value.__module__}.{value.__qualname__}", value)
    return objects


def own_docstring(value) -> str:
    """The docstring written for value itself: a class does not inherit one here, and a
    dataclass's generated signature line is none."""
    doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
    if not doc or doc.startswith(f"{value.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def args_section(doc: str, sections=("Args:",)) -> list[str]:
    """The names an Args section (Google style) documents, in order; a dataclass's fields may
    be documented as Attributes instead."""
    names, inside = [], False
    for line in doc.splitlines():
        if SECTION.match(line):
            inside = line in sections
        elif inside and line.startswith("    ") and not line.startswith("     "):
            match = ARGUMENT.match(line[4:])
            if match:
                names.append(match.group(1))
    return names


def parameters(value) -> list[str]:
    """The names a caller passes: a class's are those of the constructor it defines; *args
    and **kwargs keep their stars."""
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    if inspect.isclass(value) and "__init__" not in vars(value):
        return []  # the base class's constructor (a Keras layer's), documented there
    return [stars.get(parameter.kind, "") + name
            for name, parameter in inspect.signature(value).parameters.items()]


@backend_independent
def test_every_public_name_is_in_the_api_reference():
    shown = rendered()
    missing = [f"{module.__name__}.{name}" for module in public_modules()
               for name in public_names(module)
               if id(getattr(module, name)) not in shown
               and not inspect.ismodule(getattr(module, name))]  # a module: its names are
    assert not missing, f"not in docs/api/*.md: {missing}"


@backend_independent
def test_every_public_function_and_class_documents_each_argument():
    problems = []
    for name, value in documented_objects().items():
        doc = own_docstring(value)
        if not doc:
            problems.append(f"{name}: no docstring")
            continue
        sections = ("Args:", "Attributes:") if dataclasses.is_dataclass(value) else ("Args:",)
        expected, documented = parameters(value), args_section(doc, sections)
        if expected and not set(sections) & set(doc.splitlines()):
            problems.append(f"{name}: no Args section for {expected}")
        elif expected != documented:
            problems.append(f"{name}: Args {documented}, expected {expected}")
    assert not problems, "\n".join(problems)


def test_args_section_reads_google_style():
    doc = inspect.cleandoc("""Summary.

        Args:
            first: what it is,
                on two lines.
            second (int): typed.
            **kwargs: the rest.

        Returns:
            value: not an argument.
        """)
    assert args_section(doc) == ["first", "second", "**kwargs"]


@backend_independent
@pytest.mark.skipif(sys.version_info[:2] != (3, 11),
                    reason="docs/cli.md is generated with Python 3.11's argparse, CI's; other "
                           "versions format --help differently")
def test_cli_reference_is_each_apps_current_help():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        cli_reference = importlib.import_module("cli_reference")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    pages = cli_reference.pages()
    assert sorted(pages) == ["cli.md", *sorted(f"cli/{path.name}" for path in
                                                (ROOT / "docs" / "cli").glob("*.md"))]
    for path, text in pages.items():
        assert (ROOT / "docs" / path).read_text() == text, \
            f"docs/{path} is out of date: run python scripts/cli_reference.py"
