// Package enginetest builds and runs real hydra-engine processes for the
// end-to-end tests (tests/) and the benchmarks (bench/): an engine on a
// plugin binary, listening on a free TCP port and a Unix socket (and HTTP
// when asked), started, waited for until it serves, and stopped. It reports
// failures as errors and does not use the testing package, so the
// benchmarks' programs use it as the tests do.
package enginetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// Module is the product module's path: Build builds its commands.
const Module = "github.com/hydra-engine/hydra-engine"

// Binaries are the commands Build builds by default: the engine, the mock
// plugin and the CLI.
var Binaries = []string{"hydra-engine", "hydra-plugin-mock", "hydractl"}

// BuildOptions says how Build builds.
type BuildOptions struct {
	// Commands are names under the product's cmd/ (default Binaries).
	Commands []string
	// Race builds with the race detector (it needs cgo); otherwise the
	// binaries are static (CGO_ENABLED=0).
	Race bool
	// Flags are more go build flags, e.g. -trimpath.
	Flags []string
}

// Build builds the product's commands into dir with the go command. It runs
// in the product module's root, which `go list -m` finds from the current
// directory inside the product module or a module that requires it (bench/,
// through its replace directive), so a build from either has the product's
// own go.sum.
func Build(dir string, o BuildOptions) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmds := o.Commands
	if len(cmds) == 0 {
		cmds = Binaries
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	args := append([]string{"build", "-o", abs + string(filepath.Separator)}, o.Flags...)
	cgo := "CGO_ENABLED=0"
	if o.Race {
		args, cgo = append(args, "-race"), "CGO_ENABLED=1"
	}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// ModuleRoot is the directory of the product module, as the go command
// resolves it from the current directory.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", Module).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("finding module %s: %w", Module, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s has no directory here", Module)
	}
	return dir, nil
}

// Config is what one engine process is started with.
type Config struct {
	// Bin is the directory holding hydra-engine (and hydra-plugin-mock).
	Bin string
	// Backend is the plugin executable; "" is Bin/hydra-plugin-mock.
	Backend string
	// Args are more engine flags, after the listeners and --backend (a
	// later flag wins over an earlier one).
	Args []string
	// Env are more environment variables (KEY=VALUE) for the engine, after
	// the test process's own.
	Env []string
	// HTTP adds an HTTP listener on a free port (Engine.HTTP); the engine
	// is then ready once /health answers 200 as well.
	HTTP bool
	// WaitInfo waits until INFO answers OK on both Hydra sockets; without
	// it, until they accept a connection. The engine listens before its
	// plugin has loaded, so only INFO says that it serves.
	WaitInfo bool
	// SockDir holds the Unix socket; "" is a new temporary directory,
	// removed by Stop.
	SockDir string
	// CPUs runs the engine (and its plugin, which inherits them) under
	// `taskset -c CPUs` when set.
	CPUs string
	// Wrap runs the engine under a command that execs it, keeping its
	// process id, such as {"prlimit", "--nofile=1024:1024"}; it goes
	// before CPUs' taskset.
	Wrap []string
	// LogTail keeps only the last LogTail bytes of the engine's output;
	// 0 keeps all of it.
	LogTail int
	// DieWithParent has the kernel send the engine SIGTERM when the thread
	// that started it exits, so that an interrupted benchmark leaves no
	// engine behind (the engine takes its plugin's process group down with
	// it). Linux only; elsewhere it does nothing.
	DieWithParent bool
	// StartTimeout bounds the wait until the engine serves (default 60 s);
	// StopTimeout the wait for it to exit after SIGTERM (default 20 s).
	StartTimeout, StopTimeout time.Duration
}

// BackendPath is the plugin executable the configuration runs.
func (c Config) BackendPath() string {
	if c.Backend != "" {
		return c.Backend
	}
	return filepath.Join(c.Bin, "hydra-plugin-mock")
}

// Engine is a running hydra-engine process.
type Engine struct {
	Cmd  *exec.Cmd
	Args []string // its flags
	TCP  string   // tcp://127.0.0.1:PORT
	Unix string   // unix:///DIR/engine.sock
	HTTP string   // host:port of its HTTP listener; "" without Config.HTTP
	Logs *Log     // its stdout and stderr

	cfg     Config
	tmpDir  string // SockDir when Start made it
	done    chan struct{}
	waitErr error // set before done closes
}

// Start starts an engine as cfg says and waits until it serves. On an error
// nothing of it is left running.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 20 * time.Second
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		TCP:  fmt.Sprintf("tcp://127.0.0.1:%d", port),
		Logs: &Log{max: cfg.LogTail},
		cfg:  cfg,
		done: make(chan struct{}),
	}
	dir := cfg.SockDir
	if dir == "" {
		// Short: sun_path is 108 bytes.
		if dir, err = os.MkdirTemp("", "he"); err != nil {
			return nil, err
		}
		e.tmpDir = dir
	}
	e.Unix = "unix://" + filepath.Join(dir, "engine.sock")
	e.Args = []string{"--rpc", e.TCP, "--rpc", e.Unix}
	if cfg.HTTP {
		hp, err := FreePort()
		if err != nil {
			e.removeTmp()
			return nil, err
		}
		e.HTTP = fmt.Sprintf("127.0.0.1:%d", hp)
		e.Args = append(e.Args, "--http", e.HTTP)
	}
	e.Args = append(append(e.Args, "--backend", cfg.BackendPath()), cfg.Args...)
	e.Cmd = Command(cfg.CPUs, filepath.Join(cfg.Bin, "hydra-engine"), e.Args...)
	if len(cfg.Wrap) > 0 {
		e.Cmd = exec.Command(cfg.Wrap[0], append(cfg.Wrap[1:], e.Cmd.Args...)...)
	}
	if len(cfg.Env) > 0 {
		e.Cmd.Env = append(os.Environ(), cfg.Env...)
	}
	e.Cmd.Stdout, e.Cmd.Stderr = e.Logs, e.Logs
	if cfg.DieWithParent {
		dieWithParent(e.Cmd)
	}
	if err := e.Cmd.Start(); err != nil {
		e.removeTmp()
		return nil, err
	}
	go func() { e.waitErr = e.Cmd.Wait(); close(e.done) }()
	if err := e.waitServing(ctx); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// waitServing polls the engine until it serves, it exits, ctx ends or the
