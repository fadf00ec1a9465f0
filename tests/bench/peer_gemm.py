#!/usr/bin/env python3
"""tests/bench/peer_gemm.py - torch's GEMM rates at the shapes of tests/bench/bench_gemm.c.

x (M, K) @ W(N, K)^T forward and dy (M, N) @ W dX, in f32 and in bf16 (what torch.autocast("cpu",
bfloat16) runs a Linear in: oneDNN on CPUs with AVX512-BF16 / AMX), GFLOP/s (2 M N K), best of
--repeat; one Markdown row per GEMM, then the time-weighted rate over all of them. The peers' side
of docs/benchmarks.md's "bf16 GEMM rates".

    python tests/bench/peer_gemm.py [--threads 2] [--repeat 5] [--rows 512]
"""
import argparse
import time

import torch

SHAPES = [(1024, 640), (256, 640), (640, 1024), (2048, 640), (640, 2048), (8192, 640)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=512)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    M = a.rows
    print(f"torch {torch.__version__}, {a.threads} threads, M = {M} rows, best of {a.repeat}, GFLOP/s\n")
    print("| GEMM | N x K | torch f32 | torch bf16 |\n|---|---|---|---|")
    total = {torch.float32: 0.0, torch.bfloat16: 0.0}
    flops_all = 0.0
    for N, K in SHAPES:
        for bwd in (False, True):
            flops = 2.0 * M * N * K
            row = []
            for dt in (torch.float32, torch.bfloat16):
                w = torch.randn(N, K, dtype=dt)
                x = torch.randn(M, N if bwd else K, dtype=dt)
                best = 1e30
                for k in range(a.repeat + 1):
                    t = time.perf_counter()
                    y = x @ w if bwd else x @ w.t()
                    t = time.perf_counter() - t
                    if k > 0:
                        best = min(best, t)
                del y
                total[dt] += best
                row.append(flops / best / 1e9)
            flops_all += flops
            print(f"| {'dX' if bwd else 'fwd'} | {N} x {K} | {row[0]:.0f} | {row[1]:.0f} |")
    print(f"| **all** (time-weighted) | | **{flops_all / total[torch.float32] / 1e9:.0f}** | "
          f"**{flops_all / total[torch.bfloat16] / 1e9:.0f}** |")


if __name__ == "__main__":
    main()
