package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Targets of issue 3, checked on the pipelined rows.
const (
	targetRatio2M   = 0.90 // of raw, at 2 MiB chunks
	targetRatio256K = 0.80 // of raw, at 256 KiB chunks
	targetExtraMiB  = 64.0 // extra peak RSS per process
)

type machine struct {
	NProc               int
	Affinity            string // --server-cpus: where the client and the receivers ran
	CPU, Memory, Kernel string
	WmemDefault         string // net.core.wmem_default: a Unix-socket client's send buffer unless it sets one
	WmemMax             string // net.core.wmem_max: the most SO_SNDBUF may ask for
	Go, EngineGo        string
	Date                string
	LoadStart, LoadEnd  string
}

// result is one table row: one configuration, transport and direction.
type result struct {
	Config             engineConfig // zero for the raw socket
	RawKind            string       // a raw row's server, rawInProc or rawOwnProc; "" for an engine row
	GBps               []float64    // one per transfer
	Alongside          []float64    // the raw transfers interleaved with these (engine rows)
	HostMiB, PluginMiB float64      // extra peak RSS over the idle engine; NaN: not measured
	CPU                cpuUse       // summed over the transfers
}

// cpuUse is the CPU time transfers took, per process, with their bytes and
// wall time.
type cpuUse struct {
	Bench, Host, Plugin float64 // CPU seconds: this process (client; raw server too), engine host, plugin
	Wall, Bytes         float64
	// The engine's own clock of its transfers (/metrics): seconds, and the
	// part the host waited on the plugin.
	EngineSec, BackendWait float64
}

func (c *cpuUse) add(o cpuUse) {
	c.Bench += o.Bench
	c.Host += o.Host
	c.Plugin += o.Plugin
	c.Wall += o.Wall
	c.Bytes += o.Bytes
	c.EngineSec += o.EngineSec
	c.BackendWait += o.BackendWait
}

// waitShare is the part of the engine's transfer time the host spent
// waiting on the plugin, NaN where the engine clocked none.
func (c cpuUse) waitShare() float64 {
	if c.EngineSec <= 0 {
		return math.NaN()
	}
	return c.BackendWait / c.EngineSec
}

// percentCell formats a share as a percentage, "—" on the gRPC plane (no
// clock there) or where there was none.
func percentCell(c engineConfig, share float64) string {
	if c.Plane == "grpc" || math.IsNaN(share) {
		return "—"
	}
	return fmt.Sprintf("%.0f %%", 100*share)
}

// perGB is CPU seconds x per GB moved.
func (c cpuUse) perGB(x float64) float64 {
	if c.Bytes == 0 {
		return math.NaN()
	}
	return x / (c.Bytes / 1e9)
}

// cores is the mean number of CPUs busy during the transfers.
func (c cpuUse) cores() float64 {
	if c.Wall == 0 {
		return math.NaN()
	}
	return (c.Bench + c.Host + c.Plugin) / c.Wall
}

// panel is one transport × direction: the raw baseline and every
// configuration.
type panel struct {
	Transport string   // "tcp" or "unix"
	Op        string   // opGet or opPut
	Raw       result   // the baseline of the ratios
	RawAlso   []result // other raw servers, shown beside it (--raw-server)
	Rows      []result
}

// ratio is a row's median over the raw median of its panel.
func (p *panel) ratio(r result) float64 { return ratioTo(r, p.Raw) }

// ratioTo is r's median over raw's.
func ratioTo(r, raw result) float64 {
	m := median(raw.GBps)
	if m == 0 {
		return math.NaN()
	}
	return median(r.GBps) / m
}

// multiRaw reports whether the tables have more than one raw server.
func (r *report) multiRaw() bool { return len(r.Panels) > 0 && len(r.Panels[0].RawAlso) > 0 }

// rawLabel names a raw row; the kind only where there are several.
func rawLabel(multi bool, kind string) string {
	switch {
	case !multi:
		return "raw socket"
	case kind == rawOwnProc:
		return "raw, server process"
	}
	return "raw, in-process server"
}

