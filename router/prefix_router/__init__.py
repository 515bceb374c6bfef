"""prefix-router: an OpenAI-compatible router that sends each request to the engine most likely
to hold its prompt's prefix in KV cache. Start at app.py (HTTP), then core.py (the parts).

Glossary: words that carry one meaning each across the package.
  block        a fixed run of the prompt: `block_size` engine tokens (with a tokenizer) or
               `block_bytes` of canonical prompt (without); engines cache whole blocks only.
  chain, key   a prompt's chained block hashes (prefix.py): hash i names blocks 0..i, so a
               chain's leading run is a prefix. The key is the chain with its seed and size.
  media item   an image, audio or video part of a chat: a span of the prompt (its placeholder's
               tokens, or its record in the canonical bytes) and an identity (the hash of its
               URL or data); every block over the span is keyed with it, as vLLM keys it.
  match        how many leading blocks of a chain a backend holds, as the index tells it.
  hold         a request's chain while it is in flight (sent, its engine not yet answered):
               requests right behind it follow it. Released at its first 2xx byte or its end.
  own          a backend owns a chain once its engine computed it (the first 2xx byte): the
               index records it (or, with KV events, holds it as speculative until the
               engine's own events say so). "Owner" is a backend that owns a block.
  speculative  an owned chain the engine's KV events have not confirmed yet (events mode).
  news         a chain the backend did not hold before this request: other router replicas
               are told at once.
  occupancy    the share of a backend's KV capacity the index thinks in use (0..1), from the
               index's model of the engine's cache; "fill" is the same figure per table.
  capacity     blocks an engine's KV cache holds: configured (`kv_capacity_tokens`), learned
               from reported cached tokens (index/learning.py) or from its first eviction
               (events mode).
  prefill tokens  the one unit of every score and cost (scheduling/scorers/).
"""
