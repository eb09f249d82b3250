from __future__ import annotations

from typing import Any

import pytest

from tests.unit.helm.chart import render


@pytest.fixture(scope="session")
def default_docs() -> list[dict[str, Any]]:
    return render()
