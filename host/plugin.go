package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/hydra-engine/hydra-engine/iface"
)

// PluginSpec is how to start a backend plugin process.
type PluginSpec struct {
	Name string   // backend name, for logs
	Path string   // executable
	Args []string // arguments after the executable
}

// EmbeddedPluginArg is the argument with which the engine binary re-executes
// itself as its built-in mock backend.
const EmbeddedPluginArg = "__plugin"

// ResolvePlugin turns --backend into a command: a value with a path
// separator is an executable; a name resolves to hydra-plugin-NAME in
// pluginDir, then beside the engine binary. The mock falls back to the copy
// embedded in the engine binary, so a lone engine binary runs.
func ResolvePlugin(backend, pluginDir string) (PluginSpec, error) {
	if backend == "" {
		return PluginSpec{}, errors.New("no backend given")
	}
	if strings.ContainsRune(backend, os.PathSeparator) {
		p, err := filepath.Abs(backend)
		if err != nil {
			return PluginSpec{}, err
		}
		if err := checkExecutable(p); err != nil {
			return PluginSpec{}, err
		}
		return PluginSpec{Name: strings.TrimPrefix(filepath.Base(p), "hydra-plugin-"), Path: p}, nil
	}
	self, err := os.Executable()
	if err != nil {
		return PluginSpec{}, err
	}
	file := "hydra-plugin-" + backend
	var dirs []string
	if pluginDir != "" {
		dirs = append(dirs, pluginDir)
	}
	dirs = append(dirs, filepath.Dir(self))
	for _, d := range dirs {
		p, err := filepath.Abs(filepath.Join(d, file))
		if err != nil {
			continue
		}
		if checkExecutable(p) == nil {
			return PluginSpec{Name: backend, Path: p}, nil
		}
	}
	if backend == "mock" {
		return PluginSpec{Name: backend, Path: self, Args: []string{EmbeddedPluginArg, "mock"}}, nil
	}
	return PluginSpec{}, fmt.Errorf("backend %q: no executable %s in %s", backend, file, strings.Join(dirs, " or "))
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// pluginEnv is the environment a plugin gets: only what a backend needs to
// find its libraries and devices, not the operator's whole shell.
func pluginEnv() []string {
	keep := []string{"PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GGML_", "OMP_", "HYDRA_"}
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
	shm       *iface.ShmHost
}

// useShm switches the client to the shared-memory plane if the plugin serves
// it; "auto" falls back to gRPC streams, "shm" insists.
func (p *Plugin) useShm(ctx context.Context, b iface.Backend, opts PluginOptions) error {
	gc, ok := b.(*iface.GRPCClient)
	supported := false
	if ok {
		var err error
		if supported, err = gc.DataPlane(ctx); err != nil {
			return fmt.Errorf("backend %s: asking for the data plane: %w", p.Spec.Name, err)
		}
	}
	if !supported {
		if opts.DataPlane == "shm" {
			return fmt.Errorf("backend %s does not serve the shm data plane (use --data-plane grpc or auto)", p.Spec.Name)
		}
		return nil
	}
	gc.UseShm(p.shm, max(opts.RingDepth, 0))
	gc.NoSplice, gc.SplicePipes, gc.RelayUnix, gc.PutWarm = opts.NoSplice, opts.SplicePipes, opts.RelayUnix, opts.PutWarm
	p.DataPlane = "shm"
	return nil
}

// ringDepthName is a configured ring depth for the log.
func ringDepthName(depth int) string {
	if depth <= 0 {
		return "auto"
	}
	return strconv.Itoa(depth)
}

// splices describes how b takes restores from sockets: "false" (the ring),
// "true" (a pipe at every chunk size) or "up to N-byte chunks".
func splices(b iface.Backend) string {
	gc, ok := b.(*iface.GRPCClient)
	switch {
	case !ok || !gc.SplicesPuts():
		return "false"
	case gc.SplicePutMaxChunk() > 0:
		return fmt.Sprintf("up to %d-byte chunks", gc.SplicePutMaxChunk())
	}
	return "true"
}

// PluginOptions choose how the host talks to a plugin.
type PluginOptions struct {
	// DataPlane carries state bytes: "auto" (the fastest available), "shm"
	// (shared-memory ring beside gRPC) or "grpc" (gRPC streams).
	DataPlane string
	// RingDepth is the number of chunk buffers in flight on the shm plane;
	// 0 is auto (iface.RingDepth).
	RingDepth int
	// NoSplice keeps STATE_PUTs from client sockets on the ring instead of
	// splicing them into a pipe for the plugin.
	NoSplice bool
	// SplicePipes is how many pipes a spliced STATE_PUT fills in turn (0:
	// iface.DefaultSplicePipes), where the plugin reads that many.
	SplicePipes int
	// RelayUnix relays STATE_PUTs from Unix sockets onto the ring through
	// the host's pipes, as TCP ones are (iface.GRPCClient.RelayUnix).
	RelayUnix bool
	// PutWarm is how many bytes of the ring ahead a STATE_PUT read from the
	// client's socket into the ring keeps cached while the socket is empty
	// (iface.GRPCClient.PutWarm); 0: none.
	PutWarm int
	// SHA256, when set (hex), pins the plugin executable: go-plugin hashes
	// the file before it runs it and refuses a mismatch.
	SHA256 string
}

// StartPlugin launches the plugin, negotiates the protocol and loads the
// model. The plugin runs in its own process group (killed as a group) and
// dies with the host (Pdeathsig).
func StartPlugin(ctx context.Context, spec PluginSpec, load iface.LoadRequest, opts PluginOptions, logger hclog.Logger) (*Plugin, error) {
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = pluginEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var shm *iface.ShmHost
	if opts.DataPlane != "grpc" {
		h, pluginEnd, err := iface.NewShmHost()
		switch {
		case err == nil:
			shm = h
			cmd.ExtraFiles = []*os.File{pluginEnd} // fd 3 in the plugin
			cmd.Env = append(cmd.Env, iface.ShmEnv+"=3")
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
	p := &Plugin{Spec: spec, client: client, cmd: cmd, shm: shm}
	b, err := iface.Dispense(client)
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("starting backend %s (%s): %w", spec.Name, spec.Path, err)
	}
	p.Backend = b
	p.DataPlane = "grpc"
	if shm != nil {
		if err := p.useShm(ctx, b, opts); err != nil {
			p.Kill()
			return nil, err
		}
	}
	if p.DataPlane == "grpc" && shm != nil {
		shm.Close()
		p.shm = nil
	}
	logger.Info("backend data plane", "backend", spec.Name, "data_plane", p.DataPlane, "ring_depth", ringDepthName(opts.RingDepth), "splice_put", splices(b), "splice_pipes", opts.SplicePipes, "relay_unix", opts.RelayUnix, "put_warm_kib", opts.PutWarm>>10)
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
