// Command hydra-bench measures STATE_GET and STATE_PUT of a ~1.2 GB mock
// state through real hydra-engine processes, next to a raw Go socket carrying
// the same bytes in the same run, and writes docs/benchmarks/state-transfer.md
// and state-transfer.svg (`make bench` at the repository's root).
//
//	cd bench && go build -o ../bin/ ./cmd/hydra-bench
//	bin/hydra-bench --bin bin --out docs/benchmarks [--reps 3] [--quick] [--targets-only]
//
// --bin holds the built hydra-engine and hydra-plugin-mock; engines are
// started with internal/enginetest, as the end-to-end tests start theirs. Every engine
// configuration gets a fresh engine process, so each one's peak RSS is its
// own. Linux only: peak RSS comes from /proc.
package main

import (
	"context"
	"debug/buildinfo"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/bench/internal/proccpu"
	"github.com/hydra-engine/hydra-engine/transport"
)

const (
	seedChunk = 256 << 10 // the seed engine's chunk size
	mib       = 1 << 20

	fullKVBytes  = 131072 // ~1.2 GB at ~9.2 K tokens
	quickKVBytes = 16384  // ~150 MB
	promptBytes  = 9180   // one token per byte, plus the mock's chat template
)

// pipelinedChunks are the chunk sizes of the pipelined runs, on both planes.
var pipelinedChunks = []int{64 << 10, 256 << 10, 2 << 20, 8 << 20, 64 << 20}

// transports are the client sockets, in table order.
var transports = []string{"tcp", "unix"}

// plan lists the engine configurations in the order they run: both data
// planes at every chunk size. targetsOnly keeps the rows issue 3's targets
// name: shm at 256 KiB and 2 MiB.
func plan(targetsOnly bool) []engineConfig {
	if targetsOnly {
		return []engineConfig{{Plane: "shm", Chunk: seedChunk}, {Plane: "shm", Chunk: 2 << 20}}
	}
	var cs []engineConfig
	for _, c := range pipelinedChunks {
		cs = append(cs, engineConfig{Plane: "shm", Chunk: c})
	}
	for _, c := range pipelinedChunks {
		cs = append(cs, engineConfig{Plane: "grpc", Chunk: c})
	}
	return cs
}

type options struct {
	bin, out string
	reps     int
	quick    bool
	targets  bool   // --targets-only
	name     string // output files' base name
	backend  backendSpec
	raws     []string   // --raw-server: raw server kinds, the first the ratios' baseline
	client   clientOpts // --client-sends, --client-sockbuf
	cpus     string     // --server-cpus: taskset CPU list of the engines and the raw server process
	engine   []string   // --engine-arg: more flags for every engine, before each configuration's own
}

