package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/transport"
)

const (
	// clientReadBuf is the buffer a GET reads the reply body into, reused:
	// what a coordinator forwarding the bytes would do.
	clientReadBuf = 1 << 20
	// rawServerBuf is the raw server's reused send/receive buffer.
	rawServerBuf = 4 << 20
	// transferTimeout bounds one transfer; the slowest (gRPC, 1.2 GB)
	// takes seconds.
	transferTimeout = 10 * time.Minute
)

// The two directions.
const (
	opGet = "STATE_GET"
	opPut = "STATE_PUT"
)

// rawServer is the baseline: a server on the same kind of socket that speaks
// just enough Hydra framing for the benchmark's client code to run unchanged
// against it, and otherwise only moves bytes. STATE_GET replies with size
// bytes written from one reused buffer; STATE_PUT reads the payload into one
// reused buffer and discards it.
type rawServer struct {
	ln   net.Listener
	url  string
	size uint64
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startRawServer(url string, size uint64) (*rawServer, error) {
	ln, err := transport.Listen(url)
	if err != nil {
		return nil, err
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		url = fmt.Sprintf("tcp://127.0.0.1:%d", a.Port) // url asked for port 0
	}
	s := &rawServer{ln: ln, url: url, size: size, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *rawServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

func (s *rawServer) handle(c net.Conn) {
	// The engine's default socket buffers: the baseline must not run on
	// different socket settings.
	_ = host.SetSocketBuffers(c, 0)
	buf := make([]byte, rawServerBuf)
	for i := range buf {
		buf[i] = byte(i) // resident, non-zero pages, like a real chunk buffer
	}
	for {
		h, err := transport.ReadRequestHeader(c)
		if err != nil {
			return
		}
		if _, _, err := transport.ReadKeyTrace(c, h); err != nil {
			return
		}
		switch h.Op {
		case transport.OpStateGet:
			if transport.WriteResponseHeader(c, transport.StatusOK, []byte(`{}`), s.size) != nil {
				return
			}
			for rem := s.size; rem > 0; {
				n := min(rem, uint64(len(buf)))
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
				rem -= n
			}
		case transport.OpStatePut:
			for rem := h.PayloadLen; rem > 0; {
				n, err := c.Read(buf[:min(rem, uint64(len(buf)))])
				if err != nil {
					return
				}
				rem -= uint64(n)
			}
			if transport.WriteResponseHeader(c, transport.StatusOK, []byte(`{"restored":true}`), 0) != nil {
				return
			}
		default:
			return // not a benchmark request: drop the connection
		}
	}
}

func (s *rawServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// getOnce reads slot 0's state with STATE_GET into a reused buffer and
// returns the time from the request to the last byte.
func getOnce(ctx context.Context, c *transport.Client, want uint64, buf []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	start := time.Now()
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: "0"})
	if err != nil {
		return 0, err
	}
	if err := resp.Err(); err != nil {
		return 0, err
	}
	if resp.PayloadLen != want {
		resp.Close()
		return 0, fmt.Errorf("STATE_GET payload is %d bytes, want %d", resp.PayloadLen, want)
	}
	var got uint64
	for {
		n, err := resp.Body.Read(buf)
		got += uint64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	d := time.Since(start)
	if got != want {
		return 0, fmt.Errorf("STATE_GET body ended after %d of %d bytes", got, want)
	}
	return d, nil
}

// putOnce sends blob to slot with STATE_PUT. The payload is the *os.File
// itself, so transport.Client hands it to the connection's ReadFrom: sendfile
// on TCP. It returns the time from the request to the reply, which the
// engine sends after the plugin has verified and restored every byte.
func putOnce(ctx context.Context, c *transport.Client, blob *os.File, size uint64, slot string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	if _, err := blob.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStatePut, Key: slot, Payload: blob, PayloadLen: size})
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	if err := resp.Close(); err != nil {
		return 0, err
	}
	if err := resp.Err(); err != nil {
		return 0, fmt.Errorf("restore failed: %w", err)
	}
	var m struct {
		Restored bool `json:"restored"`
	}
	if err := json.Unmarshal(resp.Meta, &m); err != nil || !m.Restored {
		return 0, fmt.Errorf("STATE_PUT reply does not say restored: %s", resp.Meta)
	}
	return d, nil
}

// gbps is the throughput of n bytes in d, in GB/s (1 GB = 1e9 bytes).
func gbps(n uint64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// median of xs (mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

func best(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

// call sends a small request and fails on a non-OK reply.
func call(ctx context.Context, c *transport.Client, op transport.Op, key string, payload []byte) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	resp, err := c.Do(ctx, transport.Request{Op: op, Key: key, Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		return nil, err
	}
	// Drain, not read: PREFILL answers with the whole state blob.
	if err := resp.Close(); err != nil {
		return nil, err
	}
	if err := resp.Err(); err != nil {
		return nil, err
	}
	var m map[string]any
	if len(resp.Meta) > 0 {
		if err := json.Unmarshal(resp.Meta, &m); err != nil {
			return nil, fmt.Errorf("%s: meta is not JSON: %q", op, resp.Meta)
		}
	}
	return m, nil
}

// metaInt reads a JSON number field of a reply's meta.
func metaInt(m map[string]any, k string) (int64, error) {
	v, ok := m[k].(float64)
	if !ok {
		return 0, fmt.Errorf("reply meta %v has no number %q", m, k)
	}
	return int64(v), nil
}

var errVerify = errors.New("slot 1 does not decode like slot 0")
