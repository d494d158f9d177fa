//go:build linux

package shm

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// testBackend serves impl in-process (iface.TestBackendPlugin) with the
// shared-memory plane wired in, depth buffers in flight (0: auto).
func testBackend(t testing.TB, impl iface.Backend, depth int) *Client {
	t.Helper()
	host, pluginEnd, err := NewHost()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(pluginEnd.Fd()))
	pluginEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	recv, err := newReceiver(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); recv.conn.Close() })
	extend := func(s *iface.GRPCServer) backendv1.BackendServer { return &server{GRPCServer: s, recv: recv} }
	gc := iface.TestBackendPlugin(t, &iface.BackendPlugin{Impl: impl, Extend: extend})
	c, err := Connect(context.Background(), gc, host)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	c.depth = depth
	return c
}