func main() {
	if spec := os.Getenv(rawProcEnv); spec != "" {
		os.Exit(serveRawProcess(spec, os.Stdin, os.Stdout))
	}
	var o options
	fs := flag.NewFlagSet("hydra-bench", flag.ExitOnError)
	fs.StringVar(&o.bin, "bin", "bin", "directory holding the built hydra-engine and hydra-plugin-mock")
	fs.StringVar(&o.out, "out", "docs/benchmarks", "directory for state-transfer.md and state-transfer.svg")
	fs.IntVar(&o.reps, "reps", 3, "transfers per measurement")
	fs.BoolVar(&o.quick, "quick", false, "smoke test: a ~150 MB state (kv_bytes_per_token=16384) and 1 rep unless --reps is given")
	fs.StringVar(&o.name, "name", "state-transfer", "base name of the .md and .svg written to --out")
	fs.BoolVar(&o.targets, "targets-only", false, "run only the configurations the targets name (pipelined shm at 256 KiB and 2 MiB): with a high --reps, a sharper verdict in the time of a full table")
	fs.StringVar(&o.backend.plugin, "backend", "", "plugin executable instead of BIN/hydra-plugin-mock (e.g. hydra-plugin-cuda-llama)")
	fs.StringVar(&o.backend.model, "model", "", "model file for --backend")
	fs.Var((*listFlag)(&o.backend.opts), "backend-opt", "backend option key=value for --backend (repeatable)")
	fs.IntVar(&o.backend.tokens, "prefill-tokens", 9200, "with --backend: raw token ids to prefill (sets the state size)")
	sends := fs.String("client-sends", "poller", "how the client writes to a Unix socket, to the raw servers and the engine alike: poller (Go's, parking on the runtime's poller when the socket is full) or blocking (blocking write(2)s, as a C# or Python client sends)")
	fs.IntVar(&o.client.sockbuf, "client-sockbuf", 0, "SO_SNDBUF/SO_RCVBUF in bytes the client asks for on its Unix sockets, to the raw servers and the engine alike (0: the kernel's default, net.core.wmem_default, as a C# or Python client that sets none; the kernel caps it at net.core.wmem_max)")
	fs.Var((*listFlag)(&o.engine), "engine-arg", "one more flag for every hydra-engine, e.g. --engine-arg=--socket-buffer=-1 (repeatable; a configuration's own --data-plane comes after and wins)")
	fs.StringVar(&o.cpus, "server-cpus", "", "run the engines (and their plugins) and the raw server process on these CPUs, a taskset list (e.g. 2-15); run hydra-bench itself under taskset to place the client")
	rawServers := fs.String("raw-server", rawInProc, "raw socket servers, comma-separated, the first the ratios' baseline: "+rawInProc+" (in this process) or "+rawOwnProc+" (a process of its own)")
	fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hydra-bench: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	repsSet := false
	fs.Visit(func(f *flag.Flag) { repsSet = repsSet || f.Name == "reps" })
	if o.quick && !repsSet {
		o.reps = 1
	}
	switch *sends {
	case "poller":
	case "blocking":
		o.client.blocking = true
	default:
		fmt.Fprintf(os.Stderr, "hydra-bench: --client-sends %q: want poller or blocking\n", *sends)
		os.Exit(2)
	}
	if o.client.sockbuf < 0 {
		fmt.Fprintln(os.Stderr, "hydra-bench: --client-sockbuf must be 0 (the kernel's default) or a byte count")
		os.Exit(2)
	}
	if err := checkCPUList(o.cpus); err != nil {
		fmt.Fprintln(os.Stderr, "hydra-bench: --server-cpus:", err)
		os.Exit(2)
	}
	var err error
	if o.raws, err = parseRawKinds(*rawServers); err != nil {
		fmt.Fprintln(os.Stderr, "hydra-bench: --raw-server:", err)
		os.Exit(2)
	}
	if o.reps < 1 {
		fmt.Fprintln(os.Stderr, "hydra-bench: --reps must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, strings.Join(quoteArgs(os.Args), " "), os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "hydra-bench:", err)
		os.Exit(1)
	}
}

// bench is one run's state.
type bench struct {
	o      options
	log    io.Writer
	tmp    string
	prompt []byte

	blob  *os.File // slot 0's STATE_GET payload, the STATE_PUT payload
	size  uint64   // its length: the bytes of every transfer
	nPast int64
	buf   []byte // the GET client's reused read buffer

	raws   []rawSide         // by kind, the baseline first
	panels map[string]*panel // by transport + op
	rep    *report
	idleH  []float64 // idle VmHWM of each engine, MiB
	idleP  []float64
}

func run(ctx context.Context, o options, command string, log io.Writer) error {
	for _, p := range []string{filepath.Join(o.bin, "hydra-engine"), o.backend.path(o.bin)} {
		if err := mustExecutable(p); err != nil {
			return fmt.Errorf("%w (run make build)", err)
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "hydra-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // the blob and the sockets

	b := &bench{
		o: o, log: log, tmp: tmp,
		buf:    make([]byte, clientReadBuf),
		panels: map[string]*panel{},
	}
	if b.o.backend.mock() {
		b.o.backend.kvBytes = fullKVBytes
		if o.quick {
			b.o.backend.kvBytes = quickKVBytes
		}
		b.prompt, _ = json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("x", promptBytes)}}})
	} else {
		b.prompt = tokenPrompt(o.backend.tokens)
	}
	b.rep = &report{Machine: machineInfo(o.bin), Command: command, State: b.o.backend.describe(), Mock: b.o.backend.mock(), SVGName: o.name + ".svg", Reps: o.reps, Quick: o.quick, TargetsOnly: o.targets, Client: o.client}
	if o.client.sockbuf > 0 {
		if b.rep.ClientSndBuf, err = sendBuffer(o.client.sockbuf); err != nil {
			return fmt.Errorf("--client-sockbuf: %w", err)
		}
	}
	if o.cpus != "" {
		b.rep.Machine.Affinity = fmt.Sprintf("client (this process%s): %s; engines, their plugins and the raw server process: %s", rawInProcNote(o.raws), ownCPUs(), o.cpus)
	}
	for _, tr := range transports {
		for _, op := range []string{opGet, opPut} {
			p := &panel{Transport: tr, Op: op, Raw: result{RawKind: o.raws[0], HostMiB: math.NaN(), PluginMiB: math.NaN()}}
			for _, k := range o.raws[1:] {
				p.RawAlso = append(p.RawAlso, result{RawKind: k, HostMiB: math.NaN(), PluginMiB: math.NaN()})
			}
			b.panels[tr+op] = p
			b.rep.Panels = append(b.rep.Panels, p)
		}
	}
	start := time.Now()

	if err := b.setup(ctx); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	defer b.blob.Close()
	err = b.startRaw(ctx)
	defer b.closeRaw()
	if err != nil {
		return fmt.Errorf("raw socket servers: %w", err)
	}

	cfgs := plan(o.targets)
	for i, cfg := range cfgs {
		if err := b.runConfig(ctx, cfg, fmt.Sprintf("[%d/%d]", i+1, len(cfgs))); err != nil {
			return fmt.Errorf("%s: %w", cfg, err)
		}
	}

	b.rep.Duration = time.Since(start)
	b.rep.Machine.LoadEnd = loadAvg()
	b.rep.IdleHostMiB, b.rep.IdlePluginMiB = median(b.idleH), median(b.idleP)
	md := filepath.Join(o.out, o.name+".md")
	if err := writeFile(md, b.rep.markdown); err != nil {
		return err
	}
	svg := filepath.Join(o.out, o.name+".svg")
	if err := writeFile(svg, b.rep.svg); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s and %s in %s\n", md, svg, b.rep.Duration.Round(time.Second))
	return nil
}

