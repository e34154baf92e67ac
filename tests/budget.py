"""A pytest plugin: the suite fails when one test (setup, call and teardown together) takes
longer than the per-test budget on the project's 2-core machine, so that no single test can
grow unseen until CI runs out of time. A justified exception is marked
@pytest.mark.over_budget(reason="..."). VIT_KERAS_TEST_BUDGET_S sets the budget (60 s)."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "over_budget(reason): this test may take longer than "
                                       "the per-test budget, for the reason given")
    config.pluginmanager.register(
        TestBudget(float(os.environ.get("VIT_KERAS_TEST_BUDGET_S", "60"))))


class TestBudget:
    """Each session's own tally (an in-process inner session keeps its own)."""

    __test__ = False  # not a test class

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.spent: dict[str, float] = {}

    def over_budget(self) -> dict[str, float]:
        return {node: s for node, s in self.spent.items() if s > self.seconds}

    def pytest_report_header(self):
        return f"per-test budget: {self.seconds:g} s"

    def pytest_runtest_logreport(self, report):
        """Adds up each test's phases; under xdist the controller sees every worker's."""
        if "over_budget" not in report.keywords:
            self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter):
        slow = self.over_budget()
        if slow:
            terminalreporter.section(f"tests over the {self.seconds:g} s budget", red=True)
            for node, seconds in sorted(slow.items(), key=lambda item: -item[1]):
                terminalreporter.write_line(f"{seconds:7.1f} s  {node}")

    def pytest_sessionfinish(self, session):
        if self.over_budget() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
