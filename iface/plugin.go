package iface

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// ProtocolVersion is the go-plugin protocol version of this package's gRPC
// protocol (hydra.backend.v1). A v2 protocol would be added to
// VersionedPlugins beside v1, so that go-plugin negotiates the newest version
// both sides speak.
const ProtocolVersion = 1

// PluginName is the name the backend is dispensed under.
const PluginName = "backend"

// MaxMessageSize bounds one gRPC message either way. StateGet chunks reach
// 64 MiB; gRPC's default 4 MiB receive limit, which go-plugin leaves in place
// on the plugin's server, would refuse them.
const MaxMessageSize = 128 << 20

// Handshake is checked by both sides before anything else. The magic cookie
// is not security: it only stops a plugin binary run by hand from waiting on
// a host that is not there.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "HYDRA_ENGINE_PLUGIN",
	MagicCookieValue: "1d1d3f498e3dcfc9be9f04ab7cd50be0d9b38717044e9f68ed88b804476e27d6",
}

// VersionedPlugins are the plugin sets the host accepts, by protocol version.
// The host side uses them as is; Serve builds its own with Impl set.
var VersionedPlugins = map[int]plugin.PluginSet{
	ProtocolVersion: {PluginName: &BackendPlugin{}},
}

// BackendPlugin is the go-plugin Plugin for Backend, gRPC only.
type BackendPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the implementation served; set on the plugin side only.
	Impl Backend
	// Extend, if set, wraps the adapter before it is registered, so a data
	// plane (transport/shm) can answer its own calls.
	Extend func(*GRPCServer) backendv1.BackendServer
}

var _ plugin.GRPCPlugin = (*BackendPlugin)(nil)

// GRPCServer registers Impl on the plugin's gRPC server.
func (p *BackendPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("iface: BackendPlugin served without an Impl")
	}
	var srv backendv1.BackendServer = &GRPCServer{Impl: p.Impl}
	if p.Extend != nil {
		srv = p.Extend(srv.(*GRPCServer))
	}
	backendv1.RegisterBackendServer(s, srv)
	return nil
}

// GRPCClient returns the host side's Backend over the plugin connection.
func (p *BackendPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewGRPCClient(c), nil
}

// NewPluginLogger returns the logger a plugin should pass to Serve and use
// itself: hclog JSON on the process's stderr, which the host's go-plugin
// client parses line by line and re-logs, with level and fields, through its
// own logger (that logger's level decides what is shown, so everything is
// emitted here). Create it before Serve: Serve points os.Stderr at a pipe
// whose output the host discards, so a logger created afterwards on
// os.Stderr is lost.
func NewPluginLogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      hclog.Trace,
		Output:     os.Stderr,
		JSONFormat: true,
	})
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Logger is the plugin's logger; nil means NewPluginLogger("backend").
	Logger hclog.Logger
	// Extend wraps the gRPC adapter (BackendPlugin.Extend): plugins pass
	// shm.Extend so state bytes can travel through shared memory.
	Extend func(*GRPCServer) backendv1.BackendServer
}

// Serve runs b as a backend plugin; a plugin's main calls it and it returns
// when the host is done with the plugin.
func Serve(b Backend, opts ServeOptions) {
	plugin.Serve(serveConfig(b, opts))
}

func serveConfig(b Backend, opts ServeOptions) *plugin.ServeConfig {
	logger := opts.Logger
	if logger == nil {
		logger = NewPluginLogger(PluginName)
	}
	return &plugin.ServeConfig{
		HandshakeConfig: Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			ProtocolVersion: {PluginName: &BackendPlugin{Impl: b, Extend: opts.Extend}},
		},
		GRPCServer: newGRPCServer,
		Logger:     logger,
	}
}

// newGRPCServer is the plugin's gRPC server: go-plugin's defaults with the
// message limits raised. opts carries go-plugin's own options (TLS).
func newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
	)
	return grpc.NewServer(opts...)
}

// NewClientConfig returns the host's go-plugin configuration for running the
// plugin cmd. The plugin's JSON logs on its stderr are re-logged through
// logger; SyncStdout/SyncStderr stay nil, so what plugin code prints to
// os.Stdout/os.Stderr after Serve is discarded (output of C code writing to
// fd 1/2 directly still reaches the log).
func NewClientConfig(cmd *exec.Cmd, logger hclog.Logger) *plugin.ClientConfig {
	return &plugin.ClientConfig{
		HandshakeConfig: Handshake,
		// A copy: the client adds to the map it is given in some
		// configurations, and VersionedPlugins is shared.
		VersionedPlugins: maps.Clone(VersionedPlugins),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithDefaultCallOptions(
				grpc.MaxCallRecvMsgSize(MaxMessageSize),
				grpc.MaxCallSendMsgSize(MaxMessageSize),
			),
		},
	}
}

// Dispense connects to the plugin c runs (starting it if needed) and returns
// its Backend.
func Dispense(c *plugin.Client) (*GRPCClient, error) {
	rpc, err := c.Client()
	if err != nil {
		return nil, fmt.Errorf("connect to backend plugin: %w", err)
	}
	raw, err := rpc.Dispense(PluginName)
	if err != nil {
		return nil, fmt.Errorf("dispense backend plugin: %w", err)
	}
	b, ok := raw.(*GRPCClient)
	if !ok {
		return nil, fmt.Errorf("dispense backend plugin: got %T, not an iface.GRPCClient", raw)
	}
	return b, nil
}
