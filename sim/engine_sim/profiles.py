"""Timing profiles: how long a scheduler step takes.

A step runs one decode token for every running sequence plus up to `max_batched_tokens` of
prefill (chunked prefill, as vLLM V1 schedules by default), so a replica busy prefilling
cache misses slows every sequence on it. Step time =
    step_base + prefill_per_token * prefill tokens in the step
              + kv_read_per_token * context tokens of the decoding sequences.

`llama-3.1-70b-h100`: Llama-3.1-70B, BF16, one vLLM replica tensor-parallel over 4 x H100 SXM
80GB (the 70B shape of vLLM's own benchmarks [VLLM]). Each number is derived from the datasheet
and the model shape with one assumed efficiency, then checked against published measurements;
none is copied from one run. docs/simulator.md has the same derivations with the checks.

Sources (figures quoted as published):
[H100] NVIDIA H100 datasheet, https://www.nvidia.com/en-us/data-center/h100/ : H100 SXM BF16
       Tensor Core 1,979 TFLOPS with sparsity (989 dense), 80 GB HBM3, 3.35 TB/s.
[CFG]  https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json : 80 layers, hidden
       8192, 64 heads (head dim 128), 8 KV heads, FFN 28672, vocab 128256 => 70.55e9
       parameters (the model card rounds to 70.6B).
[HF]   https://huggingface.co/blog/llama31#inference-memory-requirements : 70B KV cache in FP16,
       0.313 GB per 1k tokens.
[NIM]  NVIDIA NIM for LLMs benchmarking, Performance:
       https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance
       Llama-3.3-70B-Instruct (same shape as 3.1-70B), NIM 1.8.0, 2 x H100 80G, FP8, TP2.
       5000 in / 500 out: concurrency 1 TTFT 406.77 ms, ITL 18.58 ms; concurrency 25 / 50 ITL
       38.75 / 59.73 ms. 500 in / 2000 out, concurrency 1: TTFT 47.77 ms, ITL 18.91 ms.
       2 x H100 in FP8 has our peak FLOPS (2 x 1,979 dense) and our weight bytes per HBM
       bandwidth (70.6 GB over 6.7 TB/s), so it stands in for 4 x H100 BF16 (less TP4's
       all-reduce cost).
[TRT]  TensorRT-LLM "Performance of TensorRT-LLM", low-latency table (v0.5 data):
       https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c47297d8c06bafac73/docs/source/performance.md
       LLaMA 70B (Llama 2: same layer shapes), H100 FP8, TP4, batch 1, 2048 input tokens:
       first token 109 ms.
[VLLM] https://blog.vllm.ai/2024/09/05/perf-update.html benchmarks 70B on 4 x H100. vLLM's
       defaults, https://github.com/vllm-project/vllm/blob/main/vllm/engine/arg_utils.py
       (EngineArgs.get_batch_defaults; gpu_memory_utilization): max_num_batched_tokens 8192
       for the API server on GPUs with >= 70 GiB other than A100; gpu_memory_utilization 0.9.

- prefill_per_token 79 us: 2 x 70.6e9 = 141 GFLOP a token [CFG]; 4 x 989 TFLOPS [H100] at an
  assumed 45% model FLOPs utilisation => 12,600 tokens/s => 79 us. Checks: [NIM] 5000 tokens
  in 406.77 ms = 81 us a token (44% of the same peak); [TRT] 2048 in 109 ms = 53 us a token in
  FP8 on 4 GPUs, whose FP8 peak is twice our BF16 one (34% utilisation).
- step_base 15 ms: a decode step reads all 141 GB of BF16 weights [CFG]; 4 x 3.35 TB/s [H100]
  at an assumed 70% achieved => 9.38 TB/s => 15.0 ms. Check: [NIM] ITL 18.58 ms at
  concurrency 1 (this profile: 16 ms there, context and amortised prefill included).
- kv_read_per_token 0.035 us: 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 327,680
  bytes a token [CFG] (= [HF]'s 0.313 GB per 1,024 tokens) / 9.38 TB/s. Check: [NIM] 5000/500
  at concurrency c = 25 / 50, where a step also carries c/500 of a 5,000-token prefill and the
  mean context is 5,250: 15 ms + c x 5,250 x 0.035 us + c/500 x 5,000 x 79 us = 39 / 64 ms,
  against 38.75 / 59.73 ms measured.
- max_batched_tokens 8192: vLLM's default on H100 [VLLM].
- default_kv_capacity_tokens 450,000 (used when --kv-capacity-tokens is not given with this
  profile): 320 GB [H100] x 0.9 [VLLM] - 141 GB weights = 147 GB / 327,680 bytes = 449k
  tokens; activations and CUDA graphs take a few GB of that in practice.
- cpu_load_per_token_s 1.6 us (a CPU-tier hit, with CPU offloading): each of the 4 GPUs
  loads its quarter of a token's 327,680 KV bytes [CFG] over PCIe Gen5 x16, 64 GB/s a
  direction ([H100]: 128 GB/s both ways), at an assumed 80% => 1.6 us, 1/49 of a prefill
  token. vLLM's offloading-connector post
  (https://blog.vllm.ai/2026/01/08/kv-offloading-connector.html) reports CPU hits 2-22x
  faster in TTFT than recomputing, its whole request included.
`fast`: not calibrated; small so tests run quickly while each effect stays visible: a 2 ms step
(60 decode steps of a stream take over 50 ms, which tests use to tell streaming from
buffering), 2 us a prefill token (an 8,192-token miss costs 16 ms more than a hit), no KV-read
term, 200k tokens of KV, a CPU-tier token loaded in 0.1 us (1/20 of its prefill). `zero`: no
simulated time at all (router overhead runs).
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
    cpu_load_per_token_s: float = 0.0  # loading a token's KV from the CPU tier


PROFILES: dict[str, Profile] = {
    "llama-3.1-70b-h100": Profile(
        name="llama-3.1-70b-h100",
        step_base_s=0.015,
        prefill_per_token_s=79e-6,
        kv_read_per_token_s=0.035e-6,
        max_batched_tokens=8192,
        default_kv_capacity_tokens=450_000,
        cpu_load_per_token_s=1.6e-6,
    ),
    "fast": Profile(
        name="fast",
        step_base_s=0.002,
        prefill_per_token_s=2e-6,
        kv_read_per_token_s=0.0,
        max_batched_tokens=8192,
        default_kv_capacity_tokens=200_000,
        cpu_load_per_token_s=0.1e-6,
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


def step_time(
    p: Profile, prefill_tokens: int, context_tokens: int, time_scale: float, load_tokens: int = 0
) -> float:
    return (
        p.step_base_s
        + p.prefill_per_token_s * prefill_tokens
        + p.kv_read_per_token_s * context_tokens
        + p.cpu_load_per_token_s * load_tokens
    ) * time_scale
