package pluginproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Supervisor keeps a backend plugin running: go-plugin does not restart a
// plugin that dies, so the supervisor notices the exit, answers requests with
// a clear error meanwhile, and relaunches with exponential backoff (the model
// is loaded again). Slots come back empty; the host's tunables are untouched.
type Supervisor struct {
	spec PluginSpec
	load iface.LoadRequest
	opts Options
	log  hclog.Logger

	// Backoff bounds between relaunch attempts; PollInterval is how often
	// the plugin process is checked.
	MinBackoff, MaxBackoff, PollInterval time.Duration

	mu        sync.Mutex
	cur       *Plugin
	watching  bool
	reloading bool // a Reload replaces the plugin: its exit is no crash
	unloaded  bool // Unload stopped the plugin: none runs until a Reload
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
}

// StartSupervised launches the first plugin; a failure here is returned, not
// retried, so a misconfigured engine fails fast at start.
func StartSupervised(ctx context.Context, spec PluginSpec, load iface.LoadRequest, opts Options, logger hclog.Logger) (*Supervisor, error) {
	p, err := StartPlugin(ctx, spec, load, opts, logger)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	return &Supervisor{
		spec: spec, load: load, opts: opts, log: logger,
		MinBackoff: 500 * time.Millisecond, MaxBackoff: 30 * time.Second, PollInterval: 20 * time.Millisecond,
		cur: p, ctx: sctx, cancel: cancel, done: make(chan struct{}),
	}, nil
}

// Plugin returns the plugin running now.
func (sv *Supervisor) Plugin() *Plugin {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.cur
}

// Watch relaunches the plugin into srv whenever it exits, until Close.
func (sv *Supervisor) Watch(srv *host.Server) {
	sv.mu.Lock()
	sv.watching = true
	sv.mu.Unlock()
	go func() {
		defer close(sv.done)
		t := time.NewTicker(sv.PollInterval)
		defer t.Stop()
		for {
			select {
			case <-sv.ctx.Done():
				return
			case <-t.C:
			}
			sv.mu.Lock()
			p, idle := sv.cur, sv.reloading || sv.unloaded
			sv.mu.Unlock()
			if idle || !p.Exited() {
				continue
			}
			sv.restart(srv, p)
		}
	}()
}

// restart swaps a stand-in for the dead plugin into srv (its slots read
// empty at once), then relaunches it.
func (sv *Supervisor) restart(srv *host.Server, dead *Plugin) {
	sv.log.Error("backend plugin exited; relaunching", "backend", dead.Spec.Name)
	srv.SetBackend(downBackend{name: dead.Spec.Name}, dead.Info)
	dead.Kill() // reap its process group and data plane
	backoff := sv.MinBackoff
	sv.mu.Lock()
	load := sv.load
	sv.mu.Unlock()
	for attempt := 1; ; attempt++ {
		p, err := StartPlugin(sv.ctx, sv.spec, load, sv.opts, sv.log)
		if err == nil {
			sv.mu.Lock()
			sv.cur = p
			sv.mu.Unlock()
			srv.SetBackend(p.Backend, p.Info)
			srv.Stats().PluginRestart()
			sv.log.Info("backend plugin relaunched", "backend", p.Spec.Name, "attempt", attempt)
			return
		}
		if sv.ctx.Err() != nil {
			return
		}
		sv.log.Error("relaunching backend plugin failed", "attempt", attempt, "retry_in", backoff, "error", err)
		select {
		case <-sv.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, sv.MaxBackoff)
	}
}

// Reload replaces the plugin with one loading load (another model, or
// options): srv's slots are emptied at once and its requests answered by
// the stand-in meanwhile; a relaunch after a crash keeps load from then on.
// When load fails, the model before it is loaded back and the error
// returned. Only one model is resident: the old plugin exits first, so that
// two models never need the GPU's memory at once.
func (sv *Supervisor) Reload(ctx context.Context, srv *host.Server, load iface.LoadRequest) error {
	sv.mu.Lock()
	if sv.reloading {
		sv.mu.Unlock()
		return fmt.Errorf("%w: a model switch is under way", iface.ErrBusy)
	}
	old, prev, unloaded := sv.cur, sv.load, sv.unloaded
	sv.reloading = true
	sv.mu.Unlock()
	defer func() {
		sv.mu.Lock()
		sv.reloading = false
		sv.mu.Unlock()
	}()
	srv.SetBackend(downBackend{name: old.Spec.Name}, old.Info)
	srv.SuspendSlots() // while the model switches, slots are refused, not lent to the stand-in
	old.Kill()
	p, err := StartPlugin(ctx, sv.spec, load, sv.opts, sv.log)
	if err != nil && unloaded { // none was loaded: none is loaded back
		sv.log.Error("loading the model asked for failed; no model is loaded", "model", load.Model, "error", err)
		srv.SetBackend(unloadedStandIn(old), unloadedInfo(old))
		srv.SuspendSlots()
		return fmt.Errorf("loading %s: %w", load.Model, err)
	}
	if err != nil {
		sv.log.Error("loading the model asked for failed; loading the previous one back", "model", load.Model, "error", err)
		back, berr := StartPlugin(sv.ctx, sv.spec, prev, sv.opts, sv.log)
		if berr != nil {
			sv.mu.Lock()
			sv.cur = old // exited: the watcher relaunches it with prev
			sv.mu.Unlock()
			return fmt.Errorf("loading %s: %w (and the previous model: %v)", load.Model, err, berr)
		}
		sv.install(srv, back, prev)
		return fmt.Errorf("loading %s: %w", load.Model, err)
	}
	sv.install(srv, p, load)
	return nil
}

