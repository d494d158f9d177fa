//go:build linux

package iface

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBackendShm is TestBackend with the shared-memory data plane wired in,
// depth buffers in flight, all in one process.
func TestBackendShm(t testing.TB, impl Backend, depth int) Backend {
	t.Helper()
	host, pluginEnd, err := NewShmHost()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(pluginEnd.Fd()))
	pluginEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	recv, err := newShmReceiver(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); recv.conn.Close() })
	c := testBackendWith(t, &BackendPlugin{Impl: impl, Shm: recv}).(*GRPCClient)
	if ok, err := c.DataPlane(context.Background()); err != nil || !ok {
		t.Fatalf("DataPlane = %v, %v", ok, err)
	}
	c.UseShm(host, depth)
	return c
}
