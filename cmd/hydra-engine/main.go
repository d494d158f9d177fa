// Command hydra-engine serves the Hydra RPC protocol for one backend plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi"
	"github.com/hydra-engine/hydra-engine/host/pluginproc"
	"github.com/hydra-engine/hydra-engine/host/tracing/otlp"
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
	inv, err := parseCommandLine(os.Args, os.LookupEnv, os.Stderr)
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
	if c.llamaServer {
		inv.notes = append(inv.notes, llamaEnvNotes(os.Environ())...)
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name: "hydra-engine", Level: hclog.LevelFromString(c.LogLevel), JSONFormat: c.LogFormat == "json", Output: os.Stderr,
	})
	for _, note := range inv.notes {
		logger.Info(note)
	}
	for _, w := range inv.warnings {
		logger.Warn(w)
	}
	tr, err := otlp.Setup(context.Background(), version, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hydra-engine:", err)
		os.Exit(2)
	}
	if err := run(c, logger, tr); err != nil {
		logger.Error("exiting", "error", err)
		os.Exit(1)
	}
}

// run serves c's backend plugin over Hydra RPC and HTTP until a signal or a
// failed listener stops it, then shuts everything down within the grace,
// the spans of tr (traces) flushed last.
func run(c *Config, logger hclog.Logger, tr *otlp.Provider) error {
	// SIGTERM/SIGINT are caught from the start: one that comes as soon as
	// the listeners answer (a supervisor stopping an engine it just started)
	// is a clean stop, not death by the signal's default action.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	spec, err := pluginproc.ResolvePlugin(c.Backend, c.PluginDir)
	if err != nil {
		return err
	}
	// Each listener (HTTP too) may hold --max-conns connections: lower it
	// where the descriptor limit would leave the plugin, the data plane and
	// files without descriptors.
	shares := len(c.RPC)
	if c.HTTP != "" {
		shares++
	}
	if c.MaxConns, err = host.FitConnLimit(logger, c.MaxConns, shares, c.Slots); err != nil {
		return err
	}
	// Listen before loading, so a taken port fails fast; HTTP answers 503
	// with the startup stage while the model loads (docs/operators.md).
	listeners, err := listenRPC(c, logger)
	defer closeListeners(listeners)
	if err != nil {
		return err
	}
	lend, err := listenLend(c)
	if err != nil {
		return err
	}
	if lend != nil {
		defer lend.Close()
	}
	startup := httpapi.NewStartup()
	errc := make(chan error, len(listeners)+1)
	httpCtx, cutHTTP := context.WithCancelCause(context.Background())
	defer cutHTTP(nil)
	hs, err := serveStartupHTTP(c, logger, startup, httpCtx, errc)
	if err != nil {
		return err
	}
	if hs != nil {
		defer hs.Close()
	}
	startup.SetStage(httpapi.StageListening)

	sv, err := startBackend(ctx, c, spec, startup, logger)
	if err != nil {
		if ctx.Err() != nil { // SIGTERM/SIGINT while loading: a clean stop
			logger.Info("stopped while starting the backend", "error", err)
			return nil
		}
		return err
	}
	defer sv.Close()

	srv, rpc := serveRPC(c, logger, sv.Plugin(), tr.TracerProvider(), listeners, errc)
	sv.Watch(srv)
	startPeering(c, logger, srv, lend)
	if len(c.presets) > 0 {
		srv.SetModelSwitcher(newPresetSwitcher(c, sv, srv))
	}
	startup.Ready(httpapi.Handler(srv, httpOptions(c, logger)))

	err = waitForStop(ctx, c, logger, errc)
	graceEnd := time.Now().Add(c.ShutdownGrace)
	serr := shutdown(c, hs, cutHTTP, srv, rpc)
	flushTraces(tr, graceEnd, logger)
	if serr != nil {
		if err == nil {
			return serr // work was cut short: exit non-zero
		}
		logger.Error("shutdown", "error", serr)
	}
	return err
}

// minTraceFlush is the least time the exporter gets to send the last spans
// when the servers' shutdown used up the grace: those of the requests it cut.
const minTraceFlush = time.Second