// rawMethod says where the baseline's server runs.
func (r *report) rawMethod() string {
	if len(r.Panels) > 0 && r.Panels[0].Raw.RawKind == rawOwnProc {
		return "a server in a process of its own (hydra-bench started again), as the engine is a process apart from its client,"
	}
	return "an in-process server"
}

// rawAlsoMethod describes the other raw server, if any (there are two
// kinds, so at most one other).
func (r *report) rawAlsoMethod() string {
	if !r.multiRaw() {
		return ""
	}
	where := " inside the benchmark process (goroutines of the client's process, sharing its scheduler and cores)"
	if r.Panels[0].RawAlso[0].RawKind == rawOwnProc {
		where = " in a process of its own"
	}
	return " Beside the baseline, the same server" + where + " ran in the same rotation; its row's ratio is to the baseline, and the Targets table gives the engine's ratio to it too. " +
		"A server process's CPU time (from `/proc/PID/stat`, 10 ms ticks) is in the host column of its rows."
}

// cpuCeiling is the ratio to raw that row would reach if its three
// processes kept all n CPUs busy at the CPU cost per byte they showed: an
// upper bound set by the machine, not by waiting.
func (p *panel) cpuCeiling(r result, n int) float64 {
	u := r.CPU
	perGB := u.perGB(u.Bench + u.Host + u.Plugin)
	raw := median(p.Raw.GBps)
	if perGB == 0 || math.IsNaN(perGB) || raw == 0 {
		return math.NaN()
	}
	return float64(n) / perGB / raw
}

// find returns the row of plane at chunk.
func (p *panel) find(plane string, chunk int) (result, bool) {
	for _, r := range p.Rows {
		if r.Config.Plane == plane && r.Config.Chunk == chunk {
			return r, true
		}
	}
	return result{}, false
}

type report struct {
	Machine       machine
	Command       string
	EngineArgs    []string // the setup engine's flags, for the method note
	Payload       uint64   // bytes per transfer
	NPast         int64
	State         string // what was moved
	SVGName       string // the chart's file name, beside the report
	Mock          bool
	Reps          int
	Quick         bool
	TargetsOnly   bool       // only the configurations the targets name ran
	Client        clientOpts // --client-sends, --client-sockbuf
	ClientSndBuf  int        // the SO_SNDBUF getsockopt gave for --client-sockbuf
	PeakWindow    bool       // peak RSS was reset after the prefill and between directions
	IdleHostMiB   float64
	IdlePluginMiB float64
	Verified      int // engines whose slot 1 decoded like slot 0
	Panels        []*panel
	Duration      time.Duration
}

// sendsNote says how the client writes to a Unix socket (--client-sends,
// --client-sockbuf).
func (r *report) sendsNote() string {
	s := ", parking on Go's poller when the socket is full"
	if r.Client.blocking {
		s = ", in blocking write(2)s as a C# or Python client sends (`--client-sends blocking`), to the raw servers and the engine alike"
	}
	if r.Client.sockbuf > 0 {
		s += fmt.Sprintf("; its Unix sockets ask for %d-byte SO_SNDBUF/SO_RCVBUF (`--client-sockbuf`; getsockopt gives %d), where a client that sets none has the kernel's default", r.Client.sockbuf, r.ClientSndBuf)
	}
	return s
}

func transportName(tr string) string {
	if tr == "unix" {
		return "Unix socket"
	}
	return "TCP loopback"
}

