"""Timing profiles: how long a scheduler step takes.

A step runs one decode token for every running sequence plus up to `max_batched_tokens` of
prefill (chunked prefill, as vLLM V1 schedules by default), so a replica busy prefilling
cache misses slows every sequence on it. Step time =
    step_base + prefill_per_token * prefill tokens in the step
              + kv_read_per_token * context tokens of the decoding sequences.

`llama-3.1-70b-h100`: Llama-3.1-70B, BF16, tensor-parallel over 4 x H100 SXM 80GB (the shape of
the published prefix-routing result this project measures itself against). Derived from the
hardware datasheet and the model shape rather than copied from one benchmark run:
- prefill: 2 x 70.6e9 FLOPs per token; 4 x 989 TFLOPS dense BF16 (NVIDIA H100 SXM datasheet)
  at ~45% model FLOPs utilisation => ~12,600 tokens/s => 79 us per prefill token. Published
  vLLM/TensorRT-LLM prefill throughputs for 70B on 4-8 H100s sit in the 10-20k tokens/s band.
- decode: every step reads the 141 GB of BF16 weights: 4 x 3.35 TB/s HBM3 at ~70% achieved
  bandwidth => ~15 ms per step at batch 1, in line with the 15-25 ms inter-token latencies
  reported for 70B on 4 x H100 at low load.
- KV cache read per context token: 80 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes =
  327,680 bytes; at ~9.4 TB/s effective that is 0.035 us per context token per step.
- KV capacity: 320 GB - 141 GB weights - ~30 GB activations/overheads ~= 150 GB => ~450k tokens
  per replica (the default when --kv-capacity-tokens is not given with this profile).
`fast`: small numbers for tests. `zero`: no simulated time at all (router overhead runs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    step_base_s: float
    prefill_per_token_s: float
    kv_read_per_token_s: float
    max_batched_tokens: int
    default_kv_capacity_tokens: int


PROFILES: dict[str, Profile] = {
    "llama-3.1-70b-h100": Profile(
        name="llama-3.1-70b-h100",
        step_base_s=0.015,
        prefill_per_token_s=79e-6,
        kv_read_per_token_s=0.035e-6,
        max_batched_tokens=8192,
        default_kv_capacity_tokens=450_000,
    ),
    "fast": Profile(
        name="fast",
        step_base_s=0.002,
        prefill_per_token_s=2e-6,
        kv_read_per_token_s=0.0,
        max_batched_tokens=8192,
        default_kv_capacity_tokens=200_000,
    ),
    "zero": Profile(
        name="zero",
        step_base_s=0.0,
        prefill_per_token_s=0.0,
        kv_read_per_token_s=0.0,
        max_batched_tokens=1 << 30,
        default_kv_capacity_tokens=1_000_000,
    ),
}


def step_time(p: Profile, prefill_tokens: int, context_tokens: int, time_scale: float) -> float:
    return (
        p.step_base_s
        + p.prefill_per_token_s * prefill_tokens
        + p.kv_read_per_token_s * context_tokens
    ) * time_scale