// start timeout passes.
func (e *Engine) waitServing(ctx context.Context) error {
	deadline := time.Now().Add(e.cfg.StartTimeout)
	check := func(ctx context.Context, what string) error {
		for {
			err := e.probe(ctx, what)
			if err == nil {
				return nil
			}
			select {
			case <-e.done:
				return fmt.Errorf("engine exited during start: %v\n%s", e.waitErr, e.Logs)
			case <-ctx.Done():
				return ctx.Err()
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("engine not serving %s after %s: %v\n%s", what, e.cfg.StartTimeout, err, e.Logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, u := range []string{e.TCP, e.Unix} {
		if err := check(ctx, u); err != nil {
			return err
		}
	}
	if e.HTTP != "" {
		return check(ctx, "http://"+e.HTTP+"/health")
	}
	return nil
}

// probe checks one listener once: /health answers 200, INFO answers OK
// (Config.WaitInfo) or the socket accepts a connection.
func (e *Engine) probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	switch {
	case strings.HasPrefix(url, "http://"):
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	case e.cfg.WaitInfo:
		return Ping(ctx, url)
	}
	c, err := transport.Dial(ctx, url)
	if err != nil {
		return err
	}
	return c.Close()
}

// Ping sends INFO to url and expects OK.
func Ping(ctx context.Context, url string) error {
	c, err := transport.DialClient(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, _, err := c.Call(ctx, transport.OpInfo, "", nil)
	if err != nil {
		return err
	}
	return resp.Err()
}

// Pid is the engine's process id.
func (e *Engine) Pid() int { return e.Cmd.Process.Pid }

// Done is closed once the engine has exited.
func (e *Engine) Done() <-chan struct{} { return e.done }

// WaitErr is the engine's exit error: nil for exit status 0. Read it only
// after Done is closed.
func (e *Engine) WaitErr() error { return e.waitErr }

// Exited reports the engine's exit with its log, or nil while it runs.
func (e *Engine) Exited() error {
	select {
	case <-e.done:
		return fmt.Errorf("engine exited: %v\n%s", e.waitErr, e.Logs)
	default:
		return nil
	}
}

// Stop ends the engine: SIGTERM, then SIGKILL after the stop timeout. It
// returns the engine's exit error (nil for exit status 0), or that it had to
// be killed; an engine that had exited already gives its exit error.
func (e *Engine) Stop() error {
	defer e.removeTmp()
	select {
	case <-e.done:
		return e.waitErr
	default:
	}
	_ = e.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
		return e.waitErr
	case <-time.After(e.cfg.StopTimeout):
		_ = e.Cmd.Process.Kill()
		<-e.done
		return fmt.Errorf("engine did not stop on SIGTERM within %s\n%s", e.cfg.StopTimeout, e.Logs)
	}
}

func (e *Engine) removeTmp() {
	if e.tmpDir != "" {
		os.RemoveAll(e.tmpDir)
	}
}

// PluginPID returns the process id of the engine's plugin: its child
// process running the configuration's backend executable. The plugin is
// loaded once the engine answers INFO (Config.WaitInfo); before that it
// waits up to 2 s for it to appear.
func (e *Engine) PluginPID() (int, error) {
	exe := filepath.Base(e.cfg.BackendPath())
	var kids []int
	var err error
	for range 100 {
		if kids, err = Children(e.Pid()); err != nil {
			return 0, err
		}
		for _, k := range kids {
			if exeName(k) == exe {
				return k, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("engine %d has no %s child (children: %v)", e.Pid(), exe, kids)
}

// Children lists the child processes of pid, from every thread's children
// file in /proc (a child belongs to the thread that forked it).
func Children(pid int) ([]int, error) {
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("pid %d: no /proc/%d/task/*/children (process gone, or a kernel without CONFIG_PROC_CHILDREN)", pid, pid)
	}
	var kids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited meanwhile
			}
			return nil, err
		}
		for _, s := range strings.Fields(string(b)) {
			k, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("%s: bad pid %q", f, s)
			}
			kids = append(kids, k)
		}
	}
	return kids, nil
}

// exeName is the base name of the process's executable, "" if unknown.
func exeName(pid int) string {
	p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return ""
	}
	return filepath.Base(strings.TrimSuffix(p, " (deleted)"))
}

// Command is exec.Command(name, args...), under `taskset -c cpus` when cpus
// is set (taskset execs name, which keeps the process id).
func Command(cpus, name string, args ...string) *exec.Cmd {
	if cpus == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("taskset", append([]string{"-c", cpus, name}, args...)...)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Log collects a process's output safely; with a limit it keeps only the
// last bytes (enough of a long benchmark's engine log to explain a failure).
type Log struct {
	mu  sync.Mutex
	max int // 0: no limit
	b   []byte
}

// NewLog is a Log keeping the last max bytes (0: all).
func NewLog(max int) *Log { return &Log{max: max} }

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if over := len(l.b) - l.max; l.max > 0 && over > 0 {
		l.b = append(l.b[:0], l.b[over:]...)
	}
	return len(p), nil
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
