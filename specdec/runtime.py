"""How a model runs (dtype, device, linear kernel, threads, weights): a plain settings object with its checks, no
torch here, so that the workflow can check a config's runtime at start-up without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LINEAR_KERNELS = ("invariant", "auto", "default", "weight_major", "avx2")
WEIGHTS = ("safetensors", "gguf")
SESSIONS = ("cached", "fixed")


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
    attention are order-fixed whatever it says).

    session: "cached" (the default) runs each Hugging Face model in a CachedLM (a growing KV cache, each pass as
    many rows as it feeds); "fixed" in a FixedShapeLM (specdec/fixed_shape.py): every pass padded to session_rows
    rows over a static KV cache with a mask, so a step and any verify pass run the same kernels in the same
    reduction order with torch's own kernels, and on cuda each pass replays one CUDA graph. "fixed" needs weights
    "safetensors" and, on the CPU, a linear_kernel other than "invariant" (whose native attention takes no mask;
    off the CPU linear_kernel does not apply). session_rows: R, the rows of every fixed-shape pass.

    argmax_head (weights "gguf" only): the target's greedy one-token steps and verify passes (up to 16 logits, where
    the head's rows come in whole groups of 16) read the top four bits of its Q6_K LM head, then only the head rows
    that can be the argmax (specdec/gguf/argmax_head.py): the same tokens, 58 MB fewer a step on the 1.5B file and a
    verify pass 5-7% shorter on the AMD EPYC Zen 4; sampling keeps every logit."""

    dtype: str = "float32"
    device: str = "cpu"
    linear_kernel: str = "invariant"
    threads: int | None = None
    weights: str = "safetensors"
    session: Literal["cached", "fixed"] = "cached"
    session_rows: int = 16
    argmax_head: bool = False

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
        self._check_session()
        if not isinstance(self.argmax_head, bool):
            raise ValueError(f"runtime argmax_head must be true or false, got {self.argmax_head!r}")
        if self.argmax_head and self.weights != "gguf":
            raise ValueError("runtime argmax_head reads a GGUF file's Q6_K LM head: it needs weights 'gguf'")

    def _check_session(self) -> None:
        if self.session not in SESSIONS:
            raise ValueError(f"runtime session must be one of {SESSIONS}, got {self.session!r}")
        rows = self.session_rows
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ValueError(f"runtime session_rows must be a positive integer (the rows of every fixed-shape pass), "
                             f"got {rows!r}")
        if self.session == "fixed" and self.weights != "safetensors":
            raise ValueError(f"runtime session 'fixed' runs Hugging Face models (weights 'safetensors'); weights "
                             f"{self.weights!r} run on their own order-fixed session")
        if self.session == "fixed" and self.linear_kernel == "invariant" and self.device == "cpu":
            raise ValueError("runtime session 'fixed' is batch-invariant with torch's own kernels; on the CPU "
                             "linear_kernel 'invariant' swaps in the native attention, which takes no mask: set "
                             "linear_kernel (e.g. 'default')")
