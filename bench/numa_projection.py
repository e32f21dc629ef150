#!/usr/bin/env python3
"""Expected decode speed of a Llama-3-8B Q4 at a 32K-token context on a
2-socket server, with and without NUMA placement, from a per-node bandwidth
model. Every input is a flag; the defaults are the assumptions printed with
the table (bench/RESULTS.md, "Memory locality").

Model of a decode step: it reads B bytes (weights + the KV cache at the
current depth), split evenly over the threads. A node's memory controllers
deliver at most eta * L GB/s (L: the node's local read bandwidth as
`ellm probe` measures it; eta: the share of it the engine reaches), and
reads that cross the socket link at most eta * R GB/s per direction (R: a
node's cores reading the other node's memory, also from `ellm probe`). The
step takes as long as the busiest controller or link.

    python3 bench/numa_projection.py                       # the stated example server
    python3 bench/numa_projection.py --local 250 --remote 90 --eta 0.8 --ctx 32768
"""
import argparse


def model_bytes(a):
    """Weight bytes read per token and KV bytes per token of context."""
    d, L, hd = a.n_embd, a.n_layer, a.head_dim
    per_layer = d * a.n_head * hd * 2 + d * a.n_kv_head * hd * 2 + 3 * d * a.n_ff  # q,o + k,v + gate,up,down
    params = per_layer * L + a.n_vocab * d  # + output matrix; of the embedding one row per token
    weights = params * a.bits_per_weight / 8
    kv_per_token = 2 * L * a.n_kv_head * hd * a.kv_bytes
    return params, weights, kv_per_token


def scenarios(B, L, R, eta):
    """(name, seconds per token, what bounds it) for a 2-node machine."""
    l, r = eta * L, eta * R
    out = []
    # distribute: each node's threads read the half stored on their node
    out.append(("--numa-aware (distribute): each node reads its own half", (B / 2) / l, "both nodes' local bandwidth"))
    out.append(("--numa replicate: weights copied per node, KV heads per node", (B / 2) / l,
                "both nodes' local bandwidth (2x weight memory)"))
    # interleave: a quarter of B is remote for each node, both links busy
    t = max((B / 2) / l, (B / 4) / r)
    out.append(("--numa interleave / numactl --interleave=all", t,
                "socket link" if (B / 4) / r > (B / 2) / l else "local bandwidth"))
    # everything on node 0 (a warm page cache filled by one reader, KV written by the main thread)
    t = max(B / l, (B / 2) / r)
    out.append(("no placement, memory on one node (threads on both sockets)", t,
                "socket link" if (B / 2) / r > B / l else "node 0's controllers"))
    out.append(("one socket only (numactl --cpunodebind=0 --membind=0)", B / l, "one node's local bandwidth"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local", type=float, default=360.0, help="GB/s one node's cores read from their own node")
    ap.add_argument("--remote", type=float, default=120.0, help="GB/s one node's cores read from the other node")
    ap.add_argument("--eta", type=float, default=0.80, help="share of the measured bandwidth decode reaches")
    ap.add_argument("--ctx", type=int, default=32768, help="context depth in tokens")
    ap.add_argument("--bits-per-weight", type=float, default=4.5, help="Q4_0: 18 bytes per 32 weights")
    ap.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV element (F16: 2)")
    ap.add_argument("--n-layer", type=int, default=32)
    ap.add_argument("--n-embd", type=int, default=4096)
    ap.add_argument("--n-head", type=int, default=32)
    ap.add_argument("--n-kv-head", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--n-ff", type=int, default=14336)
    ap.add_argument("--n-vocab", type=int, default=128256)
    a = ap.parse_args()
    params, w, kv = model_bytes(a)
    B = w + kv * a.ctx
    print(f"Llama-3-8B shape, {a.bits_per_weight} bits/weight: {params / 1e9:.2f} B weights read per token "
          f"= {w / 1e9:.2f} GB; KV {kv / 1024:.0f} KiB per token x {a.ctx} = {kv * a.ctx / 1e9:.2f} GB; "
          f"{B / 1e9:.2f} GB per decode step")
    print(f"2 nodes, local {a.local:.0f} GB/s per node, remote {a.remote:.0f} GB/s, eta {a.eta:.2f}\n")
    rows = scenarios(B / 1e9, a.local, a.remote, a.eta)
    best = rows[0][1]
    print("| placement | ms/token | tokens/s | vs --numa-aware | bound by |")
    print("|---|---:|---:|---:|---|")
    for name, t, bound in rows:
        print(f"| {name} | {1000 * t:.1f} | {1 / t:.1f} | {best / t:.2f} | {bound} |")


if __name__ == "__main__":
    main()
