package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// fixture is a report with fixed numbers: the raw socket at 4 GB/s
// everywhere, shm at 3.8 GB/s (0.95 of raw) but only 3.0 at 256 KiB (0.75),
// gRPC at 0.5, and the 64 MiB rings over the RSS limit.
func fixture() *report { return fixtureOf(false) }

// fixtureOf is fixture, of a --targets-only run when targetsOnly.
func fixtureOf(targetsOnly bool) *report {
	r := &report{TargetsOnly: targetsOnly,
		Machine: machine{NProc: 2, CPU: "Test CPU", Memory: "24684084 kB", Kernel: "6.0", WmemDefault: "212992", WmemMax: "4194304", Go: "go1.26.0",
			Date: "2026-01-01 00:00 UTC", LoadStart: "0.1 0.2 0.3", LoadEnd: "0.4 0.5 0.6"},
		Command:    "bin/hydra-bench --bin bin --out docs/benchmarks",
		EngineArgs: []string{"--rpc", "tcp://127.0.0.1:41234", "--rpc", "unix:///tmp/x/engine.sock", "--http", "127.0.0.1:39999", "--backend", "/abs/bin/hydra-plugin-mock", "--slots", "2"},
		Payload:    1206000000, NPast: 9204, State: backendSpec{kvBytes: fullKVBytes}.describe(), Mock: true, SVGName: "state-transfer.svg", Reps: 3, PeakWindow: true,
		IdleHostMiB: 17, IdlePluginMiB: 14, Verified: 12, Duration: 3 * time.Minute,
	}
	cpu := cpuUse{Bench: 0.6, Host: 0.5, Plugin: 0.4, Wall: 0.9, Bytes: 3 * 1206000000, EngineSec: 0.9, BackendWait: 0.18}
	for _, tr := range transports {
		for _, op := range []string{opGet, opPut} {
			p := &panel{Transport: tr, Op: op, Raw: result{RawKind: rawInProc, GBps: []float64{3.9, 4.0, 4.1}, CPU: cpu}}
			for _, c := range plan(r.TargetsOnly) {
				v, rss := 3.8, 9.0
				switch {
				case c.Plane == "grpc":
					v = 0.5
				case c.Chunk == seedChunk:
					v = 3.0
				}
				if c.Chunk == 64<<20 {
					rss = 257
				}
				p.Rows = append(p.Rows, result{Config: c, GBps: []float64{v - 0.1, v, v + 0.2}, HostMiB: rss, PluginMiB: rss - 1, CPU: cpu, Alongside: []float64{4.2, 3.8, 4.1}})
			}
			r.Panels = append(r.Panels, p)
		}
	}
	return r
}

// markdownOf renders r and checks that it says each of wants.
func markdownOf(t *testing.T, r *report, wants ...string) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.markdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	return md
}

