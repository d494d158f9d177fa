// Package pluginproc runs the engine's backend plugin process: it resolves and
// launches it (process group, Pdeathsig, minimal environment, AutoMTLS,
// SHA-256 pin), connects its data plane, and relaunches it when it dies.
package pluginproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// pluginEnv is the environment a plugin gets: only what a backend needs to
// find its libraries and devices, not the operator's whole shell; GORACE
// too, so that a race-built plugin is tuned as its race-built engine is.
func pluginEnv() []string {
	keep := []string{"PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GGML_", "OMP_", "HYDRA_", "GORACE"}
	var env []string
	for _, kv := range os.Environ() {
		for _, k := range keep {
			if strings.HasPrefix(kv, k+"=") || (strings.HasSuffix(k, "_") && strings.HasPrefix(kv, k)) {
				env = append(env, kv)
				break
			}
		}
	}
	return env
}

// Plugin is a running backend plugin process.
type Plugin struct {
	Spec      PluginSpec
	Backend   iface.Backend
	Info      iface.BackendInfo
	DataPlane string // "shm" or "grpc": how state bytes travel
	client    *plugin.Client
	cmd       *exec.Cmd
	shm       *shm.Host
}

// connect returns the plugin's Backend: over the shared-memory plane when
// the plugin serves it, else gRPC streams ("auto"), or an error ("shm").
func (p *Plugin) connect(ctx context.Context, gc *iface.GRPCClient, dataPlane string) (iface.Backend, error) {
	if p.shm == nil {
		return gc, nil
	}
	c, err := shm.Connect(ctx, gc, p.shm)
	switch {
	case err == nil:
		p.DataPlane = "shm"
		return c, nil
	case !errors.Is(err, shm.ErrNotServed):
		return nil, fmt.Errorf("backend %s: asking for the data plane: %w", p.Spec.Name, err)
	case dataPlane == "shm":
		return nil, fmt.Errorf("backend %s does not serve the shm data plane (use --data-plane grpc or auto)", p.Spec.Name)
	}
	p.shm.Close()
	p.shm = nil
	return gc, nil
}

// splices describes how b takes restores from sockets, for the log.
func splices(b iface.Backend) string {
	if c, ok := b.(*shm.Client); ok {
		return c.Splices()
	}
	return "false"
}

// Options choose how the host talks to a plugin.
type Options struct {
	// DataPlane carries state bytes: "auto" (the fastest available), "shm"
	// (shared-memory ring beside gRPC) or "grpc" (gRPC streams).
	DataPlane string
	// SHA256, when set (hex), pins the plugin executable: go-plugin hashes
	// the file before it runs it and refuses a mismatch.
	SHA256 string
}

// StartPlugin launches the plugin, negotiates the protocol and loads the
// model. The plugin runs in its own process group (killed as a group) and
// dies with the host (Pdeathsig).
func StartPlugin(ctx context.Context, spec PluginSpec, load iface.LoadRequest, opts Options, logger hclog.Logger) (*Plugin, error) {
	if spec.Variant != "" {
		logger.Info("backend plugin variant", "backend", spec.Name, "variant", spec.Variant, "path", spec.Path, "why", spec.VariantWhy)
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = pluginEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var plane *shm.Host
	if opts.DataPlane != "grpc" {
		h, pluginEnd, err := shm.NewHost()
		switch {
		case err == nil:
			plane = h
			cmd.ExtraFiles = []*os.File{pluginEnd} // fd 3 in the plugin
			cmd.Env = append(cmd.Env, shm.EnvFD+"=3")
			defer pluginEnd.Close() // the plugin has its copy once started
		case opts.DataPlane == "shm":
			return nil, fmt.Errorf("shm data plane: %w", err)
		default:
			logger.Warn("shm data plane unavailable, using gRPC streams", "error", err)
		}
	}
	cfg := iface.NewClientConfig(cmd, logger.Named("plugin."+spec.Name))
	cfg.SkipHostEnv = true
	// The gRPC connection to the plugin is mutually authenticated with
	// certificates made for this launch, so no other local process can
	// drive the backend through the plugin's socket.
	cfg.AutoMTLS = true
	if opts.SHA256 != "" {
		sum, err := hex.DecodeString(opts.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("backend %s: pinned SHA-256 %q is not 64 hex digits", spec.Name, opts.SHA256)
		}
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}
	client := plugin.NewClient(cfg)
	p := &Plugin{Spec: spec, client: client, cmd: cmd, shm: plane, DataPlane: "grpc"}
	gc, err := iface.Dispense(client)
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("starting backend %s (%s): %w", spec.Name, spec.Path, err)
	}
	b, err := p.connect(ctx, gc, opts.DataPlane)
	if err != nil {
		p.Kill()
		return nil, err
	}
	p.Backend = b
	logger.Info("backend data plane", "backend", spec.Name, "data_plane", p.DataPlane, "splice_put", splices(b))
	info, err := b.Load(ctx, load)
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("backend %s: loading: %w", spec.Name, err)
	}
	if info.NSlots <= 0 {
		p.Kill()
		return nil, fmt.Errorf("backend %s reported %d slots", spec.Name, info.NSlots)
	}
	p.Info = info
	return p, nil
}

// Exited reports whether the plugin process has exited.
func (p *Plugin) Exited() bool { return p.client.Exited() }

// Kill stops the plugin and everything it started.
func (p *Plugin) Kill() {
	// Graceful first (go-plugin asks the plugin to exit), then the whole
	// process group (negative pid), so children the plugin started go too.
	done := make(chan struct{})
	go func() { p.client.Kill(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	if p.shm != nil {
		p.shm.Close()
	}
}