// flushTraces sends the spans not yet exported until the grace ends (at
// least minTraceFlush), then stops the exporter.
func flushTraces(tr *otlp.Provider, graceEnd time.Time, logger hclog.Logger) {
	if tr.TracerProvider() == nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), later(graceEnd, time.Now().Add(minTraceFlush)))
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		logger.Warn("traces: not all spans were exported before the shutdown grace ended", "error", err)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// listenRPC opens a listener for every --rpc URL, with TLS when a
// certificate is configured, and returns those it opened even on failure so
// the caller closes them. With rpc_allow the tcp:// and tls:// listeners
// close connections from any other peer at accept.
func listenRPC(c *Config, logger hclog.Logger) ([]net.Listener, error) {
	var lopts []transport.Option
	if c.TLSCert != "" {
		tc, err := transport.ServerTLSConfig(c.TLSCert, c.TLSKey, c.TLSClientCA)
		if err != nil {
			return nil, err
		}
		lopts = append(lopts, transport.WithTLS(tc))
	}
	allow, err := transport.ParseAllowList(c.RPCAllow)
	if err != nil {
		return nil, err
	}
	var listeners []net.Listener
	for _, u := range c.RPC {
		l, err := transport.Listen(u, lopts...)
		if err != nil {
			return listeners, fmt.Errorf("rpc %s: %w", u, err)
		}
		if len(allow) > 0 && l.Addr().Network() == "tcp" {
			l = transport.AllowPeers(l, allow, func(peer string, n int) {
				logger.Warn("closed Hydra RPC connections from peers outside rpc_allow (reported at most every "+
					transport.RefusedLogInterval.String()+")", "url", u, "last_peer", peer, "refused", n, "rpc_allow", allow.String())
			})
		}
		listeners = append(listeners, l)
	}
	return listeners, nil
}

// closeListeners closes every listener, the engine's last step on any return.
func closeListeners(listeners []net.Listener) {
	for _, l := range listeners {
		l.Close()
	}
}

