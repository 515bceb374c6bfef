"""Where the tests in this folder find llama-server, the launcher and the tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK_LLAMA = REPO / "hack" / "llama"
# hack/llama holds scripts, not an installed package: its modules are imported from there.
if str(HACK_LLAMA) not in sys.path:
    sys.path.insert(0, str(HACK_LLAMA))

import make_gguf  # noqa: E402

TOKENIZER_DIR = Path(os.environ.get("LLAMA_TOKENIZER_DIR") or make_gguf.DEFAULT_TOKENIZER_DIR)


def binary_is_cached() -> bool:
    if os.environ.get("LLAMA_SERVER"):
        return True
    r = subprocess.run(
        ["bash", str(HACK_LLAMA / "ensure.sh"), "--cached"], capture_output=True, check=False
    )
    return r.returncode == 0


# A cold build of llama-server takes tens of minutes on 2 busy cores (docs/real-engine.md):
# the timeout stretches only when the binary is not cached yet.
BUILD_TIMEOUT = 300 if binary_is_cached() else 3600
