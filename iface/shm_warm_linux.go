//go:build linux

package iface

import "github.com/hydra-engine/hydra-engine/internal/ringwarm"

// A restore onto the ring that the host reads from the client's socket
// itself (Unix sockets; TCP ones go through the relay) warms the ring's next
// bytes while the socket is empty (GRPCClient.PutWarm). A raw receiver copies
// into the same few bytes again and again, which its core caches; the ring's
// 8 MiB, read by the GPU between the host's writes, is not cached when the
// next bytes land, so the host's copy out of the socket is dearer, and with a
// client's small send window (a Unix socket's ~208 KiB by default) the
// receiver's pace is the sender's. Loading the next bytes while waiting takes
// that cost off the copy: H200, llama plugin, Unix STATE_PUT at 2 MiB,
// hydra-bench tables on three machines, 0.911–1.015 of raw (median 0.968) in
// 17 tables with 1 MiB warmed against 0.869–0.995 (0.92) in 14 without,
// alternating with them; the client's CPU per GB 0.26–0.31 against
// 0.27–0.32, the host's 0.24–0.30 against 0.17–0.21 (docs/benchmarks/
// README.md, 45). DefaultPutWarm is in dataplane.go.

// fillWarm fills buf, at bytes into w's ring (ringwarm), from src: bytes src holds in
// memory first, then non-blocking reads of its socket, warming the bytes
// ahead whenever the socket is empty and waiting on it once they are warm.
// It returns the bytes it filled, with io.ErrUnexpectedEOF if the peer closed
// first.
func fillWarm(src SocketSource, buf []byte, w *ringwarm.Warmer, at int) (int, error) {
	got := 0
	for got < len(buf) && src.Buffered() > 0 {
		n, err := src.Read(buf[got:min(len(buf), got+src.Buffered())])
		got += n
		if err != nil {
			return got, err
		}
	}
	if got == len(buf) {
		return got, nil
	}
	touch := func(got int) (bool, error) { return !w.Touch(at+got, 16<<10), nil }
	err := src.ReadSocket(func(fd uintptr) (int, bool, error) { return ringwarm.Fill(fd, buf, &got, touch) })
	return got, err
}
