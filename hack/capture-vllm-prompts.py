#!/usr/bin/env python3
"""Capture the golden prompts of tests/fixtures/vllm-prompts/ once, with transformers.

vLLM itself cannot run here (its wheel needs CUDA torch; its chat preprocessing imports
vllm.config, which imports torch): see tests/fixtures/vllm-prompts/README.md. So the golden
files are made in two steps that do not use our code:
1. vLLM's preprocessing applied by hand: each case of golden-cases.json holds the conversation
   vLLM hands the template, written from the vLLM source lines its `rules` name;
2. the template and tokenizer applied by transformers' own `apply_chat_template` (the function
   vLLM calls, vllm/renderers/hf.py `safe_apply_chat_template`) on the tiny tokenizer, with the
   case's tools and flags, then the text tokenized without special tokens as vLLM does.

Run in a venv with the transformers vLLM pins (vllm 0.34.0: transformers>=5.16.1,<5.23.0):
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install 'transformers>=5.16.1,<5.23.0'
    /tmp/hf/bin/python hack/capture-vllm-prompts.py
It writes tests/fixtures/vllm-prompts/golden.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "vllm-prompts"
TINY = ROOT / "sim" / "engine_sim" / "data" / "tiny-tokenizer"


def main() -> int:
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    spec = json.loads((FIXTURES / "golden-cases.json").read_text())
    out = []
    for case in spec["cases"]:
        text = tok.apply_chat_template(
            case["conversation"], tools=case["tools"], tokenize=False,
            add_generation_prompt=case["add_generation_prompt"],
            continue_final_message=case["continue_final_message"])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append({"name": case["name"], "text": text, "token_ids": ids})
    golden = {
        "vllm": spec["vllm"],
        "transformers": transformers.__version__,
        "command": "python hack/capture-vllm-prompts.py (see its docstring)",
        "cases": out,
    }
    (FIXTURES / "golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(out)} cases, transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
