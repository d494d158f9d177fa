package iface

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// serveInProcess runs impl under Serve's real configuration (plugin.Serve in
// go-plugin's test mode, which skips only the cookie check and the stdout
// handshake line) and connects to it with NewClientConfig's configuration.
func serveInProcess(t *testing.T, impl Backend) *GRPCClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reattach := make(chan *plugin.ReattachConfig, 1)
	closed := make(chan struct{})
	cfg := serveConfig(impl, ServeOptions{Logger: hclog.NewNullLogger()})
	cfg.Test = &plugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed}
	go plugin.Serve(cfg)

	var rc *plugin.ReattachConfig
	select {
	case rc = <-reattach:
	case <-closed:
		t.Fatal("plugin.Serve returned before serving")
	case <-time.After(5 * time.Second):
		t.Fatal("plugin.Serve did not start")
	}

	ccfg := NewClientConfig(nil, hclog.NewNullLogger())
	ccfg.Reattach = rc
	// On reattach go-plugin does not pick the plugin set out of
	// VersionedPlugins itself.
	ccfg.Plugins = ccfg.VersionedPlugins[rc.ProtocolVersion]
	client := plugin.NewClient(ccfg)
	t.Cleanup(func() {
		client.Kill()
		cancel()
		<-closed
	})
	b, err := Dispense(client)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClientConfig(t *testing.T) {
	cmd := exec.Command("/bin/true")
	logger := hclog.NewNullLogger()
	cfg := NewClientConfig(cmd, logger)
	if cfg.HandshakeConfig != Handshake || cfg.Cmd != cmd || cfg.Logger != logger {
		t.Errorf("handshake, cmd or logger not set: %+v", cfg)
	}
	if !slices.Equal(cfg.AllowedProtocols, []plugin.Protocol{plugin.ProtocolGRPC}) {
		t.Errorf("AllowedProtocols = %v, want gRPC only", cfg.AllowedProtocols)
	}
	if cfg.SyncStdout != nil || cfg.SyncStderr != nil {
		t.Error("SyncStdout/SyncStderr set")
	}
	if _, ok := cfg.VersionedPlugins[ProtocolVersion][PluginName].(*BackendPlugin); !ok {
		t.Errorf("VersionedPlugins = %v", cfg.VersionedPlugins)
	}
	if len(cfg.GRPCDialOptions) == 0 {
		t.Error("no GRPCDialOptions: message limits not raised")
	}

	if Handshake.ProtocolVersion != ProtocolVersion || Handshake.MagicCookieKey == "" || Handshake.MagicCookieValue == "" {
		t.Errorf("Handshake = %+v", Handshake)
	}
	scfg := serveConfig(&fakeBackend{}, ServeOptions{})
	if scfg.Logger == nil || scfg.GRPCServer == nil || scfg.HandshakeConfig != Handshake {
		t.Errorf("serve config incomplete: %+v", scfg)
	}
	if p := scfg.VersionedPlugins[ProtocolVersion][PluginName].(*BackendPlugin); p.Impl == nil {
		t.Error("served plugin has no Impl")
	}
	if VersionedPlugins[ProtocolVersion][PluginName].(*BackendPlugin).Impl != nil {
		t.Error("Serve set Impl on the shared VersionedPlugins")
	}
}

// A 64 MiB message each way: both only pass with the limits Serve and
// NewClientConfig raise (the plugin's receive limit would otherwise be 4 MiB).
func TestServeLargeMessages(t *testing.T) {
	const chunk = 64 << 20
	state := randomBytes(chunk)
	firstRead := make(chan int, 1)
	b := serveInProcess(t, &fakeBackend{
		stateGet: func(_ context.Context, _ int, chunkSize int, w io.Writer) (int64, error) {
			n, err := w.Write(state[:min(chunkSize, len(state))])
			return int64(n), err
		},
		statePut: func(_ context.Context, _ int, _ []int32, r io.Reader, size int64) (int64, error) {
			// The server's reader hands out one message at a time, so the
			// first Read shows how much one message carried.
			buf := make([]byte, size)
			n, err := r.Read(buf)
			firstRead <- n
			if err != nil {
				return 0, err
			}
			if _, err := io.ReadFull(r, buf[n:]); err != nil {
				return 0, err
			}
			if !bytes.Equal(buf, state) {
				return 0, ErrBadRequest
			}
			return size, nil
		},
	})

	var w chunkRecorder
	n, err := b.StateGet(context.Background(), 0, chunk, &w)
	if err != nil {
		t.Fatalf("StateGet with %d-byte chunks: %v", chunk, err)
	}
	if n != chunk || !bytes.Equal(w.data, state) || !slices.Equal(w.chunks, []int{chunk}) {
		t.Errorf("StateGet: n=%d chunks=%v", n, w.chunks)
	}

	b.putPiece = chunk
	consumed, err := b.StatePut(context.Background(), 0, nil, bytes.NewReader(state), chunk)
	if err != nil {
		t.Fatalf("StatePut with %d-byte pieces: %v", chunk, err)
	}
	if consumed != chunk {
		t.Errorf("StatePut consumed %d", consumed)
	}
	if got := <-firstRead; got != chunk {
		t.Errorf("first message carried %d bytes, want %d", got, chunk)
	}
}