// setup gets the blob every STATE_PUT sends: slot 0 of a default engine,
// prefilled, read once with STATE_GET into a file. It also learns whether
// peak RSS can be reset (clear_refs), which decides what the RSS columns
// cover.
func (b *bench) setup(ctx context.Context) error {
	fmt.Fprintf(b.log, "setup: prefill %s, STATE_GET into a file\n", b.o.backend.describe())
	dir, err := os.MkdirTemp(b.tmp, "e")
	if err != nil {
		return err
	}
	e, err := startEngine(ctx, b.o.bin, dir, b.o.backend, b.o.engine, b.o.cpus)
	if err != nil {
		return err
	}
	defer b.stopEngine(e)
	b.rep.EngineArgs = e.Args
	if err := e.resetPeaks(); err != nil {
		fmt.Fprintf(b.log, "warning: cannot reset peak RSS (%v): RSS columns cover each engine's whole life\n", err)
	} else {
		b.rep.PeakWindow = true
	}
	c, err := transport.DialClient(ctx, e.TCP)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := call(ctx, c, transport.OpPrefill, "0", b.prompt)
	if err != nil {
		return fmt.Errorf("PREFILL: %w", err)
	}
	if b.nPast, err = metaInt(m, "n_past"); err != nil {
		return err
	}
	b.rep.NPast = b.nPast

	if b.blob, err = os.CreateTemp(b.tmp, "slot0-*.blob"); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	resp, err := c.Do(cctx, transport.Request{Op: transport.OpStateGet, Key: "0"})
	if err != nil {
		return err
	}
	if err := resp.Err(); err != nil {
		return err
	}
	n, err := io.Copy(b.blob, resp.Body) // spliced socket → file by the kernel
	if err != nil {
		return fmt.Errorf("STATE_GET into %s: %w", b.blob.Name(), err)
	}
	b.size = uint64(n)
	b.rep.Payload = b.size
	fmt.Fprintf(b.log, "setup: n_past %d, %d-byte blob in %s\n", b.nPast, b.size, b.blob.Name())
	return nil
}

// rawSide is one kind of raw server, on each transport, with a client each.
type rawSide struct {
	kind    string
	servers map[string]rawBaseline
	clients map[string]*transport.Client
}

