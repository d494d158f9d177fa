package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseVariant(t *testing.T) {
	for name, want := range map[string]variant{
		"serve":                {name: "serve"},
		"serve-seq":            {name: "serve-seq", seq: true},
		"ring-4x2048":          {name: "ring-4x2048", ring: true, slots: 4, slot: 2 << 20, deadline: true, msgs: true},
		"ring-2x512-heap-nodl": {name: "ring-2x512-heap-nodl", ring: true, slots: 2, slot: 512 << 10, heap: true, msgs: true},
		"hot-4x1024-nomsg":     {name: "hot-4x1024-nomsg", ring: true, hot: true, slots: 4, slot: 1 << 20, deadline: true},
		"serve-shm":            {name: "serve-shm", shm: true},
		"ring-4x2048-thp":      {name: "ring-4x2048-thp", ring: true, slots: 4, slot: 2 << 20, deadline: true, msgs: true, thp: 1},
		"ring-4x2048-nothp":    {name: "ring-4x2048-nothp", ring: true, slots: 4, slot: 2 << 20, deadline: true, msgs: true, thp: -1},
		"ring-4x2048-lowat512": {name: "ring-4x2048-lowat512", ring: true, slots: 4, slot: 2 << 20, deadline: true, msgs: true, lowat: 512 << 10},
		"pipe-1":               {name: "pipe-1", pipes: 1},
		"pipe-2":               {name: "pipe-2", pipes: 2, msgs: true},
		"pipe-2-nomsg":         {name: "pipe-2-nomsg", pipes: 2},
		"pipe-2-relay":         {name: "pipe-2-relay", pipes: 2, msgs: true, relay: true},
	} {
		if got, err := parseVariant(name); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "raw", "ring", "ring-0x2048", "ring-4x", "ring-4x2048-fast", "hot-x", "ring-4x2048-lowat0", "ring-4x2048-lowat", "ring-4x2048-lowat5x", "pipe-0", "pipe-x", "pipe-02", "pipe-1-nomsg", "pipe-2-fast", "pipe-1-relay", "pipe-2-nomsg-relay", "ring-2x64-poll", "ring-3x64-warm100"} {
		if _, err := parseVariant(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// TestReceivers: every kind of receive loop takes a transfer whole, over a
// real TCP socket (and the ring and serve loops over a Unix socket), and the
// next one after it; the sender waits for each
// transfer's acknowledgement, so a loop that waited for more than the
// payload's tail (SO_RCVLOWAT) would hang until the deadline.
func TestReceivers(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	type tc struct{ network, name string }
	var cases []tc
	for _, name := range []string{"serve", "serve-seq", "serve-shm", "ring-3x64", "ring-3x64-heap-nodl-nomsg", "ring-3x64-thp", "ring-3x64-nothp-nodl", "hot-2x300", "ring-3x64-lowat256", "ring-2x2048-lowat1024-nodl", "pipe-1", "pipe-2", "pipe-2-nomsg", "pipe-3", "pipe-2-relay"} {
		cases = append(cases, tc{"tcp", name})
	}
	for _, name := range []string{"serve", "serve-shm", "ring-3x64", "ring-4x2048-heap", "ring-3x64-thp", "ring-4x2048-nodl-nomsg"} {
		cases = append(cases, tc{"unix", name})
	}
	for _, c := range cases {
		name := c.network + "/" + c.name
		v, err := parseVariant(c.name)
		if err != nil {
			t.Fatal(err)
		}
		recv, err := v.receiver()
		if err != nil {
			t.Fatal(err)
		}
		at := "127.0.0.1:0"
		if c.network == "unix" {
			at = t.TempDir() + "/s"
		}
		ln, err := net.Listen(c.network, at)
		if err != nil {
			t.Fatal(err)
		}
		a, err := net.Dial(c.network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		b, err := ln.Accept()
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		const size = 5<<20 + 123
		sent := make(chan error, 1)
		go func() {
			buf, ack := make([]byte, 100_000), make([]byte, 1)
			for range 2 {
				for rem := size; rem > 0; rem -= len(buf[:min(rem, len(buf))]) {
					if _, err := a.Write(buf[:min(rem, len(buf))]); err != nil {
						sent <- err
						return
					}
				}
				if _, err := a.Read(ack); err != nil {
					sent <- err
					return
				}
			}
			sent <- nil
		}()
		b.SetDeadline(time.Now().Add(20 * time.Second))
		for i := range 2 {
			if err := recv(b, size); err != nil {
				t.Fatalf("%s, transfer %d: %v", name, i, err)
			}
			if _, err := b.Write([]byte{1}); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-sent; err != nil {
			t.Fatalf("%s: sender: %v", name, err)
		}
		a.Close()
		b.Close()
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatal(m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatal(m)
	}
}

// childEnv makes the test binary run recv-bench's main, so that run's
// receiving children (os.Args[0] -serve ...) are recv-bench.
const childEnv = "RECV_BENCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRun: the whole tool over a Unix socket, children and all, with an
// asked-for send buffer: every variant's line has its throughput and both
// CPU figures.
func TestRun(t *testing.T) {
	t.Setenv(childEnv, "1")
	file := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(file, make([]byte, 8<<20+5), 0o600); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	err = run("", "unix", "", 2, 1<<20, "serve,ring-2x1024", []string{file})
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "its SO_SNDBUF asked for 1048576 bytes") {
		t.Fatalf("output:\n%s", out)
	}
	line := regexp.MustCompile(`^\S+ +median +[0-9.]+ GB/s  ratio to serve [0-9.]+  CPU-s/GB receiver [0-9.]+ sender [0-9.]+  all \[`)
	for _, l := range lines[1:] {
		if !line.MatchString(l) {
			t.Errorf("line %q", l)
		}
	}
}
