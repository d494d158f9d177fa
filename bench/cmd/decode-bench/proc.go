package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is a server process the benchmark starts: its own process group (so
// that stopping it takes its children too, SIGKILL if the benchmark dies
// first), its output in a log file, done closed when it exits.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logFile string
	log     *os.File
	done    chan struct{}
}

func startProc(name, bin string, args, env []string, logFile string) (*proc, error) {
	log, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: exec.Command(bin, args...), logFile: logFile, log: log, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// logText is the log so far.
func (p *proc) logText() string {
	b, _ := os.ReadFile(p.logFile)
	return string(b)
}

// stop sends the group SIGTERM and, after 15 s, SIGKILL; then SIGKILL to
// whatever of the group is left (a runner child).
func (p *proc) stop() error {
	defer p.log.Close()
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop on SIGTERM within 15 s", p.name)
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	return nil
}