// install makes p, loaded with load, the running plugin and srv's backend.
func (sv *Supervisor) install(srv *host.Server, p *Plugin, load iface.LoadRequest) {
	sv.mu.Lock()
	sv.cur, sv.load, sv.unloaded = p, load, false
	sv.mu.Unlock()
	srv.SetBackend(p.Backend, p.Info)
}

// Unload stops the plugin and leaves srv without a model: its slots are
// emptied and suspended, and its requests answered by a stand-in saying no
// model is loaded, until a Reload loads one (the watcher relaunches
// nothing meanwhile). The GPU's memory is free again once it returns.
func (sv *Supervisor) Unload(srv *host.Server) error {
	sv.mu.Lock()
	if sv.reloading {
		sv.mu.Unlock()
		return fmt.Errorf("%w: a model switch is under way", iface.ErrBusy)
	}
	old := sv.cur
	sv.unloaded = true
	sv.mu.Unlock()
	srv.SetBackend(unloadedStandIn(old), unloadedInfo(old))
	srv.SuspendSlots()
	old.Kill()
	sv.log.Info("backend plugin stopped: no model is loaded", "backend", old.Spec.Name, "model", old.Info.Model.Alias)
	return nil
}

// errUnloaded answers requests while no model is loaded.
var errUnloaded = errors.New("no model is loaded (POST /models/unload): POST /models/load, or a request naming a model, loads one")

// unloadedStandIn answers for old's backend once it is stopped by Unload.
func unloadedStandIn(old *Plugin) downBackend {
	return downBackend{name: old.Spec.Name, why: errUnloaded}
}

// unloadedInfo is what the engine reports of a backend holding no model:
// its name and slots, no model identity.
func unloadedInfo(old *Plugin) iface.BackendInfo {
	return iface.BackendInfo{Name: old.Info.Name, Version: old.Info.Version, NSlots: old.Info.NSlots}
}

// Close stops watching and kills the plugin.
func (sv *Supervisor) Close() {
	sv.cancel()
	sv.mu.Lock()
	watching := sv.watching
	sv.mu.Unlock()
	if watching {
		<-sv.done
	}
	sv.Plugin().Kill()
}

// errBackendDown answers requests while the plugin is being relaunched.
var errBackendDown = errors.New("backend is restarting after a crash")

// downBackend stands in for a dead plugin, or one Unload stopped: slots are
// empty, everything else fails with a clear error (why; errBackendDown
// when nil).
type downBackend struct {
	name string
	why  error
}

func (d downBackend) err() error {
	if d.why != nil {
		return fmt.Errorf("%s: %w", d.name, d.why)
	}
	return fmt.Errorf("%s: %w", d.name, errBackendDown)
}

// Down tells the host the backend is not there (host.DownBackend).
func (d downBackend) Down() error { return d.err() }

var _ host.DownBackend = downBackend{}

func (d downBackend) Load(context.Context, iface.LoadRequest) (iface.BackendInfo, error) {
	return iface.BackendInfo{}, d.err()
}
func (d downBackend) Info(context.Context) (iface.BackendInfo, error) {
	return iface.BackendInfo{}, d.err()
}
func (d downBackend) Slot(_ context.Context, slot int) (iface.SlotInfo, error) {
	return iface.SlotInfo{Slot: slot}, nil
}
func (d downBackend) ClearSlot(context.Context, int) error { return nil }
func (d downBackend) Prefill(context.Context, iface.PrefillRequest) (iface.PrefillResult, error) {
	return iface.PrefillResult{}, d.err()
}
func (d downBackend) Tokenize(context.Context, iface.PrefillRequest) (iface.Prompt, error) {
	return iface.Prompt{}, d.err()
}
func (d downBackend) Decode(context.Context, iface.DecodeRequest, func(iface.Token) error) (iface.DecodeResult, error) {
	return iface.DecodeResult{}, d.err()
}
func (d downBackend) StateGet(context.Context, int, int, io.Writer) (int64, error) { return 0, d.err() }
func (d downBackend) StatePut(_ context.Context, _ int, _ []int32, r io.Reader, _ int64) (int64, error) {
	return 0, d.err()
}
func (d downBackend) SetExpertMode(context.Context, string) (string, error) { return "", d.err() }
func (d downBackend) SwapQuant(context.Context, string, string) (iface.SwapResult, error) {
	return iface.SwapResult{}, d.err()
}
func (d downBackend) LendWeights(context.Context) (iface.WeightRegistry, error) {
	return iface.WeightRegistry{}, d.err()
}
func (d downBackend) BindPeer(context.Context, iface.WeightRegistry) (iface.ExpertModeResult, error) {
	return iface.ExpertModeResult{}, d.err()
}
func (d downBackend) Embed(context.Context, iface.EmbedRequest) ([]iface.Embedding, error) {
	return nil, d.err()
}
func (d downBackend) SlotCheckpoint(context.Context, int) (*iface.Checkpoint, error) {
	return nil, d.err()
}
func (d downBackend) PutCheckpoint(context.Context, int, iface.Checkpoint) (bool, string, error) {
	return false, "", d.err()
}
