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
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi"
	"github.com/hydra-engine/hydra-engine/host/pluginproc"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	// The engine binary doubles as its embedded mock backend plugin.
	if len(os.Args) == 3 && os.Args[1] == pluginproc.EmbeddedPluginArg && os.Args[2] == "mock" {
		logger := hclog.New(&hclog.LoggerOptions{Name: "mock", JSONFormat: true, Output: os.Stderr, Level: hclog.Trace})
		iface.Serve(mock.New(logger), iface.ServeOptions{Logger: logger, Extend: shm.Extend})
		return
	}
	inv, err := parseInvocation(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hydra-engine:", err)
		os.Exit(2)
	}
	switch {
	case inv.showVersion:
		fmt.Println("hydra-engine", version)
		return
	case inv.printConfig:
		if err := printConfig(os.Stdout, inv); err != nil {
			fmt.Fprintln(os.Stderr, "hydra-engine:", err)
			os.Exit(1)
		}
		return
	}
	c := &inv.cfg
	logger := hclog.New(&hclog.LoggerOptions{
		Name: "hydra-engine", Level: hclog.LevelFromString(c.LogLevel), JSONFormat: c.LogFormat == "json", Output: os.Stderr,
	})
	if err := run(c, logger); err != nil {
		logger.Error("exiting", "error", err)
		os.Exit(1)
	}
}

func run(c *Config, logger hclog.Logger) error {
	spec, err := pluginproc.ResolvePlugin(c.Backend, c.PluginDir)
	if err != nil {
		return err
	}
	// Listen before loading, so a taken port fails fast; HTTP answers 503
	// with the startup stage while the model loads (§8).
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	var lopts []transport.Option
	if c.TLSCert != "" {
		tc, err := transport.ServerTLSConfig(c.TLSCert, c.TLSKey, c.TLSClientCA)
		if err != nil {
			return err
		}
		lopts = append(lopts, transport.WithTLS(tc))
	}
	for _, u := range c.RPC {
		l, err := transport.Listen(u, lopts...)
		if err != nil {
			return fmt.Errorf("rpc %s: %w", u, err)
		}
		listeners = append(listeners, l)
	}
	startup := httpapi.NewStartup()
	errc := make(chan error, len(listeners)+1)
	var hs *http.Server
	if c.HTTP != "" {
		hl, err := net.Listen("tcp", c.HTTP)
		if err != nil {
			return fmt.Errorf("http %s: %w", c.HTTP, err)
		}
		// No write timeout: a streamed completion lasts as long as it decodes.
		hs = &http.Server{Handler: startup, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: c.IdleTimeout}
		defer hs.Close()
		logger.Info("serving HTTP", "addr", hl.Addr().String())
		go func() {
			if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	startup.SetStage(httpapi.StageListening)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	startup.SetStage(httpapi.StageLoading)
	logger.Info("starting backend", "backend", spec.Name, "path", spec.Path, "options", c.BackendOpts)
	// The supervisor relaunches a plugin that dies (counted in /metrics); a
	// plugin that fails at start fails the engine.
	sv, err := pluginproc.StartSupervised(ctx, spec, iface.LoadRequest{Model: c.Model, NSlots: c.Slots, Options: c.BackendOpts},
		pluginproc.Options{DataPlane: c.DataPlane, SHA256: c.BackendSHA256}, logger)
	if err != nil {
		if ctx.Err() != nil { // SIGTERM/SIGINT while loading: a clean stop
			logger.Info("stopped while starting the backend", "error", err)
			return nil
		}
		return err
	}
	defer sv.Close()
	p := sv.Plugin()
	startup.SetStage(httpapi.StageLoaded)
	logger.Info("backend loaded", "backend", p.Info.Name, "model", p.Info.Model.Alias, "hash", p.Info.Model.Hash, "slots", p.Info.NSlots)

	tun := host.NewTunables()
	tun.SetStateChunkSize(c.StateChunkSize)
	srv := host.NewServer(p.Backend, p.Info, tun, host.Config{
		Logger: logger, Version: version, IdleTimeout: c.IdleTimeout, ChunkTimeout: c.ChunkTimeout, SocketBuffer: c.SocketBuffer,
	})
	for _, l := range listeners {
		if l.Addr().Network() == "unix" {
			hintClientSendBuffer(logger)
			break
		}
	}
	var wg sync.WaitGroup
	for i, l := range listeners {
		logger.Info("serving Hydra RPC", "url", c.RPC[i], "addr", l.Addr().String())
		wg.Add(1)
		go func() { defer wg.Done(); errc <- srv.Serve(l) }()
	}
	sv.Watch(srv)
	startup.Ready(httpapi.Handler(srv))

	select {
	case <-ctx.Done():
		logger.Info("shutting down", "grace", c.ShutdownGrace)
	case err = <-errc:
		logger.Error("listener failed", "error", err)
	}
	// HTTP requests (streamed completions) and RPC requests share the grace.
	var hwg sync.WaitGroup
	if hs != nil {
		gctx, cancel := context.WithTimeout(context.Background(), c.ShutdownGrace)
		defer cancel()
		hwg.Add(1)
		go func() { defer hwg.Done(); _ = hs.Shutdown(gctx) }()
	}
	srv.Shutdown(c.ShutdownGrace)
	hwg.Wait()
	wg.Wait()
	return err
}

// hintClientSendBuffer says, once, when Unix-socket clients that set no
// SO_SNDBUF will send STATE_PUTs through the kernel's small default window:
// an operator can raise net.core.wmem_default; the clients need no change.
func hintClientSendBuffer(logger hclog.Logger) {
	n, err := host.UnixClientSendBuffer()
	if err != nil || n >= host.DefaultUnixSocketBuffer {
		return
	}
	logger.Info("Unix-socket clients that set no SO_SNDBUF send STATE_PUTs with net.core.wmem_default in flight; "+
		"raising it can speed them up (see docs/operators.md)", "wmem_default", n, "suggested", host.DefaultUnixSocketBuffer)
}
