"""The unit tier in a light venv (POSTTRAIN_LIGHT_VENV=1, set by `make test-unit-versions` for the
versions in UNIT_PYTHONS_LIGHT): a test, or a test module, that needs a package the venv does not
install (torch, transformers, numpy, jinja2...) is skipped, naming the package, instead of failing.
Only a ModuleNotFoundError for a package absent from the venv turns into a skip; in any other venv,
and for anything else, the test fails as usual."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Generator
from typing import Any

import pytest

LIGHT = os.environ.get("POSTTRAIN_LIGHT_VENV") == "1"
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _absent(name: str | None) -> str | None:
    """The top-level package of a missing module when this venv does not install it at all."""
    if not name:
        return None
    top = name.split(".")[0]
    return top if importlib.util.find_spec(top) is None else None


def _reason(package: str) -> str:
    return f"needs {package}, which this light venv does not install (the full venv runs it)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if not (LIGHT and report.failed):
        return
    match = MISSING_MODULE.search(str(report.longrepr))
    package = _absent(match.group(1) if match else None)
    if package:
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {_reason(package)}")
        report.result = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (LIGHT and report.failed and call.excinfo is not None):
        return
    error = call.excinfo.value
    package = _absent(error.name) if isinstance(error, ModuleNotFoundError) else None
    if package:
        path, line, _ = item.reportinfo()
        report.outcome = "skipped"
        report.longrepr = (str(path), (line or 0) + 1, f"Skipped: {_reason(package)}")
