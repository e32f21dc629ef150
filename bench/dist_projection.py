#!/usr/bin/env python3
"""Projection of decode with the KV cache sharded over N nodes (`ellm run --mpi`).

Per node and decode step (every input is a flag; defaults are stated in
bench/DIST.md):

  step(N) = t0                                  weights + token-wise work, replicated on every node
          + kv_s_per_token * ctx / N            attention over the node's own share of the KV
          + merge_s_per_float * floats(ctx)     merging every part's partial (each node merges all)
          + layers * allgather(N, bytes(ctx))   one all-gather of partials per layer

t0 and the per-token attention cost come from measured decode steps of a
Llama-3-8B-shaped model at several depths on one node (linear fit); the merge
cost per float from `ellm bench --mpi` with one rank; the all-gather is a ring:
(N - 1) hops of latency plus (N - 1) / N of the gathered bytes at the link's
bandwidth. A part is 512 positions; its partial is n_head * (head_dim + 2)
floats per layer.
"""
import argparse
import math


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--part-tokens", type=int, default=512)
    ap.add_argument("--depth-ms", default="0:201,16384:349,32768:434",
                    help="measured one-node decode step (ms) at depths: d:ms,... (linear fit)")
    ap.add_argument("--merge-ns-per-float", type=float, default=1.75,
                    help="measured merge cost per partial float (ellm bench --mpi, 1 rank, 1 thread)")
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
    kv_ms_per_token = slope - merge_ms_per_token  # what shards: reading and scoring the KV
    kv_bytes_per_token = 2 * a.layers * a.kv_heads * a.head_dim * 2
    print(f"fit of the one-node steps: t0 = {t0:.1f} ms, {slope * 1e3:.2f} us per token of context "
          f"({merge_ms_per_token * 1e3:.2f} us of it merging partials, which every node does for all parts)")
    print()
    links = [tuple(float(x) for x in l.split(":")) for l in a.links.split(",")]
    for ctx in [int(c) for c in a.contexts.split(",")]:
        parts = math.ceil(ctx / a.part_tokens)
        gathered = parts * rec_floats * 4  # bytes per layer, all ranks
        print(f"context {ctx} tokens: {parts} parts, {gathered / 1e6:.2f} MB of partials gathered per layer")
        print()
        print("| nodes | KV per node | link | exchange ms/step | merge ms/step | step ms | tokens/s | vs 1 node | exchange+merge share |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        base = None
        for N in [int(x) for x in a.nodes.split(",")]:
            for gbps, lat_us in links:
                if N == 1:
                    ex = 0.0
                else:
                    per_layer = (N - 1) * lat_us * 1e-3 + (N - 1) / N * gathered / (gbps / 8 * 1e9) * 1e3
                    ex = a.layers * per_layer
                merge = merge_ms_per_token * ctx
                step = t0 + kv_ms_per_token * ctx / N + merge + ex
                if N == 1 and base is None:
                    base = step
                link = "-" if N == 1 else f"{gbps:.0f} Gb/s, {lat_us:.0f} us"
                print(f"| {N} | {kv_bytes_per_token * math.ceil(ctx / N) / 1e9:.2f} GB | {link} | {ex:.1f} | "
                      f"{merge:.1f} | {step:.0f} | {1000 / step:.2f} | {base / step:.2f}x | "
                      f"{100 * (ex + merge) / step:.0f}% |")
                if N == 1:
                    break
        print()
        for gbps, lat_us in links:
            # smallest N whose exchange + merge exceed its share of attention
            for N in range(2, 1025):
                per_layer = (N - 1) * lat_us * 1e-3 + (N - 1) / N * gathered / (gbps / 8 * 1e9) * 1e3
                if a.layers * per_layer + merge_ms_per_token * ctx > kv_ms_per_token * ctx / N:
                    print(f"{gbps:.0f} Gb/s: exchange + merge exceed the node's own attention from {N} nodes on")
                    break
        print()


if __name__ == "__main__":
    main()
