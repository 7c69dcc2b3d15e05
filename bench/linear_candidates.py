"""Scratch microbenchmark: ms per fp32 linear by backend and row count, weights cycled so none stays in cache."""

import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
SHAPES = {"down 8960->1536": (1536, 8960), "gate 1536->8960": (8960, 1536), "q 1536->1536": (1536, 1536),
          "kv 1536->256": (256, 1536)}
ROWS = [1, 2, 3, 4, 5, 8, 9]
CACHE_BYTES = 96 * 2**20


def candidates(w, b):
    wn = w.numpy()
    bn = b.numpy() if b is not None else None
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
    out = {
        "F.linear": lambda x: F.linear(x, w, b),
        "weight_major": lambda x: (torch.addmm(b.unsqueeze(1), w, x.t()) if b is not None else torch.mm(w, x.t())).t(),
        "onednn_packed": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""),
        "numpy_openblas": lambda x: torch.from_numpy(x.numpy() @ wn.T + (bn if bn is not None else 0)),
    }
    return out


def main():
    which = sys.argv[1:] or list(SHAPES)
    for name in which:
        out_f, in_f = SHAPES[name]
        nbytes = out_f * in_f * 4
        copies = max(2, int(CACHE_BYTES / nbytes) + 1)
        weights = [torch.randn(out_f, in_f) * 0.02 for _ in range(copies)]
        bias = torch.randn(out_f) * 0.01
        fns = [candidates(w, bias) for w in weights]
        for m in ROWS:
            x = torch.randn(m, in_f)
            res = {}
            for cand in fns[0]:
                times = []
                for rep in range(6):
                    for fn in fns:
                        t = time.perf_counter()
                        fn[cand](x)
                        times.append(time.perf_counter() - t)
                med = statistics.median(times[copies:])
                res[cand] = med
            line = "  ".join(f"{c} {res[c] * 1e3:6.2f}ms ({nbytes / res[c] / 1e9:5.1f}GB/s)" for c in res)
            print(f"{name:18s} m={m}: {line}", flush=True)


if __name__ == "__main__":
    main()
