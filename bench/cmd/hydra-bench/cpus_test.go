package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestCheckCPUList(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset here")
	}
	for _, ok := range []string{"", "0", "2-15", "0,2,4-7"} {
		if err := checkCPUList(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"x", "1-", "-1", "1,,2", "1 2", "0-3;"} {
		if err := checkCPUList(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestOwnCPUs(t *testing.T) {
	if l := ownCPUs(); !cpuListRE.MatchString(l) {
		t.Fatalf("own CPUs %q", l)
	}
}

// TestRawProcessPinned: a raw server process started with --server-cpus runs
// on those CPUs, and under its own process ID (taskset execs it).
func TestRawProcessPinned(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset here")
	}
	cpu := strings.SplitN(strings.SplitN(ownCPUs(), ",", 2)[0], "-", 2)[0] // the first CPU we may use
	p, err := startRaw(rawOwnProc, "unix://"+filepath.Join(t.TempDir(), "raw.sock"), 1<<20, cpu)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	rp := p.(*rawProcess)
	if allowed := firstField("/proc/"+strconv.Itoa(rp.cmd.Process.Pid)+"/status", "Cpus_allowed_list"); allowed != cpu {
		t.Fatalf("the raw server process runs on CPUs %q, want %q", allowed, cpu)
	}
}
