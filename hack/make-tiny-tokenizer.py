"""Make the simulator's tiny Hugging Face tokenizer: a byte-level BPE trained here, on local text.

Writes sim/engine_sim/data/tiny-tokenizer/{tokenizer.json, tokenizer_config.json}: the two
files vLLM (and transformers' AutoTokenizer) read, in their formats, shaped like Llama 3's:
- the same pre-tokenizer (the cl100k split pattern, then byte-level), so any text round-trips;
- 4,088 learned tokens (256 bytes + merges), then 8 special tokens at the end of the
  vocabulary (ids 4088-4095), as Llama 3 puts its specials after the text tokens;
- a post-processor that puts <|begin_of_text|> first when special tokens are added;
- a chat template of the Llama 3 kind (header tokens around each role, <|eot_id|> after each
  message, tools in the system block), written for this project.

Nothing is downloaded. The training text is the Debian license texts in
/usr/share/common-licenses (English prose), plus pseudo-words made from a fixed seed in the
style of the benchmark's prompts (bench/workloads.py), so both tokenize plausibly. Training is
deterministic: the same inputs give the same files (the script prints the inputs' digest).

    .venv/bin/python hack/make-tiny-tokenizer.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = Path(__file__).resolve().parent.parent / "sim/engine_sim/data/tiny-tokenizer"
LICENSES = Path("/usr/share/common-licenses")
LEARNED = 4088
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
]
# The split Llama 3 and cl100k use before byte-level BPE: contractions, letter runs with one
# leading non-letter, 1-3 digit groups, punctuation runs, newlines, other whitespace.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SYLLABLES = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]

CHAT_TEMPLATE = """\
{{- bos_token }}
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = none %}
{%- endif %}
{%- if system_message is not none or tools %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
    {%- if tools %}
        {{- 'Functions you may call, one JSON object each. To call one, answer with ' }}
        {{- '{"name": <function name>, "parameters": <arguments object>}.\\n\\n' }}
        {%- for tool in tools %}
            {{- tool | tojson(indent=4) }}
            {{- '\\n\\n' }}
        {%- endfor %}
    {%- endif %}
    {%- if system_message is not none %}
        {{- system_message | trim }}
    {%- endif %}
    {{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- set calls = message['tool_calls'] if message['tool_calls'] is defined else none %}
    {%- if message['role'] == 'assistant' and calls %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- for call in calls %}
            {%- set fn = call['function'] if call['function'] is defined else call %}
            {{- '{"name": ' + fn['name'] | tojson + ', "parameters": ' }}
            {{- fn['arguments'] | tojson + '}' }}
        {%- endfor %}
        {{- '<|eot_id|>' }}
    {%- elif message['role'] == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
        {{- message['content'] or '' }}
        {{- '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {{- (message['content'] or '') | trim }}
        {{- '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def corpus() -> tuple[list[str], str]:
    """The training text, in a fixed order, and a digest of it."""
    if not LICENSES.is_dir():
        raise SystemExit(f"{LICENSES} is missing (Debian's base-files package provides it)")
    texts = []
    for p in sorted(LICENSES.iterdir()):
        if p.is_file():
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
    rng = random.Random(20261206)
    for _ in range(400):
        words = (
            "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(50, 400))
        )
        texts.append(" ".join(words))
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    return texts, digest


def build(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != LEARNED:
        raise SystemExit(f"learned {tok.get_vocab_size()} tokens, wanted {LEARNED}")
    tok.add_special_tokens(SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return tok


def config(tok: Tokenizer) -> dict:
    added = {
        str(tok.token_to_id(s)): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIALS
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    texts, digest = corpus()
    tok = build(texts)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps(config(tok), indent=2) + "\n")
    print(f"{args.out}: {tok.get_vocab_size()} tokens; training text sha256 {digest}")


if __name__ == "__main__":
    main()