// startRaw starts the baseline servers and dials a client to each.
func (b *bench) startRaw(ctx context.Context) error {
	for _, kind := range b.o.raws {
		side := rawSide{kind: kind, servers: map[string]rawBaseline{}, clients: map[string]*transport.Client{}}
		b.raws = append(b.raws, side)
		for _, tr := range transports {
			url := "tcp://127.0.0.1:0"
			if tr == "unix" {
				url = "unix://" + filepath.Join(b.tmp, "raw-"+kind+".sock")
			}
			s, err := startRaw(kind, url, b.size, b.o.cpus)
			if err != nil {
				return err
			}
			side.servers[tr] = s
			if side.clients[tr], err = dialClient(ctx, s.addr(), b.o.client); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) closeRaw() {
	for _, side := range b.raws {
		for _, c := range side.clients {
			c.Close()
		}
		for _, s := range side.servers {
			s.close()
		}
	}
}

// runConfig measures one configuration in a fresh engine: CONFIGURE the
// chunk size, then per direction reps rounds of raw and engine transfers on
// both transports, interleaved (and their order alternated) so that noise
// from the shared machine hits both alike. STATE_PUT goes first, while the
// engine has done nothing else, so its peak RSS is its own (a PUT needs no
// prefilled slot); the PREFILL of slot 0 for the GETs streams the state at
// the configured chunk size too, so the GET window opens after it.
func (b *bench) runConfig(ctx context.Context, cfg engineConfig, tag string) error {
	dir, err := os.MkdirTemp(b.tmp, "e")
	if err != nil {
		return err
	}
	e, err := startEngine(ctx, b.o.bin, dir, b.o.backend, engineFlags(b.o.engine, cfg), b.o.cpus)
	if err != nil {
		return err
	}
	defer b.stopEngine(e)
	idleH, idleP, err := e.peaks()
	if err != nil {
		return err
	}
	b.idleH, b.idleP = append(b.idleH, float64(idleH)/mib), append(b.idleP, float64(idleP)/mib)

	clients := map[string]*transport.Client{}
	for _, tr := range transports {
		url := e.TCP
		if tr == "unix" {
			url = e.Unix
		}
		c, err := dialClient(ctx, url, b.o.client)
		if err != nil {
			return err
		}
		defer c.Close()
		clients[tr] = c
	}
	ctl := clients["tcp"]
	m, err := call(ctx, ctl, transport.OpConfigure, "0", fmt.Appendf(nil, `{"state_chunk_size":%d}`, cfg.Chunk))
	if err != nil {
		return fmt.Errorf("CONFIGURE: %w", err)
	}
	if got, err := metaInt(m, "state_chunk_size_applied"); err != nil || got != int64(cfg.Chunk) {
		return fmt.Errorf("CONFIGURE applied %v, want %d", m["state_chunk_size_applied"], cfg.Chunk)
	}

	for _, op := range []string{opPut, opGet} {
		if op == opGet {
			if m, err = call(ctx, ctl, transport.OpPrefill, "0", b.prompt); err != nil {
				return fmt.Errorf("PREFILL: %w", err)
			}
			if got, err := metaInt(m, "n_past"); err != nil || got != b.nPast {
				return fmt.Errorf("PREFILL n_past %v, want %d", m["n_past"], b.nPast)
			}
		}
		// The baseline is the idle peak, or the RSS when the window opens if
		// that is lower: a plugin whose model load peaked above its resident
		// size (cuda-llama) would otherwise show a negative extra.
		baseH, baseP := idleH, idleP
		if b.rep.PeakWindow {
			if err := e.resetPeaks(); err != nil {
				return err
			}
			startH, startP, err := e.peaks()
			if err != nil {
				return err
			}
			baseH, baseP = min(baseH, startH), min(baseP, startP)
		}
		rows := map[string]*result{}
		raws := map[string][]*result{} // by transport, in b.raws' order
		for _, tr := range transports {
			rows[tr] = &result{Config: cfg}
			for _, side := range b.raws {
				raws[tr] = append(raws[tr], &result{RawKind: side.kind})
			}
		}
		// Turns rotate every rep (the raw servers, then the engine), so each
		// takes every place in the order as often as the reps allow.
		turns := len(b.raws) + 1
		for rep := range b.o.reps {
			for _, tr := range transports {
				for k := range turns {
					i := (k + rep) % turns // i < len(b.raws): that raw server; else the engine
					engineTurn := i == len(b.raws)
					var c *transport.Client
					var into *result
					var proc *engineProc
					var server rawBaseline
					if engineTurn {
						c, into, proc = clients[tr], rows[tr], e
					} else {
						c, into, server = b.raws[i].clients[tr], raws[tr][i], b.raws[i].servers[tr]
					}
					v, u, err := b.once(ctx, c, op, proc, server)
					if err != nil {
						if engineTurn {
							return fmt.Errorf("engine %s over %s: %w", op, tr, errors.Join(err, e.Exited()))
						}
						return fmt.Errorf("%s raw socket %s over %s: %w", into.RawKind, op, tr, err)
					}
					into.GBps = append(into.GBps, v)
					into.CPU.add(u)
				}
			}
		}
		hostPeak, pluginPeak, err := e.peaks()
		if err != nil {
			return err
		}
		host, plugin := float64(hostPeak-baseH)/mib, float64(pluginPeak-baseP)/mib
		for _, tr := range transports {
			p, row, raw := b.panels[tr+op], rows[tr], raws[tr][0]
			row.HostMiB, row.PluginMiB, row.Alongside = host, plugin, raw.GBps
			p.Rows = append(p.Rows, *row)
			p.Raw.GBps = append(p.Raw.GBps, raw.GBps...)
			p.Raw.CPU.add(raw.CPU)
			also := ""
			for j, r := range raws[tr][1:] {
				p.RawAlso[j].GBps = append(p.RawAlso[j].GBps, r.GBps...)
				p.RawAlso[j].CPU.add(r.CPU)
				also += fmt.Sprintf(", %s %5.2f", b.raws[j+1].kind, median(r.GBps))
			}
			fmt.Fprintf(b.log, "%-7s %-23s %-4s %s %-7s %-4s %5.2f GB/s (raw %5.2f%s)  cores %.2f (raw %.2f)  extra RSS host %5.1f plugin %5.1f MiB  host waits on plugin %s\n",
				tag, cfg.label(), cfg.Plane, op, chunkName(cfg.Chunk), tr, median(row.GBps), median(raw.GBps), also,
				row.CPU.cores(), raw.CPU.cores(), host, plugin, percentCell(cfg, row.CPU.waitShare()))
		}
	}
	if err := verifyRestore(ctx, ctl, b.blobIfComparable()); err != nil {
		return err
	}
	b.rep.Verified++
	return nil
}

// once runs one transfer in direction op and returns its GB/s and the CPU
// time it took: of this process (client, and an in-process raw server), of
// raw, when that is a server process (as Host), and, when e is set, of the
// engine's host and plugin processes. On two cores the sum over wall time shows
// whether the machine was the limit.
func (b *bench) once(ctx context.Context, c *transport.Client, op string, e *engineProc, raw rawBaseline) (float64, cpuUse, error) {
	var u cpuUse
	var h0, p0 float64
	var c0 transferClock
	if e != nil {
		var err error
		if c0, err = e.transferClock(ctx, op); err != nil {
			return 0, u, err
		}
		h0, p0 = e.cpu()
	}
	var r0 float64
	if raw != nil {
		r0 = raw.cpu()
	}
	b0 := proccpu.Self()
	var d time.Duration
	var err error
	if op == opGet {
		d, err = getOnce(ctx, c, b.size, b.buf)
	} else {
		d, err = putOnce(ctx, c, b.blob, b.size, "1")
	}
	if err != nil {
		return 0, u, err
	}
	u.Bench = proccpu.Self() - b0
	if raw != nil {
		u.Host = raw.cpu() - r0 // a server process's; 0 in-process
	}
	if e != nil {
		h1, p1 := e.cpu()
		u.Host, u.Plugin = h1-h0, p1-p0
		c1, err := e.transferClockAfter(ctx, op, c0.count)
		if err != nil {
			return 0, u, err
		}
		u.EngineSec, u.BackendWait = c1.total-c0.total, c1.wait-c0.wait
	}
	u.Wall, u.Bytes = d.Seconds(), float64(b.size)
	return gbps(b.size, d), u, nil
}

// verifyRestore checks that slot 1, restored by STATE_PUT, continues exactly
// as slot 0 does: the same 16 greedy tokens.
func verifyRestore(ctx context.Context, c *transport.Client, blob *os.File) error {
	if blob != nil {
		// A restore must save back to the very bytes it came from (random
		// weights decode one token over and over, so decoding alone proves
		// little). The state records the sequence id of its slot, so the
		// blob, saved from slot 0, is restored into slot 0 for this check.
		st, err := blob.Stat()
		if err != nil {
			return err
		}
		if _, err := putOnce(ctx, c, blob, uint64(st.Size()), "0"); err != nil {
			return fmt.Errorf("STATE_PUT of the blob into slot 0: %w", err)
		}
		if err := sameAsFile(ctx, c, "0", blob); err != nil {
			return err
		}
	}
	req := []byte(`{"n_predict":16,"messages":null,"temperature":0}`)
	var frames [2][]byte
	var texts [2]string
	for slot := range frames {
		resp, payload, err := c.Call(ctx, transport.OpDecode, fmt.Sprint(slot), req)
		if err == nil {
			err = resp.Err()
		}
		if err != nil {
			return fmt.Errorf("DECODE slot %d: %w", slot, err)
		}
		var m map[string]any
		if err := json.Unmarshal(resp.Meta, &m); err != nil {
			return err
		}
		if n, err := metaInt(m, "tokens_generated"); err != nil || n == 0 {
			return fmt.Errorf("DECODE slot %d generated no tokens: %s", slot, resp.Meta)
		}
		fr, err := transport.ParseDecodeFrames(payload)
		if err != nil {
			return err
		}
		// Token ids only: logprobs may differ in the last bits between slots
		// on a GPU (batched vs single-token kernels).
		for _, f := range fr {
			frames[slot] = binary.LittleEndian.AppendUint32(frames[slot], f.TokenID)
		}
		texts[slot] = fmt.Sprint(m["text"])
	}
	if string(frames[0]) != string(frames[1]) {
		return fmt.Errorf("%w: %q vs %q", errVerify, texts[1], texts[0])
	}
	return nil
}

// sameAsFile streams slot's STATE_GET and compares it with f, byte for byte.
func sameAsFile(ctx context.Context, c *transport.Client, slot string, f *os.File) error {
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: slot})
	if err != nil {
		return err
	}
	defer resp.Close()
	if err := resp.Err(); err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if resp.PayloadLen != uint64(st.Size()) {
		return fmt.Errorf("%w: slot %s saves %d bytes, the restored blob had %d", errVerify, slot, resp.PayloadLen, st.Size())
	}
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < st.Size(); {
		n := min(int64(len(a)), st.Size()-off)
		if _, err := io.ReadFull(resp.Body, a[:n]); err != nil {
			return err
		}
		if _, err := f.ReadAt(b[:n], off); err != nil {
			return err
		}
		if string(a[:n]) != string(b[:n]) {
			return fmt.Errorf("%w: slot %s re-saved differs from the restored blob near byte %d", errVerify, slot, off)
		}
		off += n
	}
	return nil
}

