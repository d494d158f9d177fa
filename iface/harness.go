package iface

import (
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
)

// TestBackend serves impl in-process through go-plugin's gRPC machinery
// (plugin.TestPluginGRPCConn: a real gRPC connection over a Unix socket) and
// returns the host side's Backend for it, a *GRPCClient. Everything is torn
// down by t.Cleanup.
//
// The in-process server is go-plugin's default one, whose receive limit is
// gRPC's stock 4 MiB rather than MaxMessageSize; the client's StatePut
// pieces (DefaultPutPieceSize) and ordinary requests stay far below it.
func TestBackend(t testing.TB, impl Backend) *GRPCClient {
	t.Helper()
	return TestBackendPlugin(t, &BackendPlugin{Impl: impl})
}

// TestBackendPlugin is TestBackend for a BackendPlugin of the caller's (one
// with Extend set, for a data plane's tests).
func TestBackendPlugin(t testing.TB, p *BackendPlugin) *GRPCClient {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		PluginName: p,
	})
	t.Cleanup(func() {
		// Close asks the server to stop through go-plugin's controller;
		// stop it directly only if that did not happen.
		_ = client.Close()
		select {
		case <-server.DoneCh:
		case <-time.After(5 * time.Second):
			server.Stop()
		}
	})
	raw, err := client.Dispense(PluginName)
	if err != nil {
		t.Fatalf("dispense %s: %v", PluginName, err)
	}
	b, ok := raw.(*GRPCClient)
	if !ok {
		t.Fatalf("dispense %s: got %T, not a *GRPCClient", PluginName, raw)
	}
	return b
}
