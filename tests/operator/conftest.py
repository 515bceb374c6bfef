from __future__ import annotations

import pytest

from prefix_operator.config import OperatorConfig


@pytest.fixture
def cfg() -> OperatorConfig:
    return OperatorConfig()
