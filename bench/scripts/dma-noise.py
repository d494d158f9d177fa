#!/usr/bin/env python3
"""Host-memory traffic like a llama restore's, beside another benchmark.

    dma-noise.py MODE [GBPS] [SECONDS]

Moves 2 MiB pieces of an 8 MiB pinned host ring to the GPU at GBPS (default
3.5) for SECONDS (default 600, or until killed), as the llama plugin uploads
a restore from the shm ring: MODE dma uploads only; write+dma has the CPU
write each piece first (the host's copy from the socket) and then uploads it;
write only writes; sleep does nothing but wake as often (one wake-up a
piece); spin does nothing, busily, never sleeping. Run it in the background
of recv-bench to see whether such a neighbour slows the socket's two ends
(bench/notes.md, 33).
"""
import signal
import sys
import time

import torch

mode = sys.argv[1]
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 3.5
until = time.monotonic() + (float(sys.argv[3]) if len(sys.argv) > 3 else 600)
piece, depth = 2 << 20, 4
host = torch.empty(piece * depth, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(piece * depth, dtype=torch.uint8, device="cuda")
src = torch.arange(piece, dtype=torch.int32).to(torch.uint8)  # what the CPU writes
stream = torch.cuda.Stream()
moved, t0, k = 0, time.monotonic(), 0


def report(*_):
    print(f"dma-noise {mode}: {moved / (time.monotonic() - t0) / 1e9:.2f} GB/s", file=sys.stderr)
    sys.exit(0)


signal.signal(signal.SIGTERM, report)
while time.monotonic() < until:
    h, d = host[k * piece:(k + 1) * piece], dev[k * piece:(k + 1) * piece]
    if "write" in mode:
        h.copy_(src)
    if "dma" in mode:
        with torch.cuda.stream(stream):
            d.copy_(h, non_blocking=True)
        if k == depth - 1:
            stream.synchronize()
    k = (k + 1) % depth
    moved += piece
    if mode != "spin":
        ahead = moved / (rate * 1e9) - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
report()
