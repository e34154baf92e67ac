"""The per-test budget (tests/budget.py) fails a suite with a test over it, names the test,
and lets a test marked over_budget through."""

import pytest

INNER_TESTS = """
import time
import pytest

def test_quick():
    pass

def test_slow():
    time.sleep(0.3)

@pytest.mark.over_budget(reason="measured on purpose")
def test_slow_but_marked():
    time.sleep(0.3)

@pytest.fixture
def slow_to_set_up():
    time.sleep(0.15)

def test_slow_in_its_fixture_and_its_body(slow_to_set_up):
    time.sleep(0.15)
"""


def run_inner(pytester, monkeypatch, *args):
    monkeypatch.setenv("VIT_KERAS_TEST_BUDGET_S", "0.2")
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester.runpytest_inprocess("-p", "tests.budget", "-p", "no:cacheprovider", *args)


def test_a_test_over_the_budget_fails_the_suite_and_is_named(pytester, monkeypatch):
    result = run_inner(pytester, monkeypatch)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    section = result.stdout.str().split("tests over the 0.2 s budget")[1]
    named = {line.split()[-1] for line in section.splitlines() if "::" in line}
    # the marked one is let through; a fixture's set-up counts with the test's body
    assert named == {"test_inner.py::test_slow",
                     "test_inner.py::test_slow_in_its_fixture_and_its_body"}


def test_a_suite_within_the_budget_passes(pytester, monkeypatch):
    result = run_inner(pytester, monkeypatch, "-k", "quick or marked")
    result.assert_outcomes(passed=2, deselected=2)
    assert result.ret == pytest.ExitCode.OK
    assert "tests over the" not in result.stdout.str()