// serveStartupHTTP starts the HTTP server, when one is configured, on the
// startup handler that reports the loading stage until the engine is ready;
// its requests' contexts derive from base (cancelled to cut them at the end
// of a shutdown's grace), and a failure of the server is sent on errc.
func serveStartupHTTP(c *Config, logger hclog.Logger, startup *httpapi.Startup, base context.Context, errc chan<- error) (*http.Server, error) {
	if c.HTTP == "" {
		return nil, nil
	}
	hl, err := net.Listen("tcp", c.HTTP)
	if err != nil {
		return nil, fmt.Errorf("http %s: %w", c.HTTP, err)
	}
	opts := httpapi.ServerOptions{IdleTimeout: c.IdleTimeout, ChunkTimeout: c.ChunkTimeout, MinTransferRate: transferRate(c.MinTransferRate),
		BaseContext: base}
	hs := httpapi.NewServer(startup, opts)
	logger.Info("serving HTTP", "addr", hl.Addr().String())
	go func() {
		if err := hs.Serve(httpapi.LimitListener(httpapi.RateListener(hl, opts), c.MaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	return hs, nil
}

// startBackend launches the backend plugin under a supervisor and loads the
// model, moving the startup stage from loading to loaded.
func startBackend(ctx context.Context, c *Config, spec pluginproc.PluginSpec, startup *httpapi.Startup, logger hclog.Logger) (*pluginproc.Supervisor, error) {
	startup.SetStage(httpapi.StageLoading)
	logger.Info("starting backend", "backend", spec.Name, "path", spec.Path, "options", c.BackendOpts)
	// The supervisor relaunches a plugin that dies (counted in /metrics); a
	// plugin that fails at start fails the engine.
	sv, err := pluginproc.StartSupervised(ctx, spec, iface.LoadRequest{Model: c.Model, NSlots: c.Slots, Options: c.BackendOpts},
		pluginproc.Options{DataPlane: c.DataPlane, SHA256: c.BackendSHA256}, logger)
	if err != nil {
		return nil, err
	}
	p := sv.Plugin()
	startup.SetStage(httpapi.StageLoaded)
	logger.Info("backend loaded", "backend", p.Info.Name, "model", p.Info.Model.Alias, "hash", p.Info.Model.Hash, "slots", p.Info.NSlots)
	return sv, nil
}

// serveRPC builds the Hydra server on the loaded plugin and serves it on
// every listener, sending each listener's end on errc; the returned group
// waits for them all.
func serveRPC(c *Config, logger hclog.Logger, p *pluginproc.Plugin, tp trace.TracerProvider, listeners []net.Listener, errc chan<- error) (*host.Server, *sync.WaitGroup) {
	tun := host.NewTunables()
	tun.SetStateChunkSize(c.StateChunkSize)
	if err := tun.ApplySampler(c.Sampler); err != nil {
		logger.Error("sampler defaults not applied", "error", err) // validate checked them: unreachable
	} else if len(c.Sampler) > 0 {
		logger.Info("engine-wide sampler defaults", "sampler", c.Sampler)
	}
	srv := host.NewServer(p.Backend, p.Info, tun, host.Config{
		Logger: logger, Version: version, IdleTimeout: c.IdleTimeout, ChunkTimeout: c.ChunkTimeout, SocketBuffer: c.SocketBuffer,
		MaxConns: c.MaxConns, PayloadBudget: c.PayloadBudget, MinTransferRate: transferRate(c.MinTransferRate), TransferFloor: c.TransferFloor, StateShmDir: c.StateShmDir,
		TracerProvider: tp,
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
	return srv, &wg
}

// transferRate is the host's minimum transfer rate for the setting's value
// (0: none).
func transferRate(v uint64) int64 {
	if v == 0 {
		return -1
	}
	return int64(min(v, math.MaxInt64))
}

// waitForStop blocks until a signal asks the engine to stop or a listener
// ends, and returns that listener's error.
func waitForStop(ctx context.Context, c *Config, logger hclog.Logger, errc <-chan error) error {
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "grace", c.ShutdownGrace)
		return nil
	case err := <-errc:
		logger.Error("listener failed", "error", err)
		return err
	}
}

// httpCutWait is how long, once the grace has run out, the HTTP requests
// still in progress get to end after they are cut (a streamed completion
// writes its last event and the plugin drops its slot) before their
// connections are closed.
const httpCutWait = time.Second

// shutdown gives HTTP requests (streamed completions) and RPC requests one
// shared grace to finish, and waits for both servers to stop. HTTP requests
// still running then are cut through cutHTTP, each telling its client that
// the engine is shutting down, so that none is still at work in the plugin
// when it is stopped. It returns an error saying what the grace cut short,
// if anything, so that the engine exits non-zero when work was lost.
func shutdown(c *Config, hs *http.Server, cutHTTP context.CancelCauseFunc, srv *host.Server, rpc *sync.WaitGroup) error {
	var hwg sync.WaitGroup
	var herr error
	if hs != nil {
		hwg.Add(1)
		go func() {
			defer hwg.Done()
			gctx, cancel := context.WithTimeout(context.Background(), c.ShutdownGrace)
			defer cancel()
			if herr = hs.Shutdown(gctx); herr == nil {
				return
			}
			cutHTTP(httpapi.ErrShuttingDown)
			cctx, cancel := context.WithTimeout(context.Background(), httpCutWait)
			defer cancel()
			if hs.Shutdown(cctx) != nil {
				hs.Close()
			}
		}()
	}
	cut := srv.Shutdown(c.ShutdownGrace)
	hwg.Wait()
	rpc.Wait()
	var lost []string
	if cut > 0 {
		lost = append(lost, fmt.Sprintf("%d Hydra RPC request(s) cancelled", cut))
	}
	if herr != nil {
		lost = append(lost, fmt.Sprintf("HTTP requests still in progress cancelled (%v)", herr))
	}
	if len(lost) == 0 {
		return nil
	}
	return fmt.Errorf("the shutdown grace of %s ran out: %s", c.ShutdownGrace, strings.Join(lost, "; "))
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

// presetSwitcher switches the engine between the models of its presets and
// the one it started with, relaunching the plugin with each (one model is
// resident at a time).
type presetSwitcher struct {
	sv    *pluginproc.Supervisor
	srv   *host.Server
	loads map[string]iface.LoadRequest // alias → what to load
}

func newPresetSwitcher(c *Config, sv *pluginproc.Supervisor, srv *host.Server) *presetSwitcher {
	ps := &presetSwitcher{sv: sv, srv: srv, loads: map[string]iface.LoadRequest{}}
	for _, p := range c.presets {
		ps.loads[p.alias] = iface.LoadRequest{Model: p.model, NSlots: c.Slots, Options: p.opts}
	}
	if alias := sv.Plugin().Info.Model.Alias; alias != "" {
		if _, ok := ps.loads[alias]; !ok { // back to the model of the command line
			ps.loads[alias] = iface.LoadRequest{Model: c.Model, NSlots: c.Slots, Options: c.BackendOpts}
		}
	}
	return ps
}

func (ps *presetSwitcher) Models() []string { return slices.Sorted(maps.Keys(ps.loads)) }

func (ps *presetSwitcher) Switch(ctx context.Context, alias string) error {
	return ps.sv.Reload(ctx, ps.srv, ps.loads[alias])
}

func (ps *presetSwitcher) Unload(context.Context) error { return ps.sv.Unload(ps.srv) }