func TestMarkdown(t *testing.T) {
	md := markdownOf(t, fixture(),
		"| command | `bin/hydra-bench --bin bin --out docs/benchmarks` |",
		"| memory | 23.5 GiB |",
		"| net.core.wmem_default / wmem_max | 212992 / 4194304 (",
		"## TCP loopback — STATE_GET",
		"## Unix socket — STATE_PUT",
		"| config | data plane | chunk | GB/s median (best) | ratio to raw |",
		"| raw socket (3 transfers) | — | — | 4.00 (4.10) | 1.00 | — | — | — | 0.17 · — · — | 1.67 | — |",
		"| pipelined | shm | 2 MiB | 3.80 (4.00) | 0.95 | 9.0 | 8.0 | 4.10 | 0.17 · 0.14 · 0.11 | 1.67 | 20 % |",
		"| pipelined | shm | 256 KiB | 3.00 (3.20) | 0.75 |", "| pipelined | shm | 64 KiB | 3.80 (4.00) |",
		"`shm` is what `--data-plane auto` picks",
		"| gRPC stream | grpc | 64 KiB | 0.50 (0.70) | 0.12 |",
		"| 0.17 · 0.14 · 0.11 | 1.67 | — |\n", // gRPC: no clock
		// Targets, computed: 2 MiB passes, 256 KiB misses on GB/s.
		// CPU ceiling: 2 CPUs / (1.5 CPU s per 3.618 GB) / 4 GB/s = 1.21.
		"| shm | TCP loopback | STATE_GET | 2 MiB | 0.950 | ≥ 0.90 | 1.21 | 9.0 / 8.0 | ≤ 64 | yes |",
		"| shm | Unix socket | STATE_PUT | 256 KiB | 0.750 | ≥ 0.80 | 1.21 | 9.0 / 8.0 | ≤ 64 | no: GB/s |",
		"- **shm**: throughput target met in 4 of 8 cases, RSS target in 8 of 8.",
		"- **grpc**: throughput target met in 0 of 8 cases, RSS target in 8 of 8.",
		"shm, chunk 64 MiB STATE_GET (host 257.0, plugin 256.0 MiB)",
		"--rpc tcp://127.0.0.1:PORT --rpc unix:///TMP/engine.sock --http 127.0.0.1:PORT --backend BIN/hydra-plugin-mock",
		"they matched in 12 engine(s)",
	)
	if strings.Contains(md, "Quick run") {
		t.Error("a full run is marked quick")
	}
	for _, gone := range []string{"depth", "serial", "ring-depth", "splice-put"} {
		if strings.Contains(md, gone) {
			t.Errorf("the report mentions %q", gone)
		}
	}
	// One table per transport × direction, each with every configuration.
	if n := strings.Count(md, "| raw socket ("); n != 4 {
		t.Errorf("%d tables, want 4", n)
	}
	if n := strings.Count(md, "| pipelined | shm |"); n != 4*len(pipelinedChunks) {
		t.Errorf("%d pipelined shm rows, want %d", n, 4*len(pipelinedChunks))
	}
}

// TestMarkdownTargetsOnly: a --targets-only run says so, counts only what it
// measured, and still draws its chart.
func TestMarkdownTargetsOnly(t *testing.T) {
	r := fixtureOf(true)
	md := markdownOf(t, r,
		"**Targets only** (`--targets-only`)",
		"- **shm**: throughput target met in 4 of 8 cases, RSS target in 8 of 8.",
		"- **grpc**: not measured.",
		"| grpc | TCP loopback | STATE_GET | 2 MiB | — | ≥ 0.90 | — | — | ≤ 64 | not measured |",
		"| pipelined | shm | 2 MiB | 3.80 (4.00) | 0.95 |",
	)
	if strings.Contains(md, "gRPC stream") || strings.Contains(md, "| pipelined | shm | 64 KiB |") {
		t.Error("a targets-only report shows rows the targets do not name")
	}
	if err := r.svg(io.Discard); err != nil {
		t.Fatal(err)
	}
}

// TestParseTransferClock reads the engine's transfer clock for one
// direction out of a /metrics page, and fails on a page without it.
func TestParseTransferClock(t *testing.T) {
	page := `# HELP hydra_engine_state_transfer_backend_wait_seconds_total Time ...
# TYPE hydra_engine_state_transfer_backend_wait_seconds_total counter
hydra_engine_state_transfer_backend_wait_seconds_total{direction="get"} 0.25
hydra_engine_state_transfer_backend_wait_seconds_total{direction="put"} 1e-3
hydra_engine_state_transfer_seconds_bucket{direction="put",le="+Inf"} 4
hydra_engine_state_transfer_seconds_sum{direction="get"} 2.5
hydra_engine_state_transfer_seconds_count{direction="get"} 2
hydra_engine_state_transfer_seconds_sum{direction="put"} 3
hydra_engine_state_transfer_seconds_count{direction="put"} 4
`
	if c, err := parseTransferClock(page, opGet); err != nil || c != (transferClock{count: 2, total: 2.5, wait: 0.25}) {
		t.Errorf("get: %+v, %v", c, err)
	}
	if c, err := parseTransferClock(page, opPut); err != nil || c != (transferClock{count: 4, total: 3, wait: 0.001}) {
		t.Errorf("put: %+v, %v", c, err)
	}
	// No transfer yet: no histogram, the counter at 0.
	if c, err := parseTransferClock("hydra_engine_state_transfer_backend_wait_seconds_total{direction=\"put\"} 0\n", opPut); err != nil || c != (transferClock{}) {
		t.Errorf("before the first transfer: %+v, %v", c, err)
	}
	if _, err := parseTransferClock("go_goroutines 7\n", opGet); err == nil {
		t.Error("a page of an engine without the clock parsed")
	}
}

