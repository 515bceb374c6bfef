from __future__ import annotations

import base64

import pytest
from operator_builders import model

from prefix_operator.validation import check_store_secret, validate


def reasons(**spec: object) -> list[str]:
    return [p.reason for p in validate(model(**spec))]


def test_a_default_spec_is_valid() -> None:
    assert validate(model()) == []


@pytest.mark.parametrize("args", [["--block-size", "32"], ["--block-size=32"], ["--port=1"],
                                  ["--no-enable-prefix-caching"], ["-tp", "2"]])
def test_vllm_managed_flags_are_refused(args: list[str]) -> None:
    problems = validate(model(engine={"args": args}))
    assert [p.reason for p in problems] == ["ConflictingEngineArgs"]
    assert args[0].split("=")[0] in problems[0].message


def test_sglang_managed_flags_are_refused() -> None:
    assert reasons(engine={"type": "sglang", "args": ["--disable-radix-cache"]}) == \
        ["ConflictingEngineArgs"]
    # engine flags the operator does not manage pass through
    assert reasons(engine={"type": "sglang", "args": ["--mem-fraction-static", "0.8"]}) == []


def test_custom_engine_args_are_free() -> None:
    assert reasons(engine={"type": "custom", "image": "x", "args": ["--port", "1"]}) == []


def test_values_are_not_flags() -> None:
    assert reasons(engine={"args": ["--max-model-len", "8192", "--chat-template", "x"]}) == []


def test_reserved_env() -> None:
    assert reasons(engine={"env": [{"name": "HF_TOKEN", "value": "x"}]}) == ["ReservedEngineEnv"]


def test_kv_capacity_below_one_block() -> None:
    assert reasons(router={"kvCapacityTokens": 8, "blockSize": 16}) == \
        ["KvCapacityBelowBlockSize"]


def test_store_secret() -> None:
    m = model(cacheStore={"type": "external", "url": "redis://x",
                          "passwordSecretRef": {"name": "auth"}})
    assert check_store_secret(m, None).reason == "StoreSecretNotFound"
    assert check_store_secret(m, {"data": {"other": "eA=="}}).reason == "StoreSecretKeyMissing"
    good = {"data": {"password": base64.b64encode(b"pw").decode()}}
    assert check_store_secret(m, good) is None
    assert check_store_secret(model(), None) is None  # managed store: no secret involved
