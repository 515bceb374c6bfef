from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prefix_operator.config import OperatorConfig

# e2e/cluster's plain modules (processes.py: stop_process), as tests/k8s/conftest.py does;
# importing them needs no Kubernetes binaries.
_CLUSTER_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))


@pytest.fixture
def cfg() -> OperatorConfig:
    return OperatorConfig()