func chunkName(n int) string {
	switch {
	case n == 0:
		return "—"
	case n%mib == 0:
		return fmt.Sprintf("%d MiB", n/mib)
	case n%1024 == 0:
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

func mibCell(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

func rateCell(xs []float64) string {
	return fmt.Sprintf("%.2f (%.2f)", median(xs), best(xs))
}

// check is one computed target.
type check struct {
	Panel      *panel
	Row        result // the row checked (throughput checks)
	Plane      string
	Chunk      int
	What       string // "throughput" or "rss"
	Got, Limit float64
	Got2       float64 // plugin RSS for "rss"
	Ceiling    float64 // "throughput": the ratio with every CPU busy at the measured CPU cost per byte
	Met        bool
	Missing    bool
}

// checks evaluates the targets on every panel and plane.
func (r *report) checks() []check {
	var cs []check
	for _, plane := range []string{"shm", "grpc"} {
		for _, p := range r.Panels {
			for _, t := range []struct {
				chunk int
				ratio float64
			}{{2 << 20, targetRatio2M}, {seedChunk, targetRatio256K}} {
				row, ok := p.find(plane, t.chunk)
				c := check{Panel: p, Plane: plane, Chunk: t.chunk, What: "throughput", Limit: t.ratio, Missing: !ok}
				if ok {
					c.Row = row
					c.Got = p.ratio(row)
					c.Met = c.Got >= t.ratio
					c.Ceiling = p.cpuCeiling(row, r.Machine.NProc)
				}
				cs = append(cs, c)
				m := check{Panel: p, Plane: plane, Chunk: t.chunk, What: "rss", Limit: targetExtraMiB, Missing: !ok}
				if ok {
					m.Got, m.Got2 = row.HostMiB, row.PluginMiB
					m.Met = m.Got <= targetExtraMiB && m.Got2 <= targetExtraMiB
				}
				cs = append(cs, m)
			}
		}
	}
	return cs
}

// markdown writes state-transfer.md.
func (r *report) markdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }

	p("# State transfer benchmark\n\n")
	p("Written by `bench/cmd/hydra-bench` (`make bench`); do not edit by hand, re-run it.\n\n")
	if r.Quick {
		p("> **Quick run** (`--quick`): a smaller state and %d rep(s), a smoke test only. These numbers are not the benchmark.\n\n", r.Reps)
	}
	if r.TargetsOnly {
		p("> **Targets only** (`--targets-only`): the pipelined shm configurations the targets name, %d transfers each; the others were not run.\n\n", r.Reps)
	}
	m := r.Machine
	engineGo := ""
	if m.EngineGo != "" && m.EngineGo != m.Go {
		engineGo = fmt.Sprintf(" (engine built with %s)", m.EngineGo)
	}
	p("| | |\n|---|---|\n")
	p("| command | `%s` |\n", r.Command)
	p("| date | %s |\n", m.Date)
	p("| CPUs (`nproc`) | %d |\n", m.NProc)
	if m.Affinity != "" {
		p("| CPU affinity (`--server-cpus`) | %s |\n", m.Affinity)
	}
	p("| CPU | %s |\n", orUnknown(m.CPU))
	p("| memory | %s |\n", orUnknown(memName(m.Memory)))
	p("| kernel | %s |\n", orUnknown(m.Kernel))
	p("| net.core.wmem_default / wmem_max | %s / %s (the first is the client's send buffer on a Unix socket unless `--client-sockbuf` sets one) |\n", orUnknown(m.WmemDefault), orUnknown(m.WmemMax))
	p("| Go | %s%s |\n", m.Go, engineGo)
	p("| load average at start → end | %s → %s |\n", m.LoadStart, m.LoadEnd)
	p("| bytes per transfer | %d (%.3f GB): v2 blob of %s, n_past %d |\n",
		r.Payload, float64(r.Payload)/1e9, r.State, r.NPast)
	p("| transfers per measurement | %d |\n", r.Reps)
	p("| run time | %s |\n\n", r.Duration.Round(time.Second))

	p("## Method\n\n")
	plugin := "the mock plugin"
	if !r.Mock {
		plugin = "the backend plugin"
	}
	p("- Every engine configuration runs in a fresh `hydra-engine` process with %s as a separate process: "+
		"`hydra-engine %s` plus `--data-plane shm` or `--data-plane grpc`, every other setting at the engine's default. "+
		"`state_chunk_size` is set with CONFIGURE; the STATE_PUT runs come first, then slot 0 is prefilled for the STATE_GET runs.\n", plugin, strings.Join(redactAddrs(r.EngineArgs), " "))
	p("- STATE_GET reads slot 0; the client reads the reply body into one reused 1 MiB buffer. "+
		"STATE_PUT restores slot 1 from a file holding slot 0's blob, sent with `transport.Client.Do` and the `*os.File` as payload "+
		"(the kernel's sendfile on TCP; on a Unix socket Go copies through the client's 1 MiB buffer%s). %s\n", r.sendsNote(), verifyNote(r.Mock))
	p("- **raw socket**: %s on the same kind of socket, speaking just enough framing for the same client code: "+
		"it writes the same byte count from one reused 4 MiB buffer (GET) or reads and discards it (PUT). "+
		"Its accepted connections get the engine's default socket buffers (4 MiB SO_SNDBUF/SO_RCVBUF on a Unix socket, autotuning on TCP), so both sides of a ratio use the same socket settings. "+
		"Raw and engine transfers alternate (their order rotates every rep), so load from elsewhere on the machine hits both; "+
		"the raw row pools every raw transfer of its table.%s\n", r.rawMethod(), r.rawAlsoMethod())
	p("- GB/s = bytes / seconds / 1e9, from the request to the last reply byte (GET) or to the reply (PUT, sent after the restore). " +
		"Cells are median (best) of the reps. ratio = engine median / raw median of the same table (all its raw transfers); " +
		"raw alongside = median of the raw transfers interleaved with that row's, which shows when the socket itself was slower or faster during that row.\n")
	if r.PeakWindow {
		p("- Extra RSS = VmHWM of the host (`hydra-engine`) and of the plugin process over the direction's transfers "+
			"(peak reset with `/proc/PID/clear_refs` before the STATE_PUT runs and again after the prefill that precedes the STATE_GET runs), minus the same process's VmHWM when idle right after start, or its RSS when the window opened where that is lower, "+
			"as for a plugin whose model load peaked above its resident size "+
			"(median idle: host %.1f MiB, plugin %.1f MiB). Both transports share one engine per configuration, so a direction's RSS is the same in both tables. "+
			"What the STATE_PUT runs and the prefill left resident (the host's pooled shm ring, Go heap not yet returned) stays in the STATE_GET figure.\n",
			r.IdleHostMiB, r.IdlePluginMiB)
	} else {
		p("- Extra RSS = VmHWM of the host and of the plugin process over the engine's whole life (the peak could not be reset here, " +
			"so for STATE_GET it includes the STATE_PUT runs and the prefill before it) minus the same process's VmHWM when idle right after start.\n")
	}
	p("- CPU s/GB: CPU time (user + system, from getrusage for this process and `/proc/PID/stat` for the engine's two) per GB moved; "+
		"\"client\" is the benchmark process, which on a raw row is the raw server as well unless that runs in a process of its own. cores busy = all that CPU time / wall time: "+
		"with %d CPUs, a figure near %d means the transfer was waiting for CPU, not for the socket.\n", r.Machine.NProc, r.Machine.NProc)
	p("- host waits on plugin: the part of the engine's own time for the row's transfers (its /metrics, " +
		"`hydra_engine_state_transfer_backend_wait_seconds_total` over `hydra_engine_state_transfer_seconds_sum`) the host spent waiting on the plugin: " +
		"for a filled buffer on STATE_GET, for a free one or room in the pipe on STATE_PUT. Near 100 %%, the plugin set the pace; near 0, the host's socket side or the client did. " +
		"A piped STATE_PUT's host wakes as soon as a page of the pipe is free, so there a slow plugin shows as less wait than it costs. The gRPC plane records none.\n")
	p("- Both planes pipeline: the shm ring holds several chunks in flight, and gRPC's stream flow control lets the plugin produce ahead of the host. " +
		"A gRPC STATE_PUT streams the state to the plugin in 1 MiB messages whatever `state_chunk_size` is.\n")
	p("- After its transfers each engine decodes 16 greedy tokens from slot 0 and from the restored slot 1; they matched in %d engine(s).\n\n", r.Verified)
	p("![GB/s per configuration](%s)\n\n", r.SVGName)

	for _, pn := range r.Panels {
		p("## %s — %s\n\n", transportName(pn.Transport), pn.Op)
		p("| config | data plane | chunk | GB/s median (best) | ratio to raw | host extra RSS MiB | plugin extra RSS MiB | raw alongside GB/s | CPU s/GB client · host · plugin | cores busy | host waits on plugin |\n")
		p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, raw := range append([]result{pn.Raw}, pn.RawAlso...) {
			server := "—" // an in-process server's CPU is the client's
			if raw.RawKind == rawOwnProc {
				server = num2(raw.CPU.perGB(raw.CPU.Host))
			}
			p("| %s (%d transfers) | — | — | %s | %.2f | — | — | — | %s · %s · — | %s | — |\n",
				rawLabel(r.multiRaw(), raw.RawKind), len(raw.GBps), rateCell(raw.GBps), pn.ratio(raw), num2(raw.CPU.perGB(raw.CPU.Bench)), server, num2(raw.CPU.cores()))
		}
		for _, row := range pn.Rows {
			u := row.CPU
			p("| %s | %s | %s | %s | %.2f | %s | %s | %s | %s · %s · %s | %s | %s |\n", row.Config.label(), row.Config.Plane, chunkName(row.Config.Chunk),
				rateCell(row.GBps), pn.ratio(row), mibCell(row.HostMiB), mibCell(row.PluginMiB), alongside(row.Alongside),
				num2(u.perGB(u.Bench)), num2(u.perGB(u.Host)), num2(u.perGB(u.Plugin)), num2(u.cores()), percentCell(row.Config, u.waitShare()))
		}
		p("\n")
	}

	r.targets(p)
	return bw.Flush()
}

// targets writes the Targets section, computed from the tables.
func (r *report) targets(p func(string, ...any)) {
	cs := r.checks()
	p("## Targets\n\n")
	p("Issue 3: pipelined STATE_GET and STATE_PUT ≥ %.2f of the raw socket on the same transport at 2 MiB chunks, ≥ %.2f at 256 KiB; "+
		"extra RSS ≤ %.0f MiB per process. `shm` is what `--data-plane auto` picks for a plugin on the same host; `grpc` is the portable fallback, shown for comparison.\n\n",
		targetRatio2M, targetRatio256K, targetExtraMiB)
	for _, plane := range []string{"shm", "grpc"} {
		var n, rate, rss int
		for i := 0; i+1 < len(cs); i += 2 {
			if t, m := cs[i], cs[i+1]; t.Plane == plane && !t.Missing {
				n++
				rate += b2i(t.Met)
				rss += b2i(m.Met)
			}
		}
		if n == 0 {
			p("- **%s**: not measured.\n", plane)
			continue
		}
		p("- **%s**: throughput target met in %d of %d cases, RSS target in %d of %d.\n", plane, rate, n, rss, n)
	}
	p("\nCPU ceiling: the ratio the row would reach if client, host and plugin kept all %d CPUs busy at the CPU time per byte they used "+
		"(%d ÷ CPU s/GB ÷ raw median). Below the target, no overlap of the stages can meet it on this machine at these per-byte costs.\n", r.Machine.NProc, r.Machine.NProc)
	var alsoHead, alsoRule, alsoNone string
	if r.multiRaw() {
		for _, raw := range r.Panels[0].RawAlso {
			alsoHead += " ratio to " + rawLabel(true, raw.RawKind) + " |"
			alsoRule += "---:|"
			alsoNone += " — |"
		}
		p("\nThe verdicts are against the first raw server (%s); the ratios to the other are beside them, for comparison.\n", rawLabel(true, r.Panels[0].Raw.RawKind))
	}
	p("\n| data plane | transport | direction | chunk | ratio to raw | target | CPU ceiling | host / plugin extra RSS MiB | target | met |%s\n", alsoHead)
	p("|---|---|---|---:|---:|---:|---:|---:|---:|---|%s\n", alsoRule)
	for i := 0; i+1 < len(cs); i += 2 {
		t, m := cs[i], cs[i+1]
		if t.Missing {
			p("| %s | %s | %s | %s | — | ≥ %.2f | — | — | ≤ %.0f | not measured |%s\n",
				t.Plane, transportName(t.Panel.Transport), t.Panel.Op, chunkName(t.Chunk), t.Limit, m.Limit, alsoNone)
			continue
		}
		// Three decimals: a ratio that rounds to the target can still miss it.
		also := ""
		for _, raw := range t.Panel.RawAlso {
			also += fmt.Sprintf(" %.3f |", ratioTo(t.Row, raw))
		}
		p("| %s | %s | %s | %s | %.3f | ≥ %.2f | %s | %s / %s | ≤ %.0f | %s |%s\n",
			t.Plane, transportName(t.Panel.Transport), t.Panel.Op, chunkName(t.Chunk), t.Got, t.Limit, num2(t.Ceiling),
			mibCell(m.Got), mibCell(m.Got2), m.Limit, verdict(t.Met, m.Met), also)
	}
	// The targets name two chunk sizes; say where else memory goes past the
	// limit, since extra memory is meant to be O(chunk × buffers in flight).
	var over []string
	for _, pn := range r.Panels {
		for _, row := range pn.Rows {
			target := row.Config.Chunk == 2<<20 || row.Config.Chunk == seedChunk
			if target || pn.Transport != transports[0] { // RSS is per engine, the same on both transports
				continue
			}
			if row.HostMiB > targetExtraMiB || row.PluginMiB > targetExtraMiB {
				over = append(over, fmt.Sprintf("%s %s (host %s, plugin %s MiB)", row.Config, pn.Op, mibCell(row.HostMiB), mibCell(row.PluginMiB)))
			}
		}
	}
	if len(over) > 0 {
		p("\nOver %.0f MiB extra RSS outside the target rows: %s.\n", targetExtraMiB, strings.Join(over, "; "))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func verdict(ratioMet, rssMet bool) string {
	switch {
	case ratioMet && rssMet:
		return "yes"
	case ratioMet:
		return "no: RSS"
	case rssMet:
		return "no: GB/s"
	}
	return "no: GB/s, RSS"
}

// alongside is the median of the raw transfers run between a row's own.
func alongside(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", median(xs))
}

func num2(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.2f", v)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// memName turns meminfo's "N kB" into GiB.
func memName(s string) string {
	f := strings.Fields(s)
	if len(f) == 2 && f[1] == "kB" {
		if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
			return fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return s
}

// redactAddrs replaces the run's listener URLs, which change every run.
func redactAddrs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "tcp://"):
			a = "tcp://127.0.0.1:PORT"
		case strings.HasPrefix(a, "unix://"):
			a = "unix:///TMP/engine.sock"
		case i > 0 && args[i-1] == "--http":
			a = "127.0.0.1:PORT"
		case i > 0 && (args[i-1] == "--backend" || args[i-1] == "--model"):
			a = "BIN/" + filepath.Base(a)
		}
		out[i] = a
	}
	return out
}

// verifyNote says how the restores were checked.
func verifyNote(mock bool) string {
	if mock {
		return "The mock plugin regenerates every state byte on GET and checks every byte on PUT; a failed restore fails the benchmark."
	}
	return "After each configuration the restored slot is saved again and compared byte for byte with the blob it came from, " +
		"and its greedy decode is compared with the source slot's; a mismatch fails the benchmark."
}
