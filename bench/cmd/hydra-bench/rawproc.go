package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/bench/internal/proccpu"
	"github.com/hydra-engine/hydra-engine/internal/enginetest"
)

// A raw server in a process of its own: hydra-bench started again with
// rawProcEnv set to "URL SIZE" serves like startRawServer, prints its URL on
// stdout and exits when its stdin closes (the parent is done or died). The
// engine is a process apart from its client; a raw server inside the client's
// process shares that process's scheduler and the cores its goroutines run
// on, which over a Unix socket lets the two ends hand the socket's buffers
// over cache-hot in a way no two processes can.
const rawProcEnv = "HYDRA_BENCH_RAW_SERVER"

// The kinds of raw server (--raw-server).
const (
	rawInProc  = "inproc"  // in this process, beside the client
	rawOwnProc = "process" // a process of its own
)

// parseRawKinds reads --raw-server: one kind or more, each once.
func parseRawKinds(s string) ([]string, error) {
	var kinds []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k != rawInProc && k != rawOwnProc {
			return nil, fmt.Errorf("unknown raw server %q (want %s or %s)", k, rawInProc, rawOwnProc)
		}
		if slices.Contains(kinds, k) {
			return nil, fmt.Errorf("raw server %q given twice", k)
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// startRaw starts a raw server of kind on url; a server process runs on
// cpus when set (--server-cpus).
func startRaw(kind, url string, size uint64, cpus string) (rawBaseline, error) {
	if kind == rawOwnProc {
		return startRawProcess(url, size, cpus)
	}
	return startRawServer(url, size)
}

// rawBaseline is a raw server of either kind.
type rawBaseline interface {
	addr() string
	// cpu is the CPU time the server has used in a process of its own; 0
	// for one inside this process (proccpu.Self counts it).
	cpu() float64
	close()
}

func (s *rawServer) addr() string { return s.url }
func (s *rawServer) cpu() float64 { return 0 }

// serveRawProcess is the child's side; it returns the process's exit code.
func serveRawProcess(spec string, stdin io.Reader, stdout io.Writer) int {
	url, sizeText, ok := strings.Cut(spec, " ")
	size, err := strconv.ParseUint(sizeText, 10, 64)
	if !ok || err != nil {
		fmt.Fprintf(os.Stderr, "hydra-bench raw server: bad %s %q\n", rawProcEnv, spec)
		return 2
	}
	s, err := startRawServer(url, size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hydra-bench raw server:", err)
		return 1
	}
	defer s.close()
	fmt.Fprintln(stdout, s.url)
	_, _ = io.Copy(io.Discard, stdin)
	return 0
}

// rawProcess is the parent's handle on a raw server process.
type rawProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	url   string
	done  chan struct{}
}

func startRawProcess(url string, size uint64, cpus string) (*rawProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := enginetest.Command(cpus, self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", rawProcEnv, url, size))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &rawProcess{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case p.url = <-lines:
		if p.url != "" {
			return p, nil
		}
	case <-time.After(30 * time.Second):
	}
	p.close()
	return nil, errors.New("raw server process did not start")
}

func (p *rawProcess) addr() string { return p.url }

func (p *rawProcess) cpu() float64 {
	s, err := proccpu.Of(p.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	return s
}

func (p *rawProcess) close() {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
