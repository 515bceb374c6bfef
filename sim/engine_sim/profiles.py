"""Timing profiles: how long one engine step takes, as a function of what the step does.

One step (one forward pass of a continuous-batching engine with chunked prefill) runs one
decode token for every running sequence past its prefill, plus up to a token budget of prompt
tokens for sequences still in prefill. Its duration is

    step_overhead + decode_per_seq * decoding + decode_per_context_token * context tokens read
                  + prefill_per_token * prefill tokens          (0 for an empty step)

so prefill work admitted on a replica lengthens the step every running sequence waits for:
heavy prefill slows everyone on that replica, which is what makes cache misses expensive
under load. All durations are in simulated seconds; the engine multiplies them by
`--time-scale` before sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    # Fixed cost of a step that does anything (weights read once per step, launch overhead).
    step_overhead_s: float
    # Extra cost per sequence decoded in the step (sampling, per-sequence matmul rows).
    decode_per_seq_s: float
    # Extra cost per token of context the decoded sequences attend over (KV reads).
    decode_per_context_token_s: float
    # Cost per prompt token prefilled in the step (1 / prefill throughput).
    prefill_per_token_s: float
    # Most tokens (decode + prefill) one step may process (vLLM's max_num_batched_tokens).
    max_num_batched_tokens: int
    # KV cache size when --kv-capacity-tokens is not given.
    default_kv_capacity_tokens: int

    def step_time(self, decoding: int, context_tokens: int, prefill_tokens: int) -> float:
        if decoding == 0 and prefill_tokens == 0:
            return 0.0
        return (
            self.step_overhead_s
            + self.decode_per_seq_s * decoding
            + self.decode_per_context_token_s * context_tokens
            + self.prefill_per_token_s * prefill_tokens
        )


# For tests: small, round numbers; a 16-token answer takes ~35 ms, a 1,000-token miss 20 ms.
FAST = Profile(
    name="fast",
    step_overhead_s=0.002,
    decode_per_seq_s=0.000_05,
    decode_per_context_token_s=0.0,
    prefill_per_token_s=0.000_02,
    max_num_batched_tokens=8192,
    default_kv_capacity_tokens=32_768,
)

# Llama-3.1-70B-Instruct, FP8 weights (BF16 KV cache), vLLM, tensor parallel 4 on 4x H100 SXM.
#
# step_overhead_s = 12 ms (~83 tokens/s for a single stream): batch-1 decode is bound by reading
#   the weights; 70.6 GB of FP8 weights / 4 GPUs / 3.35 TB/s HBM3 = 5.3 ms at roofline, and
#   vLLM reaches roughly half of that with TP all-reduces and launch gaps. Consistent with the
#   Lambda Labs vLLM benchmark (LambdaLabsML/vllm-benchmark, benchmark_v0.md): Llama 3.1 70B
#   tp=4 on 4x H100-80GB-SXM, v0.6.0, max-num-seqs 256, 5,000 prompts at rps=inf:
#   2,291 output tokens/s at a median ITL of 63.5 ms, i.e. a full batch of 256 steps in
#   ~63 ms = 12 ms + 256 x 0.2 ms (the two decode terms below together).
# decode_per_seq_s = 0.18 ms and decode_per_context_token_s = 24.5 ns: the KV cache of one token
#   is 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 2 bytes = 327,680 bytes, 81,920 bytes on
#   each of 4 GPUs, read in 24.5 ns at 3.35 TB/s; at that benchmark's ~1k-token contexts the
#   KV term adds ~25 µs a sequence, the rest (0.18 ms) is per-sequence compute and sampling.
#   Cross-check: same Lambda report, Meta-Llama-3.1-70B-Instruct-FP8 on 4x H100 (v0.5.4,
#   320 prompts): 2,243 output tokens/s at 38.3 ms, ~86 sequences a step; the model gives
#   12 + 86 x 0.2 = 29 ms (v0.6.0 removed much of v0.5.4's CPU overhead).
# prefill_per_token_s = 1/15,000 s: NVIDIA's TensorRT-LLM performance table (release 0.5.0,
#   docs/source/performance.md, H100 FP8, LLaMA 70B, TP 4, batch 64): 843 output tokens/s at
#   input 2048 / output 128 vs 3,317 at 128 / 128. The 64 x 2,048 = 131k prompt tokens take
#   ~6.7 s of the 9.7 s batch, ~19,500 prefill tokens/s; vLLM is taken ~25 % slower than
#   TensorRT-LLM. Cross-check: 141 GFLOP a token x 15,000 = 2.1 PFLOP/s, 27 % of the
#   4 x 1,979 TFLOPS dense FP8 of four H100s.
# max_num_batched_tokens = 8,192: vLLM V1's default token budget for the OpenAI server on
#   H100-class GPUs (chunked prefill always on).
# default_kv_capacity_tokens = 600,000: 4 x 80 GB x 0.9 (gpu_memory_utilization) = 288 GB,
#   minus 70.6 GB of weights and ~4 GB a GPU of activations/CUDA graphs = ~200 GB, / 327,680
#   bytes a token = ~610k tokens.
LLAMA_3_1_70B_H100 = Profile(
    name="llama-3.1-70b-h100",
    step_overhead_s=0.012,
    decode_per_seq_s=0.000_18,
    decode_per_context_token_s=24.5e-9,
    prefill_per_token_s=1 / 15_000,
    max_num_batched_tokens=8192,
    default_kv_capacity_tokens=600_000,
)

# No simulated time at all: for measuring the router's own overhead.
ZERO = Profile(
    name="zero",
    step_overhead_s=0.0,
    decode_per_seq_s=0.0,
    decode_per_context_token_s=0.0,
    prefill_per_token_s=0.0,
    max_num_batched_tokens=1 << 30,
    default_kv_capacity_tokens=1_000_000,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (FAST, LLAMA_3_1_70B_H100, ZERO)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
