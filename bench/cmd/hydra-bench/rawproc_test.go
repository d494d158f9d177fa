package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// TestMain lets the test binary stand in for hydra-bench as a raw server
// process (startRawProcess starts os.Executable again).
func TestMain(m *testing.M) {
	if spec := os.Getenv(rawProcEnv); spec != "" {
		os.Exit(serveRawProcess(spec, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func TestParseRawKinds(t *testing.T) {
	for in, want := range map[string]string{
		"inproc": "inproc", "process": "process", "process,inproc": "process inproc", " inproc , process ": "inproc process",
	} {
		got, err := parseRawKinds(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("parseRawKinds(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "thread", "inproc,inproc", "process,"} {
		if got, err := parseRawKinds(bad); err == nil {
			t.Errorf("parseRawKinds(%q) = %q, want an error", bad, got)
		}
	}
}

// TestRawProcess runs a STATE_PUT and a STATE_GET against a raw server
// process over a Unix socket, and checks that closing it ends the process.
func TestRawProcess(t *testing.T) {
	dir := t.TempDir()
	const size = 3<<20 + 123
	blob, err := os.CreateTemp(dir, "blob")
	if err != nil {
		t.Fatal(err)
	}
	defer blob.Close()
	if _, err := blob.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	p, err := startRaw(rawOwnProc, "unix://"+filepath.Join(dir, "raw.sock"), size, "")
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			p.close()
		}
	}()
	ctx := context.Background()
	c, err := transport.DialClient(ctx, p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := p.cpu()
	if _, err := putOnce(ctx, c, blob, size, "1"); err != nil {
		t.Fatal("PUT:", err)
	}
	if _, err := getOnce(ctx, c, size, make([]byte, 1<<20)); err != nil {
		t.Fatal("GET:", err)
	}
	if after := p.cpu(); after < before {
		t.Errorf("server CPU went from %v to %v s", before, after)
	}
	proc := p.(*rawProcess)
	p.close()
	closed = true
	select {
	case <-proc.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the raw server process outlived close")
	}
	if proc.cmd.ProcessState == nil || !proc.cmd.ProcessState.Success() {
		t.Errorf("raw server process ended with %v", proc.cmd.ProcessState)
	}
}

// TestMarkdownTwoRaws: with a second raw server the panels show both raw
// rows and the targets table the engine's ratio to the second one too.
func TestMarkdownTwoRaws(t *testing.T) {
	r := fixtureOf(true)
	for _, p := range r.Panels {
		p.Raw.RawKind = rawInProc
		p.RawAlso = []result{{RawKind: rawOwnProc, GBps: []float64{4.3, 4.4, 4.6}, CPU: p.Raw.CPU}}
	}
	md := markdownOf(t, r,
		"| raw, in-process server (3 transfers) | — | — | 4.00 (4.10) | 1.00 |",
		"| raw, server process (3 transfers) | — | — | 4.40 (4.60) | 1.10 | — | — | — | 0.17 · 0.14 · — |",
		"| raw, in-process server (3 transfers) | — | — | 4.00 (4.10) | 1.00 | — | — | — | 0.17 · — · — |",
		"the same server in a process of its own ran in the same rotation",
		"| target | met | ratio to raw, server process |",
		// 3.8 / 4.4 and 3.0 / 4.4.
		"| shm | TCP loopback | STATE_GET | 2 MiB | 0.950 | ≥ 0.90 | 1.21 | 9.0 / 8.0 | ≤ 64 | yes | 0.864 |",
		"| shm | Unix socket | STATE_PUT | 256 KiB | 0.750 | ≥ 0.80 | 1.21 | 9.0 / 8.0 | ≤ 64 | no: GB/s | 0.682 |",
		"| grpc | TCP loopback | STATE_GET | 2 MiB | — | ≥ 0.90 | — | — | ≤ 64 | not measured | — |",
	)
	if strings.Contains(md, "| raw socket (") {
		t.Error("two raw servers, one row unnamed")
	}
	if err := r.svg(io.Discard); err != nil {
		t.Fatal(err)
	}
}