func TestSVG(t *testing.T) {
	var b bytes.Buffer
	if err := fixture().svg(&b); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with an <svg> root.
	d := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	svg := b.String()
	for _, want := range []string{"TCP loopback — STATE_GET", "Unix socket — STATE_PUT", "shm ring", "gRPC stream", "raw socket (4.00 GB/s)", "256 KiB", "64 MiB"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

const sampleStatus = `Name:	hydra-engine
Umask:	0022
State:	S (sleeping)
Pid:	4242
VmPeak:	 1262000 kB
VmSize:	 1261000 kB
VmHWM:	   21420 kB
VmRSS:	   19876 kB
RssAnon:	    9000 kB
Threads:	9
`

func TestStatusKB(t *testing.T) {
	for field, want := range map[string]int64{"VmHWM": 21420, "VmRSS": 19876, "VmPeak": 1262000} {
		got, err := statusKB(sampleStatus, field)
		if err != nil || got != want {
			t.Errorf("%s = %d, %v; want %d", field, got, err, want)
		}
	}
	if _, err := statusKB(sampleStatus, "VmSwap"); err == nil {
		t.Error("a missing field parsed")
	}
	if _, err := statusKB("VmHWM:\t12 pages\n", "VmHWM"); err == nil {
		t.Error("a value without kB parsed")
	}
}

func TestStats(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median of 3 = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 4 = %v", m)
	}
	if b := best([]float64{1, 5, 2}); b != 5 {
		t.Errorf("best = %v", b)
	}
	if g := gbps(2e9, time.Second); g != 2 {
		t.Errorf("gbps = %v", g)
	}
	for n, want := range map[int]string{64 << 10: "64 KiB", 2 << 20: "2 MiB", 64 << 20: "64 MiB", 1000: "1000 B"} {
		if got := chunkName(n); got != want {
			t.Errorf("chunkName(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPlan(t *testing.T) {
	if cs := plan(true); len(cs) != 2 || cs[0] != (engineConfig{Plane: "shm", Chunk: seedChunk}) ||
		cs[1] != (engineConfig{Plane: "shm", Chunk: 2 << 20}) {
		t.Errorf("targets only: %+v", cs)
	}
	cs := plan(false)
	if len(cs) != 2*len(pipelinedChunks) {
		t.Fatalf("%d configurations", len(cs))
	}
	for i, c := range cs {
		plane := "shm"
		if i >= len(pipelinedChunks) {
			plane = "grpc"
		}
		if c.Plane != plane || c.Chunk != pipelinedChunks[i%len(pipelinedChunks)] {
			t.Errorf("configuration %d is %+v", i, c)
		}
		if f := strings.Join(c.flags(), " "); f != "--data-plane "+plane {
			t.Errorf("%v: flags %q", c, f)
		}
	}
	if c := (engineConfig{Plane: "shm", Chunk: seedChunk}); c.label() != "pipelined" || c.String() != "shm, chunk 256 KiB" {
		t.Errorf("shm at 256 KiB: label %q, %q", c.label(), c)
	}
	if c := (engineConfig{Plane: "grpc", Chunk: 2 << 20}); c.label() != "gRPC stream" || c.String() != "grpc, chunk 2 MiB" {
		t.Errorf("grpc at 2 MiB: label %q, %q", c.label(), c)
	}
}

// TestEngineFlags: --engine-arg flags come first, so a configuration's own
// (--data-plane) win; the user's list is not changed.
func TestEngineFlags(t *testing.T) {
	user := []string{"--data-plane=grpc", "--socket-buffer=-1"}
	got := engineFlags(user, engineConfig{Plane: "shm"})
	want := []string{"--data-plane=grpc", "--socket-buffer=-1", "--data-plane", "shm"}
	if !slices.Equal(got, want) {
		t.Fatalf("%q, want %q", got, want)
	}
	if len(user) != 2 || user[1] != "--socket-buffer=-1" {
		t.Fatalf("the user's flags changed: %q", user)
	}
}