// blobIfComparable is the blob a restored slot must re-save to; the mock
// records the source slot inside its state, so only other backends compare.
func (b *bench) blobIfComparable() *os.File {
	if b.o.backend.mock() {
		return nil
	}
	return b.blob
}

func (b *bench) stopEngine(e *engineProc) {
	if err := e.Stop(); err != nil {
		fmt.Fprintf(b.log, "warning: engine %d: %v\n", e.Pid(), err)
	}
}

// machineInfo describes where the numbers came from.
func machineInfo(bin string) machine {
	m := machine{
		NProc:     runtime.NumCPU(), // the affinity mask, as nproc reports it
		CPU:       firstField("/proc/cpuinfo", "model name"),
		Memory:    firstField("/proc/meminfo", "MemTotal"),
		Go:        runtime.Version(),
		Date:      time.Now().UTC().Format("2006-01-02 15:04 MST"),
		LoadStart: loadAvg(),
	}
	for _, f := range []struct {
		path string
		to   *string
	}{{"/proc/sys/kernel/osrelease", &m.Kernel}, {"/proc/sys/net/core/wmem_default", &m.WmemDefault}, {"/proc/sys/net/core/wmem_max", &m.WmemMax}} {
		if b, err := os.ReadFile(f.path); err == nil {
			*f.to = strings.TrimSpace(string(b))
		}
	}
	if bi, err := buildinfo.ReadFile(filepath.Join(bin, "hydra-engine")); err == nil {
		m.EngineGo = bi.GoVersion
	}
	return m
}

// loadAvg is the 1-, 5- and 15-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// writeFile writes what render produces to path, atomically.
func writeFile(path string, render func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := render(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// quoteArgs quotes the arguments that a shell would split or expand.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// engineFlags is a configuration's engine flags after the --engine-arg ones,
// so that the configuration's own (--data-plane) win.
func engineFlags(user []string, cfg engineConfig) []string {
	return append(slices.Clone(user), cfg.flags()...)
}
