package enginetest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// bin holds the engine and the mock plugin, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "enginetest-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := Build(dir, BuildOptions{Commands: []string{"hydra-engine", "hydra-plugin-mock"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	bin = dir
	return m.Run()
}

// TestStartStop: an engine with HTTP, waited for until INFO answers, serves
// on every address it gives, has its mock plugin as a child, and stops with
// exit status 0, its temporary socket directory gone.
func TestStartStop(t *testing.T) {
	ctx := context.Background()
	e, err := Start(ctx, Config{Bin: bin, HTTP: true, WaitInfo: true, Args: []string{"--slots", "1", "--log-level", "debug"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			e.Stop()
		}
	}()
	for _, u := range []string{e.TCP, e.Unix} {
		if err := Ping(ctx, u); err != nil {
			t.Errorf("INFO on %s: %v", u, err)
		}
	}
	resp, err := http.Get("http://" + e.HTTP + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/health: %s", resp.Status)
	}
	pid, err := e.PluginPID()
	if err != nil || pid <= 0 || pid == e.Pid() {
		t.Errorf("plugin pid %d, %v (engine %d)", pid, err, e.Pid())
	}
	if e.Exited() != nil {
		t.Fatalf("a running engine reads as exited: %v", e.Exited())
	}
	sock := strings.TrimPrefix(e.Unix, "unix://")
	stopped = true
	if err := e.Stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, e.Logs)
	}
	select {
	case <-e.Done():
	default:
		t.Fatal("Stop returned before the engine exited")
	}
	if e.WaitErr() != nil || e.Exited() == nil {
		t.Errorf("after Stop: wait error %v, exited %v", e.WaitErr(), e.Exited())
	}
	if _, err := os.Stat(filepath.Dir(sock)); !os.IsNotExist(err) {
		t.Errorf("the socket directory is still there: %v", err)
	}
	if e.Logs.String() == "" {
		t.Error("no engine log at debug level")
	}
}

// TestStartFails: an engine that exits during start is an error that
// carries its log, and leaves nothing running.
func TestStartFails(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), Config{Bin: bin, SockDir: dir, Args: []string{"--no-such-flag"}, StartTimeout: 20 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited during start") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("start with a bad flag: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("a SockDir the caller gave was removed: %v", err)
	}
}

func TestLogTail(t *testing.T) {
	l := NewLog(5)
	fmt.Fprint(l, "abc")
	fmt.Fprint(l, "defg")
	if got := l.String(); got != "cdefg" {
		t.Fatalf("tail %q", got)
	}
	all := NewLog(0)
	fmt.Fprint(all, strings.Repeat("x", 1000))
	if len(all.String()) != 1000 {
		t.Fatal("an unlimited log lost bytes")
	}
}

func TestCommand(t *testing.T) {
	if c := Command("", "/bin/x", "a"); strings.Join(c.Args, " ") != "/bin/x a" {
		t.Fatalf("unpinned: %q", c.Args)
	}
	if c := Command("2-3", "/bin/x", "a"); strings.Join(c.Args, " ") != "taskset -c 2-3 /bin/x a" {
		t.Fatalf("pinned: %q", c.Args)
	}
}
