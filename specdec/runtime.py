"""How a model runs (dtype, device, linear kernel, threads, weights): a plain settings object with its checks, no
torch here, so that the workflow can check a config's runtime at start-up without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass

LINEAR_KERNELS = ("invariant", "auto", "default", "weight_major", "avx2")
WEIGHTS = ("safetensors", "gguf")


@dataclass(frozen=True)
class Runtime:
    """How a model runs: its dtype, the device, the linear-layer kernel and the torch thread count.

    linear_kernel: "invariant" (the default) runs every product of up to 32 rows and the attention on order-fixed
    native kernels, so that a position's logits are the same bits in a one-token step, in any verify pass and on any
    thread count (kernels.use_invariant_kernels): greedy identity holds by construction. "auto" runs each product on
    the backend measured fastest on this machine per weight shape and row count: up to 5% faster one-token steps on
    an Intel Xeon with AMX, nothing on the AMD EPYC (docs/performance.md), but a verify pass then sums in other
    orders than a step. "default" keeps torch's nn.Linear; "weight_major" and "avx2" run every fp32 product of up to
    16 rows on that backend (specdec/fp32/kernels.py). On the CPU a bf16 model's linear layers become row-adaptive (bf16
    for few rows, an fp32 copy of the same values for many) with any kernel but "default".

    weights: "safetensors" (the default) loads prepared model directories (fp32 or bf16 weights, above); "gguf" runs
    each model from its GGUF file's own quantized tensors on the lean forward (specdec/gguf/loading.py), CPU only,
    fp32 activations: dtype must stay float32, and linear_kernel does not apply (the quantized product and the lean
    attention are order-fixed whatever it says)."""

    dtype: str = "float32"
    device: str = "cpu"
    linear_kernel: str = "invariant"
    threads: int | None = None
    weights: str = "safetensors"

    def __post_init__(self):
        if self.linear_kernel not in LINEAR_KERNELS:
            raise ValueError(f"linear_kernel must be one of {LINEAR_KERNELS}, got {self.linear_kernel!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"runtime weights must be one of {WEIGHTS}, got {self.weights!r}")
        if self.weights == "gguf" and self.dtype != "float32":
            raise ValueError(f"runtime weights 'gguf' run each GGUF file's own tensor types with fp32 activations: "
                             f"dtype must be 'float32', got {self.dtype!r}")
        if self.weights == "gguf" and self.device != "cpu":
            raise ValueError(f"runtime weights 'gguf' run on the CPU only, got device {self.device!r}")
