// Command hydra-engine serves the Hydra RPC protocol for one backend plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	rpc          listFlag
	httpAddr     string
	backend      string
	pluginDir    string
	backendOpts  listFlag
	slots        int
	model        string
	logFormat    string
	logLevel     string
	idleTimeout  time.Duration
	chunkTimeout time.Duration
	grace        time.Duration
	showVersion  bool
	dataPlane    string
	ringDepth    int
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("hydra-engine", flag.ContinueOnError)
	fs.Var(&o.rpc, "rpc", "Hydra RPC listener URL, tcp://HOST:PORT or unix:///PATH (repeatable; default tcp://127.0.0.1:9510)")
	fs.StringVar(&o.httpAddr, "http", "", "HTTP listen address for /health and /version (empty: off)")
	fs.StringVar(&o.backend, "backend", "mock", "backend plugin: a name (hydra-plugin-NAME in --plugin-dir or beside this binary) or a path")
	fs.StringVar(&o.pluginDir, "plugin-dir", "", "directory searched first for hydra-plugin-NAME")
	fs.Var(&o.backendOpts, "backend-opt", "backend option key=value, passed to the plugin (repeatable)")
	fs.IntVar(&o.slots, "slots", 4, "number of slots (sequences)")
	fs.StringVar(&o.model, "model", "", "model file for the backend")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", host.DefaultIdleTimeout, "close connections idle this long between requests")
	fs.DurationVar(&o.chunkTimeout, "chunk-timeout", host.DefaultChunkTimeout, "cut a peer that stalls this long inside a request or reply")
	fs.DurationVar(&o.grace, "shutdown-grace", 30*time.Second, "on SIGTERM/SIGINT, let in-flight requests finish for this long")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.dataPlane, "data-plane", "auto", "how state bytes travel to and from the plugin: auto, shm or grpc")
	fs.IntVar(&o.ringDepth, "ring-depth", 4, "chunk buffers in flight on the shm data plane (1 = serial copy-then-send)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if len(o.rpc) == 0 {
		o.rpc = listFlag{"tcp://127.0.0.1:9510"}
	}
	if o.slots < 1 {
		return nil, fmt.Errorf("--slots must be at least 1, got %d", o.slots)
	}
	switch o.dataPlane {
	case "auto", "shm", "grpc":
	default:
		return nil, fmt.Errorf("--data-plane must be auto, shm or grpc, got %q", o.dataPlane)
	}
	if o.ringDepth < 1 || o.ringDepth > 64 {
		return nil, fmt.Errorf("--ring-depth must be in [1, 64], got %d", o.ringDepth)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return nil, fmt.Errorf("--log-format must be text or json, got %q", o.logFormat)
	}
	if hclog.LevelFromString(o.logLevel) == hclog.NoLevel {
		return nil, fmt.Errorf("--log-level %q is not a level", o.logLevel)
	}
	return o, nil
}

func backendOptions(kvs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--backend-opt %q is not key=value", kv)
		}
		m[k] = v
	}
	return m, nil
}

func main() {
	// The engine binary doubles as its embedded mock backend plugin.
	if len(os.Args) == 3 && os.Args[1] == host.EmbeddedPluginArg && os.Args[2] == "mock" {
		logger := hclog.New(&hclog.LoggerOptions{Name: "mock", JSONFormat: true, Output: os.Stderr, Level: hclog.Trace})
		iface.Serve(mock.New(logger), logger)
		return
	}
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hydra-engine:", err)
		os.Exit(2)
	}
	if o.showVersion {
		fmt.Println("hydra-engine", version)
		return
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name: "hydra-engine", Level: hclog.LevelFromString(o.logLevel), JSONFormat: o.logFormat == "json", Output: os.Stderr,
	})
	if err := run(o, logger); err != nil {
		logger.Error("exiting", "error", err)
		os.Exit(1)
	}
}

func run(o *options, logger hclog.Logger) error {
	opts, err := backendOptions(o.backendOpts)
	if err != nil {
		return err
	}
	spec, err := host.ResolvePlugin(o.backend, o.pluginDir)
	if err != nil {
		return err
	}
	// Listen before loading, so a taken port fails fast.
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, u := range o.rpc {
		l, err := transport.Listen(u)
		if err != nil {
			return fmt.Errorf("--rpc %s: %w", u, err)
		}
		listeners = append(listeners, l)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger.Info("starting backend", "backend", spec.Name, "path", spec.Path)
	p, err := host.StartPlugin(ctx, spec, iface.LoadRequest{Model: o.model, NSlots: o.slots, Options: opts},
		host.PluginOptions{DataPlane: o.dataPlane, RingDepth: o.ringDepth}, logger)
	if err != nil {
		return err
	}
	defer p.Kill()
	logger.Info("backend loaded", "backend", p.Info.Name, "model", p.Info.Model.Alias, "hash", p.Info.Model.Hash, "slots", p.Info.NSlots)

	srv := host.NewServer(p.Backend, p.Info, nil, host.Config{
		Logger: logger, Version: version, IdleTimeout: o.idleTimeout, ChunkTimeout: o.chunkTimeout,
	})
	var wg sync.WaitGroup
	errc := make(chan error, len(listeners)+1)
	for i, l := range listeners {
		logger.Info("serving Hydra RPC", "url", o.rpc[i], "addr", l.Addr().String())
		wg.Add(1)
		go func() { defer wg.Done(); errc <- srv.Serve(l) }()
	}
	var hs *http.Server
	if o.httpAddr != "" {
		hl, err := net.Listen("tcp", o.httpAddr)
		if err != nil {
			return fmt.Errorf("--http %s: %w", o.httpAddr, err)
		}
		hs = &http.Server{Handler: srv.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second}
		logger.Info("serving HTTP", "addr", hl.Addr().String())
		go func() {
			if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "grace", o.grace)
	case err = <-errc:
		logger.Error("listener failed", "error", err)
	}
	if hs != nil {
		hs.Close()
	}
	srv.Shutdown(o.grace)
	wg.Wait()
	return err
}
