"""The golden prompts (tests/fixtures/vllm-prompts/) against the two renderers of 7fcbe09: the
router's tokens.py and the simulator's hf_tokenizer.py. Run with a worktree of 7fcbe09 first on
the path, the fixtures folder as argument:

    git worktree add ../ab-7fcbe09 7fcbe09
    B=../ab-7fcbe09 PYTHONPATH=$B/router:$B/sim:$B .venv/bin/python \\
        bench/results/agentic/renderers-at-7fcbe09.py tests/fixtures/vllm-prompts
"""

import json
import sys
from pathlib import Path

from engine_sim.hf_tokenizer import TINY_TOKENIZER
from engine_sim.hf_tokenizer import ChatTokenizer as SimTokenizer
from prefix_router.parsing import parse_request
from prefix_router.tokens import ChatTokenizer as RouterTokenizer  # type: ignore[attr-defined]


def verdict(got: list[int], want: list[int]) -> str:
    return "equal" if got == want else f"differs ({len(got)} vs {len(want)} ids)"


def main(fixtures: Path) -> None:
    cases = json.loads((fixtures / "golden-cases.json").read_text())["cases"]
    golden = {c["name"]: c for c in json.loads((fixtures / "golden.json").read_text())["cases"]}
    router, sim = RouterTokenizer(TINY_TOKENIZER), SimTokenizer(TINY_TOKENIZER)
    for c in cases:
        if c["api"] != "chat":
            print(f"{c['name']:32s} router: (no Responses API)      sim: (no Responses API)")
            continue
        body = {"model": "m", **c["body"]}
        want = golden[c["name"]]["token_ids"]
        try:
            vr = verdict(router.prompt_ids(parse_request(json.dumps(body).encode(), "chat")), want)
        except Exception as e:  # what it answered instead
            vr = f"error: {e}"[:40]
        try:
            vs = verdict(sim.chat_ids(body["messages"], body.get("tools"), add_generation_prompt=
                                      body.get("add_generation_prompt", True)), want)  # fmt: skip
        except Exception as e:
            vs = f"error: {e}"[:40]
        print(f"{c['name']:32s} router: {vr:28s} sim: {vs}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
