"""What the node suite's tests share besides fixtures: timeouts that scale, the cluster handle,
the model they exercise, and how a test says this machine cannot run it. (Not conftest.py:
tests import from here.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

_CLUSTER_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))

SCALE = float(os.environ.get("PREFIXROUTER_TIMEOUT_SCALE", "1") or 1)
MODEL = "sim"
MODEL_NAMESPACE = "node-e2e"
# The model's engines run the simulator's fast profile this many times slower (10 ms steps).
STEP_SCALE = 5.0


def unavailable(reason: str) -> None:
    """Skip a test this machine cannot run, with the reason; under CI (the `CI` environment
    variable set) fail it instead: CI runs where the suite can, so a skip would hide it."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, and the real-node suite cannot run here: {reason}",
                    pytrace=False)
    pytest.skip(reason)


def scaled(seconds: float) -> float:
    """A timeout for a busy 2-core machine, times PREFIXROUTER_TIMEOUT_SCALE."""
    return seconds * SCALE


class Cluster:
    """What the tests use of the cluster: the ControlPlane-like `cp` (kubectl, kubectl_json,
    apply, wait_for, kubeconfig) and the images (name -> ref)."""

    def __init__(self, cp: Any, images: dict[str, str]) -> None:
        self.cp = cp
        self.images = images
