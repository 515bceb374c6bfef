"""The engines' KV events feeding the prefix index (docs/kv-events.md: vLLM's wire format).

wire.py decodes a batch in either of vLLM's encodings; feed.py applies one engine's batches
to the index under the router's own keys; subscriber.py holds the ZMQ sockets, one stream per
engine, with replay on a sequence gap.
"""
