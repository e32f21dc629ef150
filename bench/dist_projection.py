#!/usr/bin/env python3
"""Projection of decode with the KV cache sharded over N nodes (`ellm run --mpi`).

Per node and decode step (every input is a flag; the values used are stated
in bench/DIST.md):

  step(N) = t0                                  weights + token-wise work, replicated on every node
          + kv_s_per_token * ctx / N            attention over the node's own share of the KV
          + merge_s_per_float * floats(ctx) / N adding up the node's own parts' partials (exact merge)
                                                (taken out of the fitted per-token cost, which includes it)
          + layers * (finish + exchange(N))     per layer: one all-reduce, then the division

t0 and the per-token attention cost come from measured decode steps of a
Llama-3-8B-shaped model at several depths on one node (linear fit); the merge
cost per partial float and the per-layer finish from `ellm bench --mpi`. The
exchange of a layer does not grow with the context: one all-reduce of a
record per query head, 5 + 2 (head_dim + 1) + ceil(head_dim / 2) int64 (the
merge's bound, its binned sums, the bits of a one-part row).
An all-reduce of B bytes over N nodes costs the cheaper of a ring,
2 (N - 1) hops of latency + 2 (N - 1) / N * B at the link's bandwidth, and
recursive doubling, ceil(log2 N) * (one hop + B at the link's bandwidth).
"""
import argparse
import math


def allreduce_ms(n, nbytes, gbps, lat_us):
    if n <= 1:
        return 0.0
    bw = gbps / 8 * 1e9  # bytes/s
    ring = 2 * (n - 1) * lat_us * 1e-3 + 2 * (n - 1) / n * nbytes / bw * 1e3
    rd = math.ceil(math.log2(n)) * (lat_us * 1e-3 + nbytes / bw * 1e3)
    return min(ring, rd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--part-tokens", type=int, default=512)
    ap.add_argument("--depth-ms", default="0:201,16384:349,32768:434",
                    help="measured one-node decode step (ms) at depths: d:ms,... (linear fit)")
    ap.add_argument("--merge-ns-per-float", type=float, default=5.5,
                    help="cost of adding one partial float into the merge (ellm bench --mpi)")
    ap.add_argument("--finish-us", type=float, default=20.0,
                    help="per layer: bounds, grid and division of one decode step's rows (ellm bench --mpi)")
    ap.add_argument("--contexts", default="100000,200000")
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--links", default="25:20,100:3",
                    help="network links as Gbit/s:latency_us per hop")
    a = ap.parse_args()

    pts = [tuple(float(x) for x in p.split(":")) for p in a.depth_ms.split(",")]
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)  # ms per token
    t0 = my - slope * mx
    rec_floats = a.heads * (a.head_dim + 2)  # one part's partial, one layer
    merge_ms_per_token = a.merge_ns_per_float * 1e-6 * rec_floats * a.layers / a.part_tokens
    kv_ms_per_token = slope - merge_ms_per_token  # reading and scoring the KV (the fit includes the merge)
    kv_bytes_per_token = 2 * a.layers * a.kv_heads * a.head_dim * 2
    rec_bytes = a.heads * (5 + 2 * (a.head_dim + 1) + (a.head_dim + 1) // 2) * 8
    print(f"fit of the one-node steps: t0 = {t0:.1f} ms, {slope * 1e3:.2f} us per token of context; "
          f"merge {merge_ms_per_token * 1e3:.3f} us per token of the node's share")
    print(f"exchange per layer: one all-reduce of {rec_bytes} B, whatever the context")
    print()
    links = [tuple(float(x) for x in l.split(":")) for l in a.links.split(",")]

    def step_ms(N, ctx, gbps, lat_us):
        ex = a.layers * allreduce_ms(N, rec_bytes, gbps, lat_us)
        merge = merge_ms_per_token * ctx / N + (a.layers * a.finish_us * 1e-3 if N > 1 else 0.0)
        return t0 + kv_ms_per_token * ctx / N + merge + ex, ex, merge

    for ctx in [int(c) for c in a.contexts.split(",")]:
        print(f"context {ctx} tokens")
        print()
        print("| nodes | KV per node | link | exchange ms/step | merge ms/step | step ms | tokens/s | vs 1 node | exchange+merge share |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        base = None
        for N in [int(x) for x in a.nodes.split(",")]:
            for gbps, lat_us in links:
                step, ex, merge = step_ms(N, ctx, gbps, lat_us)
                if N == 1 and base is None:
                    base = step
                link = "-" if N == 1 else f"{gbps:.0f} Gb/s, {lat_us:.0f} us"
                print(f"| {N} | {kv_bytes_per_token * math.ceil(ctx / N) / 1e9:.2f} GB | {link} | {ex:.2f} | "
                      f"{merge:.1f} | {step:.0f} | {1000 / step:.2f} | {base / step:.2f}x | "
                      f"{100 * (ex + merge) / step:.1f}% |")
                if N == 1:
                    break
        print()
        for gbps, lat_us in links:
            # smallest N whose exchange + merge exceed its share of attention
            for N in range(2, 1 << 16):
                step, ex, merge = step_ms(N, ctx, gbps, lat_us)
                if ex + merge > kv_ms_per_token * ctx / N:
                    print(f"{gbps:.0f} Gb/s: exchange + merge exceed the node's own attention from {N} nodes on")
                    break
        print()


if __name__ == "__main__":
    main()
