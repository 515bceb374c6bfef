"""A real llama-server for the tests in this folder: built once from source, cached outside the
repo (hack/llama/ensure.sh), serving a tiny random-weight GGUF made from the repo's tokenizer."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llama_env import TOKENIZER_DIR, make_gguf
from llama_fleet import LlamaFleet, LlamaServer, ServerConfig, ensure_binary


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    try:
        return ensure_binary()
    except subprocess.CalledProcessError as e:
        pytest.fail(f"llama-server could not be built here (hack/llama/ensure.sh failed: {e})")


@pytest.fixture(scope="session")
def llama_model() -> Path:
    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        pytest.fail(
            f"no tokenizer at {TOKENIZER_DIR}: the GGUF embeds the repo's tiny tokenizer "
            "(set LLAMA_TOKENIZER_DIR to another Hugging Face tokenizer directory)"
        )
    try:
        return make_gguf.ensure_model(TOKENIZER_DIR)
    except ModuleNotFoundError as e:
        pytest.fail(f"{e}: the model is written with the `llama` extra (make llama)")


@pytest.fixture
async def llama_fleet(tmp_path: Path) -> AsyncIterator[LlamaFleet]:
    async with LlamaFleet(tmp_path / "logs") as fleet:
        yield fleet


@pytest.fixture
async def llama_server(
    llama_fleet: LlamaFleet, llama_binary: Path, llama_model: Path
) -> LlamaServer:
    """One server, two slots, the launcher's default host prompt cache."""
    (server,) = await llama_fleet.start(1, llama_binary, llama_model, ServerConfig(slots=2))
    return server
