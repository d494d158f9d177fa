//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// These tests run real llama.cpp (CPU) on generated random-weight models.
// Every Load creates a context that is never freed (see engine), so the
// models are tiny.

var modelDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cuda-llama-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var models sync.Map // name → path

// streamBlocks sets the streaming thresholds, in place and through the
// restore ring, for the backends t loads from now on: the test models' K/V
// blocks are a few KiB (and field reads at most 8 bytes), so 64 streams
// every block and 1 MiB none.
func streamBlocks(t testing.TB, inPlace, ring int64) {
	oldInPlace, oldRing := inPlaceStreamMin, ringStreamMin
	inPlaceStreamMin, ringStreamMin = inPlace, ring
	t.Cleanup(func() { inPlaceStreamMin, ringStreamMin = oldInPlace, oldRing })
}

// restoreModes are the two ways a restore can take the test models' K/V
// blocks, for tests that run both: held whole, or streamed piece by piece.
var restoreModes = []struct {
	name   string
	stream int64 // the streaming thresholds
}{{"held", 1 << 20}, {"streamed", 64}}

// modelFile generates the model once per test binary.
func modelFile(t testing.TB, name string, c gguf.Config) string {
	t.Helper()
	if p, ok := models.Load(name); ok {
		return p.(string)
	}
	p := filepath.Join(modelDir, name+".gguf")
	if err := gguf.WriteFile(p, c); err != nil {
		t.Fatal(err)
	}
	models.Store(name, p)
	return p
}

func tiny(t testing.TB) string { return modelFile(t, "tiny", gguf.Tiny()) }

// testLogger logs warnings and errors; HYDRA_TEST_LOG=info (or debug, …)
// shows more.
func testLogger() hclog.Logger {
	level := hclog.Warn
	if l := hclog.LevelFromString(os.Getenv("HYDRA_TEST_LOG")); l != hclog.NoLevel {
		level = l
	}
	return hclog.New(&hclog.LoggerOptions{Level: level, Output: os.Stderr})
}

// TestDevice reports where the model runs: on CPU here, on the GPU when
// libggml-cuda.so (make cuda) is beside the test binary. With
// HYDRA_TEST_REQUIRE_GPU=1 running on CPU fails, so that a GPU run cannot
// pass by falling back. On a GPU it also checks that state copies use the
// pinned staging buffers, and that INFO names the pinned llama.cpp commit.
func TestDevice(t *testing.T) {
	b := load(t, tiny(t), 2, nil)
	e := b.eng.Load()
	info, err := b.Info(context.Background())
	if pin := readPin(t); err != nil || info.Version != Version+"+llama.cpp-"+pin.commit[:8] {
		t.Fatalf("INFO's backend version %q (%v), want %s+llama.cpp-%s (mk/llama-pin.mk)", info.Version, err, Version, pin.commit[:8])
	}
	prefill(t, b, 0, story)
	state := stateOf(t, b, 0, 64<<10)
	if !bytes.Equal(state, reference(t, b, 0)) {
		t.Fatal("streamed state differs from llama.cpp's")
	}
	t.Logf("device %q, pinned staging %v, register_host_buffer %v", e.device, e.ctx.PinnedStaging(), registerHostBufferAvailable(gpuLoad.dev))
	switch {
	case e.device == "" && os.Getenv("HYDRA_TEST_REQUIRE_GPU") == "1":
		t.Fatal("running on CPU, HYDRA_TEST_REQUIRE_GPU=1")
	case e.device != "" && !e.ctx.PinnedStaging():
		t.Fatal("on a GPU, but the staging buffers are not pinned")
	}
}

func load(t testing.TB, model string, nSlots int, opts map[string]string) *Backend {
	t.Helper()
	o := map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "2048"}
	for k, v := range opts {
		o[k] = v
	}
	b := New(testLogger())
	if _, err := b.Load(context.Background(), iface.LoadRequest{Model: model, NSlots: nSlots, Options: o}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	return b
}

func prefill(t testing.TB, b *Backend, slot int, text string) iface.PrefillResult {
	t.Helper()
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: slot, Messages: []iface.Message{{Role: "user", Content: text}}})
	if err != nil {
		t.Fatalf("Prefill slot %d: %v", slot, err)
	}
	return res
}

// referenceKernels makes b's CPU work run ggml's reference kernels, for a
// test whose oracle is bit-for-bit (or near) equality between tokens
// evaluated in batches of different sizes: ggml's optimized CPU kernels
// differ by batch size (flash attention tiles batches of 64 or more
// queries), its reference kernels do not. On a GPU the kernels stay.
func referenceKernels(t testing.TB, b *Backend) {
	t.Helper()
	e := b.eng.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := e.ctx.UseReferenceKernels(); n == 0 && e.device == "" {
		t.Fatal("no CPU backend in the context to switch to the reference kernels")
	}
	if e.spec != nil {
		e.spec.useReferenceKernels()
	}
}

func prefillTokens(t testing.TB, b *Backend, slot int, toks []int32) iface.PrefillResult {
	t.Helper()
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: slot, Tokens: toks})
	if err != nil {
		t.Fatalf("Prefill slot %d: %v", slot, err)
	}
	return res
}

func decode(t testing.TB, b *Backend, slot, n int, sp iface.SamplerParams) ([]int32, iface.DecodeResult) {
	t.Helper()
	var ids []int32
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: slot, NPredict: n, Sampler: sp},
		func(tok iface.Token) error { ids = append(ids, tok.ID); return nil })
	if err != nil {
		t.Fatalf("Decode slot %d: %v", slot, err)
	}
	if res.TokensGenerated != len(ids) {
		t.Fatalf("Decode reported %d tokens, emitted %d", res.TokensGenerated, len(ids))
	}
	return ids, res
}

func slotInfo(t testing.TB, b *Backend, slot int) iface.SlotInfo {
	t.Helper()
	si, err := b.Slot(context.Background(), slot)
	if err != nil {
		t.Fatalf("Slot %d: %v", slot, err)
	}
	return si
}

func reference(t testing.TB, b *Backend, slot int) []byte {
	t.Helper()
	ref, err := b.referenceState(slot)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// recorder is a plain io.Writer that keeps the bytes and each Write's size.
type recorder struct {
	data   []byte
	chunks []int
}

func (w *recorder) Write(p []byte) (int, error) {
	w.data = append(w.data, p...)
	w.chunks = append(w.chunks, len(p))
	return len(p), nil
}

// chunkWriter is an shm.ChunkWriter over buffers of bufSize bytes, like the
// shared-memory ring's (whose buffers need not match the chunk size).
type chunkWriter struct {
	recorder
	bufSize int
	buf     []byte
	fill    int
	commits []int
}

func (w *chunkWriter) Buffer() ([]byte, error) {
	if w.buf == nil || w.fill == len(w.buf) {
		w.flush()
		w.buf, w.fill = make([]byte, w.bufSize), 0
	}
	return w.buf[w.fill:], nil
}

// Write, as the ring's, comes after the bytes committed before it (the
// logits a recurrent state carries after it).
func (w *chunkWriter) Write(p []byte) (int, error) {
	w.flush()
	return w.recorder.Write(p)
}

func (w *chunkWriter) Commit(n int) error {
	if n <= 0 || w.fill+n > len(w.buf) {
		return fmt.Errorf("commit of %d with %d of %d filled", n, w.fill, len(w.buf))
	}
	w.fill += n
	w.commits = append(w.commits, n)
	return nil
}

func (w *chunkWriter) flush() {
	if w.fill > 0 {
		w.data = append(w.data, w.buf[:w.fill]...)
	}
	w.buf, w.fill = nil, 0
}

// stateOf streams slot's state with a plain writer.
func stateOf(t testing.TB, b *Backend, slot, chunk int) []byte {
	t.Helper()
	var w recorder
	n, err := b.StateGet(context.Background(), slot, chunk, &w)
	if err != nil || n != int64(len(w.data)) {
		t.Fatalf("StateGet slot %d: %d, %v", slot, n, err)
	}
	return w.data
}

// normSeq zeroes the sequence ids in a state's cells, which name the slot it
// was saved from: a state restored into another slot re-saves with that one.
func normSeq(s []byte) []byte {
	s = bytes.Clone(s)
	if len(s) < 8 {
		return s
	}
	n := int(binary.LittleEndian.Uint32(s[4:]))
	for i := range n {
		off := 8 + i*cellMetaSize + 8
		if off+4 <= len(s) {
			binary.LittleEndian.PutUint32(s[off:], 0)
		}
	}
	return s
}

const story = "Once upon a time, in a land of rivers and hills, a state travelled between two engines."

// fragment fills slots so that the sequences are interleaved in the unified
// KV cache: slot 2's cells are scattered over several ranges.
func fragment(t testing.TB, b *Backend) {
	t.Helper()
	prefill(t, b, 0, strings.Repeat("alpha beta ", 20))
	prefill(t, b, 1, strings.Repeat("gamma ", 30))
	decode(t, b, 0, 10, iface.SamplerParams{})
	prefill(t, b, 2, "short")
	decode(t, b, 1, 5, iface.SamplerParams{})
	if err := b.ClearSlot(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	decode(t, b, 2, 40, iface.SamplerParams{}) // into the cells slot 0 freed, and past them
	decode(t, b, 1, 5, iface.SamplerParams{})
	decode(t, b, 2, 20, iface.SamplerParams{})
}

// TestStateBytesMatchLlama: the streamed state equals
// llama_state_seq_get_data's bytes for every chunk size, through plain writers
// (exact chunks: all but the last full) and ChunkWriters with odd buffer
// sizes; for contiguous and scattered sequences, an empty one, with flash
// attention on (row copies) and off (transposed V: element copies), and with
// quantized caches.
func TestStateBytesMatchLlama(t *testing.T) {
	for _, cfg := range []struct {
		name string
		opts map[string]string
	}{
		{"flash", nil},
		{"no-flash", map[string]string{llamaopt.OptFlashAttn: "off"}},
		{"q8_0", map[string]string{llamaopt.OptCacheTypeK: "q8_0", llamaopt.OptCacheTypeV: "q8_0"}},
		{"kv per slot", map[string]string{llamaopt.OptKVUnified: "false"}}, // one stream of five on the wire
		{"kv per slot no-flash", map[string]string{llamaopt.OptKVUnified: "false", llamaopt.OptFlashAttn: "off"}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			model := tiny(t)
			if cfg.name == "q8_0" { // quantized rows need heads of 32 values
				model = modelFile(t, "hd32", func() gguf.Config { c := gguf.Tiny(); c.Heads, c.KVHeads = 2, 1; return c }())
			}
			b := load(t, model, 4, cfg.opts)
			fragment(t, b)
			e := b.eng.Load()
			for _, slot := range []int{1, 2, 3} {
				ref := reference(t, b, slot)
				si := slotInfo(t, b, slot)
				if si.StateSize != int64(len(ref)) || si.StateSize != e.layout.size(si.NPast) {
					t.Fatalf("slot %d: StateSize %d, llama.cpp's %d, layout's %d", slot, si.StateSize, len(ref), e.layout.size(si.NPast))
				}
				if row, err := maxRow(ref); err != nil || (si.NPast > 0 && row != e.layout.MaxRow) {
					t.Fatalf("slot %d: largest row %d (%v), the layout's %d", slot, row, err, e.layout.MaxRow)
				}
				chunks := []int{1, 7, 4093, 64<<10 - 1, 64 << 10, 64<<10 + 1, 1<<20 + 3, 64 << 20}
				if slot == 2 && cfg.name == "flash" {
					t.Logf("slot %d: %d tokens, %d-byte state", slot, si.NPast, len(ref))
				}
				for _, chunk := range chunks {
					var w recorder
					n, err := b.StateGet(context.Background(), slot, chunk, &w)
					if err != nil || n != int64(len(ref)) || !bytes.Equal(w.data, ref) {
						t.Fatalf("slot %d chunk %d: %d bytes, %v; equal to llama.cpp's %d: %v", slot, chunk, n, err, len(ref), bytes.Equal(w.data, ref))
					}
					for k, c := range w.chunks {
						if c > chunk || (k < len(w.chunks)-1 && c != chunk) {
							t.Fatalf("slot %d chunk %d: piece %d of %d bytes", slot, chunk, k, c)
						}
					}
				}
				for _, bufSize := range []int{1000, 65536, 100003} {
					for _, chunk := range []int{4093, 64 << 10, 64 << 20} {
						w := &chunkWriter{bufSize: bufSize}
						n, err := b.StateGet(context.Background(), slot, chunk, w)
						w.flush()
						if err != nil || n != int64(len(ref)) || !bytes.Equal(w.data, ref) || len(w.recorder.chunks) != 0 {
							t.Fatalf("slot %d ChunkWriter(%d) chunk %d: %d, %v, equal %v, %d Writes",
								slot, bufSize, chunk, n, err, bytes.Equal(w.data, ref), len(w.recorder.chunks))
						}
						for _, c := range w.commits {
							if c > chunk {
								t.Fatalf("commit of %d bytes with chunk %d", c, chunk)
							}
						}
					}
				}
			}
		})
	}
}

// TestRoundTrip: prefill → decode → STATE_GET → restore (same slot after a
// clear, another slot, another backend with another slot count) → greedy and
// seeded decodes equal the uninterrupted ones, and the restored state re-saves
// to the same bytes; with the K/V blocks held and streamed.
func TestRoundTrip(t *testing.T) {
	for _, mode := range restoreModes {
		t.Run(mode.name, func(t *testing.T) {
			streamBlocks(t, mode.stream, mode.stream)
			testRoundTrip(t)
		})
	}
}

// saved is a sequence's state and how the source continued it.
type saved struct {
	si             iface.SlotInfo
	state          []byte
	greedy, seeded []int32
	greedyRes      iface.DecodeResult
	seededParams   iface.SamplerParams
	first, cont    int
}

// roundTripSource decodes a sequence, saves it and records how it goes on,
// greedy and seeded (in a slot of its own restored from the state).
func roundTripSource(t *testing.T) saved {
	sv := saved{first: 6, cont: 30, seededParams: iface.SamplerParams{Temperature: 0.9, TopK: 40, TopP: 0.95, Seed: 7}}
	ref := load(t, tiny(t), 2, nil)
	prefill(t, ref, 0, story)
	decode(t, ref, 0, sv.first, iface.SamplerParams{})
	sv.si = slotInfo(t, ref, 0)
	sv.state = stateOf(t, ref, 0, 64<<10)
	if !bytes.Equal(sv.state, reference(t, ref, 0)) {
		t.Fatal("streamed state differs from llama.cpp's")
	}
	sv.greedy, sv.greedyRes = decode(t, ref, 0, sv.cont, iface.SamplerParams{})
	if _, err := ref.StatePut(context.Background(), 1, sv.si.Tokens, bytes.NewReader(sv.state), int64(len(sv.state))); err != nil {
		t.Fatal(err)
	}
	sv.seeded, _ = decode(t, ref, 1, sv.cont, sv.seededParams)
	t.Logf("greedy %v (%s); seeded %v", sv.greedy, sv.greedyRes.StopReason, sv.seeded)
	if slices.Equal(sv.greedy, sv.seeded) {
		t.Log("note: the seeded decode equals the greedy one")
	}
	return sv
}

func testRoundTrip(t *testing.T) {
	sv := roundTripSource(t)
	a := load(t, tiny(t), 3, nil)
	other := load(t, tiny(t), 5, nil)
	split := load(t, tiny(t), 4, map[string]string{llamaopt.OptKVUnified: "false"})
	prefill(t, a, 1, "another sequence, so the restored one lands elsewhere in the cache")
	prefill(t, split, 1, "a sequence in another KV stream")
	for _, tc := range []struct {
		name  string
		b     *Backend
		slot  int
		clear bool
	}{
		{"slot 0", a, 0, false},
		{"same slot after clear", a, 0, true},
		{"other slot", a, 2, false},
		{"other backend, other slot count", other, 3, false},
		{"over a live sequence", other, 3, false},
		{"a KV stream per slot, first slot", split, 0, false},
		{"a KV stream per slot, middle slot", split, 2, false},
		{"a KV stream per slot, last slot", split, 3, false},
	} {
		if tc.clear {
			if err := tc.b.ClearSlot(context.Background(), tc.slot); err != nil {
				t.Fatal(err)
			}
		}
		checkRoundTrip(t, tc.name, tc.b, tc.slot, sv)
	}

	// A seeded decode split in two equals one in one go: the draw depends on
	// the seed and the position only.
	if _, err := a.StatePut(context.Background(), 2, sv.si.Tokens, bytes.NewReader(sv.state), int64(len(sv.state))); err != nil {
		t.Fatal(err)
	}
	h1, _ := decode(t, a, 2, sv.cont/2, sv.seededParams)
	h2, _ := decode(t, a, 2, sv.cont-sv.cont/2, sv.seededParams)
	if !slices.Equal(append(h1, h2...), sv.seeded) {
		t.Fatalf("split seeded decode %v, want %v", append(h1, h2...), sv.seeded)
	}
}

// checkRoundTrip restores sv into b's slot and checks the slot, its re-saved
// bytes, and greedy and seeded decodes from it.
func checkRoundTrip(t *testing.T, name string, b *Backend, slot int, sv saved) {
	t.Helper()
	n, err := b.StatePut(context.Background(), slot, sv.si.Tokens, bytes.NewReader(sv.state), int64(len(sv.state)))
	if err != nil || n != int64(len(sv.state)) {
		t.Fatalf("%s: StatePut = %d, %v", name, n, err)
	}
	got := slotInfo(t, b, slot)
	if got.NPast != sv.si.NPast || !slices.Equal(got.Tokens, sv.si.Tokens) || got.StateSize != sv.si.StateSize {
		t.Fatalf("%s: restored slot %+v, want %+v", name, got, sv.si)
	}
	again := stateOf(t, b, slot, 1<<20)
	if !bytes.Equal(normSeq(again), normSeq(sv.state)) {
		t.Fatalf("%s: the restored state re-saves differently", name)
	}
	if slot == 0 && !bytes.Equal(again, sv.state) {
		t.Fatalf("%s: same slot id, yet different bytes", name)
	}
	toks, res := decode(t, b, slot, sv.cont, iface.SamplerParams{})
	if !slices.Equal(toks, sv.greedy) || !reflect.DeepEqual(res, sv.greedyRes) {
		t.Fatalf("%s: decoded %v (%+v), want %v (%+v)", name, toks, res, sv.greedy, sv.greedyRes)
	}
	// And seeded sampling continues alike from a fresh restore.
	if _, err := b.StatePut(context.Background(), slot, sv.si.Tokens, bytes.NewReader(sv.state), int64(len(sv.state))); err != nil {
		t.Fatal(err)
	}
	if toks, _ := decode(t, b, slot, sv.cont, sv.seededParams); !slices.Equal(toks, sv.seeded) {
		t.Fatalf("%s: seeded decode %v, want %v", name, toks, sv.seeded)
	}
}

// TestRestoredLogits: a state followed by exactly NVocab f32 logits (a
// PREFILL blob) restores with those logits; other trailing bytes are skipped
// and the last token re-evaluated: by the first decode (restore_logits=lazy,
// the default) or within StatePut (eager).
func TestRestoredLogits(t *testing.T) {
	for _, mode := range []string{"lazy", "eager"} {
		t.Run(mode, func(t *testing.T) { testRestoredLogits(t, map[string]string{llamaopt.OptRestoreLogits: mode}) })
		// Eager, the scratch sequence re-evaluates in a copy of the slot's stream.
		t.Run(mode+" kv per slot", func(t *testing.T) {
			testRestoredLogits(t, map[string]string{llamaopt.OptRestoreLogits: mode, llamaopt.OptKVUnified: "false"})
		})
	}
}

func testRestoredLogits(t *testing.T, opts map[string]string) {
	mode := opts[llamaopt.OptRestoreLogits]
	b := load(t, tiny(t), 3, opts)
	res := prefill(t, b, 0, story)
	state := stateOf(t, b, 0, 1<<20)
	toks := res.Slot.Tokens
	want, _ := decode(t, b, 0, 12, iface.SamplerParams{})

	encode := func(l []float32) []byte {
		out := make([]byte, 0, 4*len(l))
		for _, f := range l {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
		}
		return out
	}
	// The prefill's own logits continue exactly as the re-evaluation does.
	for name, trailing := range map[string][]byte{
		"prefill logits": encode(res.Logits),
		"none":           nil,
		"odd":            []byte("thirteen byte"),
		"large":          make([]byte, 3<<20+5),
	} {
		blob := append(slices.Clone(state), trailing...)
		r := &eofReader{r: bytes.NewReader(blob)}
		n, err := b.StatePut(context.Background(), 1, toks, r, int64(len(blob)))
		if err != nil || n != int64(len(state)) || !r.eof {
			t.Fatalf("%s: StatePut = %d, %v (drained %v)", name, n, err, r.eof)
		}
		_, l, _ := b.eng.Load().cells.Slots[1].Snapshot()
		if adopted := name == "prefill logits"; (l == nil) != (mode == "lazy" && !adopted) {
			t.Fatalf("%s, restore_logits=%s: slot holds logits %v after StatePut", name, mode, l != nil)
		}
		// The slot answers as restored before its logits are computed.
		if si := slotInfo(t, b, 1); si.NPast != len(toks) || si.StateSize != int64(len(state)) {
			t.Fatalf("%s: slot %+v", name, si)
		}
		if got := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(got), normSeq(state)) {
			t.Fatalf("%s: the restored state re-saves differently", name)
		}
		if got, _ := decode(t, b, 1, 12, iface.SamplerParams{}); !slices.Equal(got, want) {
			t.Fatalf("%s: decoded %v, want %v", name, got, want)
		}
	}
	// Adopted, not recomputed: logits that make token 300 certain.
	forced := make([]float32, len(res.Logits))
	for i := range forced {
		forced[i] = -100
	}
	forced[300] = 100
	blob := append(slices.Clone(state), encode(forced)...)
	if _, err := b.StatePut(context.Background(), 2, toks, bytes.NewReader(blob), int64(len(blob))); err != nil {
		t.Fatal(err)
	}
	if got, _ := decode(t, b, 2, 1, iface.SamplerParams{}); !slices.Equal(got, []int32{300}) {
		t.Fatalf("with forced logits decoded %v, want [300]", got)
	}
	// Logits making EOS certain: the decode stops at once.
	forced[300], forced[gguf.TokEOS] = -100, 100
	blob = append(slices.Clone(state), encode(forced)...)
	if _, err := b.StatePut(context.Background(), 2, toks, bytes.NewReader(blob), int64(len(blob))); err != nil {
		t.Fatal(err)
	}
	if got, res := decode(t, b, 2, 5, iface.SamplerParams{}); len(got) != 0 || res.StopReason != StopEOS || res.NPast != len(toks) {
		t.Fatalf("decode before EOS: %v %+v", got, res)
	}
}

// errAfter fails with err once n bytes have been read.
type errAfter struct {
	r   io.Reader
	n   int
	err error
}

func (e *errAfter) Read(p []byte) (int, error) {
	if e.n == 0 {
		return 0, e.err
	}
	k, err := e.r.Read(p[:min(len(p), e.n)])
	e.n -= k
	return k, err
}

// eofReader reports whether its reader was read to the end.
type eofReader struct {
	r   io.Reader
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.eof = true
	}
	return n, err
}

// TestStatePutFailures: every malformed, truncated or mismatched state fails
// with a reason, leaves the slot empty and other slots untouched, drains the
// reader (unless the reader itself failed), and the backend serves on; with
// the K/V blocks held and streamed.
func TestStatePutFailures(t *testing.T) {
	for _, mode := range restoreModes {
		t.Run(mode.name, func(t *testing.T) {
			streamBlocks(t, mode.stream, mode.stream)
			testStatePutFailures(t)
		})
	}
}

// putFailure is a StatePut that must fail.
type putFailure struct {
	name   string
	tokens []int32
	r      io.Reader
	size   int64 // 0: the good state's
	msg    string
	isErr  error // also matched with errors.Is; errReaderFailed: a reader failure, not a bad request
}

var errReaderFailed = errors.New("connection reset")

// putFailures are the failing restores of b's slot 0, whose good state (of
// toks) is state.
func putFailures(t *testing.T, toks []int32, state []byte) []putFailure {
	n := len(toks)
	dataStart := 8 + n*cellMetaSize // v_trans, n_layer, then layer 0's K type
	le32 := func(off int, v uint32) io.Reader {
		s := bytes.Clone(state)
		binary.LittleEndian.PutUint32(s[off:], v)
		return bytes.NewReader(s)
	}
	other := load(t, modelFile(t, "wide", func() gguf.Config { c := gguf.Tiny(); c.Embd, c.Heads, c.KVHeads = 128, 8, 4; return c }()), 1, nil)
	prefillTokens(t, other, 0, toks)
	otherState := stateOf(t, other, 0, 1<<20)
	bad := slices.Clone(toks)
	bad[3] = 100000
	cut := func(k int) io.Reader { return bytes.NewReader(state[:k]) }
	return []putFailure{
		{"empty", toks, bytes.NewReader(nil), 0, "truncated at offset 0", io.ErrUnexpectedEOF},
		{"truncated in header", toks, cut(5), 0, "truncated at offset 5", io.ErrUnexpectedEOF},
		{"truncated in cells", toks, cut(30), 0, "truncated at offset 30", io.ErrUnexpectedEOF},
		{"truncated in KV", toks, cut(len(state) / 2), 0, "truncated", io.ErrUnexpectedEOF},
		{"last byte missing", toks, cut(len(state) - 1), 0, "truncated", io.ErrUnexpectedEOF},
		{"size below state", toks, bytes.NewReader(state), int64(len(state) - 1), "needs", nil},
		{"two streams", toks, le32(0, 2), 0, "2 KV streams", nil},
		{"fewer tokens", toks[:n-1], bytes.NewReader(state), 0, fmt.Sprintf("%d cells, the blob header %d tokens", n, n-1), nil},
		{"cells over n_ctx", make([]int32, 5000), le32(4, 5000), 0, "n_ctx is", nil},
		{"token outside vocab", bad, bytes.NewReader(state), 0, "outside the vocabulary", nil},
		{"cell of two sequences", toks, le32(8+3*cellMetaSize+4, 2), 0, "cell 3 belongs to 2 sequences", nil},
		{"position out of range", toks, le32(8+5*cellMetaSize, uint32(n)), 0, "cell 5: position", nil},
		{"position repeated", toks, le32(8+5*cellMetaSize, 4), 0, "position 4 repeated", nil},
		{"v_trans flipped", toks, le32(dataStart, 1), 0, "not this model's (byte 0 of their fields: 1, this model's 0)", nil},
		{"layer count", toks, le32(dataStart+4, 3), 0, "(byte 4 of their fields: 3,", nil},
		{"key type", toks, le32(dataStart+8, 0), 0, "(byte 8 of their fields: 0,", nil},
		{"key row size", toks, le32(dataStart+12, 7), 0, "(byte 12 of their fields: 7,", nil},
		{"another model's state", toks, bytes.NewReader(otherState), int64(len(otherState)), "row size", nil},
		{"reader error", toks, &errAfter{bytes.NewReader(state), len(state) / 2, errReaderFailed}, 0, "connection reset", errReaderFailed},
		{"reader error in head", toks, &errAfter{bytes.NewReader(state), 3, errReaderFailed}, 0, "offset 3", errReaderFailed},
	}
}

func testStatePutFailures(t *testing.T) {
	b := load(t, tiny(t), 3, nil)
	prefill(t, b, 0, story)
	toks := slotInfo(t, b, 0).Tokens
	state := stateOf(t, b, 0, 1<<20)
	prefill(t, b, 2, "a bystander")
	bystander := stateOf(t, b, 2, 1<<20)
	for _, tc := range putFailures(t, toks, state) {
		prefill(t, b, 0, story) // each failure must empty the slot, whatever it held
		size := tc.size
		if size == 0 {
			size = int64(len(state))
		}
		er := &eofReader{r: tc.r}
		_, err := b.StatePut(context.Background(), 0, tc.tokens, er, size)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want one mentioning %q", tc.name, err, tc.msg)
			continue
		}
		checkPutFailed(t, b, tc, err, er.eof, bystander)
	}
	checkServesAfterFailures(t, b, toks, state)
}

// checkPutFailed checks what a failed restore of slot 0 left: the error's
// class, the reader drained unless it failed, the slot empty, slot 2 (the
// bystander's) as it was.
func checkPutFailed(t *testing.T, b *Backend, tc putFailure, err error, drained bool, bystander []byte) {
	t.Helper()
	if tc.isErr != nil && !errors.Is(err, tc.isErr) {
		t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.isErr)
	}
	if tc.isErr == errReaderFailed {
		if errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: a reader failure classed as a bad request", tc.name)
		}
	} else {
		if !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: %v is not ErrBadRequest", tc.name, err)
		}
		if !drained {
			t.Errorf("%s: the reader was not drained", tc.name)
		}
	}
	if si := slotInfo(t, b, 0); si.NPast != 0 || len(si.Tokens) != 0 || si.StateSize != emptyState {
		t.Errorf("%s: slot not empty after a failed restore: %+v", tc.name, si)
	}
	if got := reference(t, b, 0); len(got) != emptyState {
		t.Errorf("%s: llama.cpp still holds %d bytes of state for the slot", tc.name, len(got))
	}
	if !bytes.Equal(stateOf(t, b, 2, 1<<20), bystander) {
		t.Errorf("%s: another slot changed", tc.name)
	}
	if _, err := b.Decode(context.Background(), iface.DecodeRequest{NPredict: 1}, nil); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("%s: decode on the failed slot: %v", tc.name, err)
	}
	t.Logf("%s: %v", tc.name, err)
}

// checkServesAfterFailures: a cancelled restore stops reading and empties
// the slot, a bad slot still drains the reader, and after all that the good
// state restores and decodes.
func checkServesAfterFailures(t *testing.T, b *Backend, toks []int32, state []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	prefill(t, b, 0, story)
	if _, err := b.StatePut(ctx, 0, toks, bytes.NewReader(state), int64(len(state))); !errors.Is(err, context.Canceled) || slotInfo(t, b, 0).NPast != 0 {
		t.Fatalf("cancelled StatePut: %v", err)
	}
	r := &eofReader{r: bytes.NewReader(state)}
	if _, err := b.StatePut(context.Background(), 9, toks, r, int64(len(state))); !errors.Is(err, iface.ErrNoSlot) || !r.eof {
		t.Fatalf("bad slot: %v (drained %v)", err, r.eof)
	}
	if _, err := b.StatePut(context.Background(), 0, toks, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stateOf(t, b, 0, 1<<20), state) {
		t.Fatal("restored state differs")
	}
	decode(t, b, 0, 5, iface.SamplerParams{})
}

// TestStateGetWriterErrorsAndCancel: a failing writer or a cancelled context
// stops the stream with that error and leaves the slot as it was.
func TestStateGetWriterErrorsAndCancel(t *testing.T) {
	b := load(t, tiny(t), 1, nil)
	prefill(t, b, 0, strings.Repeat("long enough for several chunks ", 20))
	state := stateOf(t, b, 0, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := b.StateGet(ctx, 0, 1000, &recorder{}); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("cancelled StateGet: %d, %v", n, err)
	}
	boom := errors.New("broken pipe")
	w := &failWriter{after: 3, err: boom}
	if n, err := b.StateGet(context.Background(), 0, 1000, w); !errors.Is(err, boom) || n != 3000 {
		t.Fatalf("failing writer: %d, %v", n, err)
	}
	if _, err := b.StateGet(context.Background(), 0, 1000, &failWriter{after: 1, short: true}); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short writer: %v", err)
	}
	if _, err := b.StateGet(context.Background(), 0, 1000, &failCommit{chunkWriter{bufSize: 4096}, 2, boom}); !errors.Is(err, boom) {
		t.Fatalf("failing ChunkWriter: %v", err)
	}
	if _, err := b.StateGet(context.Background(), 0, 0, &recorder{}); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("chunk size 0: %v", err)
	}
	if !bytes.Equal(stateOf(t, b, 0, 4093), state) {
		t.Fatal("the state changed")
	}
}

type failWriter struct {
	after int
	short bool
	err   error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if f.after == 0 {
		if f.short {
			return len(p) / 2, nil
		}
		return 0, f.err
	}
	f.after--
	return len(p), nil
}

type failCommit struct {
	chunkWriter
	after int
	err   error
}

func (f *failCommit) Commit(n int) error {
	if f.after == 0 {
		return f.err
	}
	f.after--
	return f.chunkWriter.Commit(n)
}

// TestPrefillAndDecode: the chat template, validation (a rejected prefill
// leaves the slot as it was), stop reasons and the KV shared by slots.
func TestPrefillAndDecode(t *testing.T) {
	b := load(t, tiny(t), 3, map[string]string{llamaopt.OptNCtx: "256", llamaopt.OptAlias: "tiny-test"})
	e := b.eng.Load()
	if e.cells.NCtx != 256 || e.info.Model.Alias != "tiny-test" || len(e.info.Model.Hash) != 64 || !filepath.IsAbs(e.info.Model.Path) {
		t.Fatalf("info %+v", e.info)
	}
	msgs := []iface.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	text, err := e.model.applyTemplate(msgs)
	if want := "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; err != nil || text != want {
		t.Fatalf("template: %q, %v; want %q", text, err, want)
	}
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	toks := res.Slot.Tokens
	if toks[0] != gguf.TokBOS || toks[1] != gguf.TokIMStart || !slices.Contains(toks, gguf.TokIMEnd) || len(res.Logits) != e.model.nVocab {
		t.Fatalf("prefill tokens %v, %d logits", toks, len(res.Logits))
	}
	if got := argmax(res.Logits); got < 0 {
		t.Fatal(got)
	}
	ids, dres := decode(t, b, 0, 1, iface.SamplerParams{})
	if len(ids) == 1 && ids[0] != int32(argmax(res.Logits)) {
		t.Fatalf("first greedy token %d, logits arg-max %d", ids[0], argmax(res.Logits))
	}
	if dres.NPast != len(toks)+len(ids) {
		t.Fatalf("n_past %d", dres.NPast)
	}
	checkPrefillRejects(t, b, msgs)
	checkContextLimit(t, b)
	checkEmitError(t, b)
}

// checkPrefillRejects: invalid prompts are bad requests that leave slot 0 as
// it was; another model's alias falls back to the resident one.
func checkPrefillRejects(t *testing.T, b *Backend, msgs []iface.Message) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  iface.PrefillRequest
		msg  string
	}{
		{"both", iface.PrefillRequest{Messages: msgs, Tokens: []int32{1}}, "one of messages, tokens and text"},
		{"neither", iface.PrefillRequest{}, "empty prompt"},
		{"negative token", iface.PrefillRequest{Tokens: []int32{1, -1}}, "token -1 at position 1"},
		{"token past the vocabulary", iface.PrefillRequest{Tokens: []int32{512}}, "token 512 at position 0"},
		{"over n_ctx", iface.PrefillRequest{Tokens: make([]int32, 257)}, "n_ctx is 256"},
		{"no role", iface.PrefillRequest{Messages: []iface.Message{{Content: "x"}}}, "no role"},
	} {
		before := slotInfo(t, b, 0)
		_, err := b.Prefill(ctx, tc.req)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want ErrBadRequest mentioning %q", tc.name, err, tc.msg)
		}
		if after := slotInfo(t, b, 0); !slices.Equal(after.Tokens, before.Tokens) {
			t.Errorf("%s: a rejected prefill changed the slot", tc.name)
		}
	}
	if res, err := b.Prefill(ctx, iface.PrefillRequest{Slot: 1, Tokens: []int32{5}, Model: "llama-70b"}); err != nil || !res.ModelFallback {
		t.Fatalf("other alias: fallback=%v err=%v", res.ModelFallback, err)
	}
}

// checkContextLimit: a slot of b (n_ctx 256) stops decoding at n_ctx; the
// cells are shared, so a full cache refuses another slot's prefill; decodes
// of an empty slot, of a negative count and of a missing slot are refused.
func checkContextLimit(t *testing.T, b *Backend) {
	ctx := context.Background()
	if err := b.ClearSlot(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.ClearSlot(ctx, 1); err != nil {
		t.Fatal(err)
	}
	prefillTokens(t, b, 2, make([]int32, 250))
	ids, dres := decode(t, b, 2, 20, iface.SamplerParams{})
	if dres.StopReason != StopNTokensLimit || dres.NPast != 256 || len(ids) != 6 {
		t.Fatalf("decode to the context's end: %d tokens, %+v", len(ids), dres)
	}
	// The cells are shared: slot 2 holds them all, so slot 0 cannot prefill.
	_, err := b.Prefill(ctx, iface.PrefillRequest{Slot: 0, Tokens: make([]int32, 10)})
	if !errors.Is(err, iface.ErrNoRoom) || !strings.Contains(err.Error(), "shared by all slots") || slotInfo(t, b, 0).NPast != 0 {
		t.Fatalf("prefill into a full cache: %v", err)
	}
	if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: 0, NPredict: 1}, nil); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("decode of an empty slot: %v", err)
	}
	if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: 2, NPredict: -1}, nil); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("negative n_predict: %v", err)
	}
	if _, err := b.Slot(ctx, 3); !errors.Is(err, iface.ErrNoSlot) {
		t.Fatalf("slot 3: %v", err)
	}
}

// checkEmitError: an emit error stops the decode with it; what was emitted
// stays.
func checkEmitError(t *testing.T, b *Backend) {
	ctx := context.Background()
	_ = b.ClearSlot(ctx, 2)
	prefillTokens(t, b, 1, []int32{7, 8, 9})
	stop := errors.New("client gone")
	k := 0
	dr, err := b.Decode(ctx, iface.DecodeRequest{Slot: 1, NPredict: 10}, func(iface.Token) error {
		if k++; k == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || dr.TokensGenerated != 3 || slotInfo(t, b, 1).NPast != 6 {
		t.Fatalf("emit error: %+v %v", dr, err)
	}
}

// TestConcurrentSlots: decodes on two slots and state transfers of a third run
// concurrently (the context is shared under a mutex); every result equals the
// same work done one at a time on the same layout.
func TestConcurrentSlots(t *testing.T) {
	b := load(t, tiny(t), 3, nil)
	prefill(t, b, 2, "the slot whose state is copied while others decode")
	state := stateOf(t, b, 2, 1<<20)
	toks := slotInfo(t, b, 2).Tokens
	prefill(t, b, 0, "first")
	prefill(t, b, 1, "second")
	var wg sync.WaitGroup
	var got [2][]int32
	for s := range 2 {
		wg.Go(func() {
			var ids []int32
			_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: s, NPredict: 40},
				func(tok iface.Token) error { ids = append(ids, tok.ID); return nil })
			if err != nil {
				t.Error(err)
			}
			got[s] = ids
		})
	}
	wg.Go(func() {
		for range 20 {
			var w recorder
			if _, err := b.StateGet(context.Background(), 2, 4093, &w); err != nil || !bytes.Equal(w.data, state) {
				t.Errorf("concurrent StateGet: %v, equal %v", err, bytes.Equal(w.data, state))
				return
			}
			if _, err := b.StatePut(context.Background(), 2, toks, bytes.NewReader(state), int64(len(state))); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	// The same decodes, one at a time, in a fresh backend.
	ref := load(t, tiny(t), 3, nil)
	prefill(t, ref, 2, "the slot whose state is copied while others decode")
	prefill(t, ref, 0, "first")
	prefill(t, ref, 1, "second")
	for s := range 2 {
		want, _ := decode(t, ref, s, 40, iface.SamplerParams{})
		if !slices.Equal(got[s], want) {
			t.Errorf("slot %d decoded %v concurrently, %v alone", s, got[s], want)
		}
	}
}

func TestExpertModeAndSwapQuant(t *testing.T) {
	b := New(nil)
	for in, want := range map[string]string{"solo": "solo", "combined": "solo"} {
		if got, err := b.SetExpertMode(context.Background(), in); err != nil || got != want {
			t.Fatalf("%s: %q, %v", in, got, err)
		}
	}
	if _, err := b.SetExpertMode(context.Background(), "Solo"); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatal(err)
	}
	if _, err := b.SwapQuant(context.Background(), "q4", ".*"); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatal(err)
	}
	if _, err := b.Info(context.Background()); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("Info before Load: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk.gguf")
	if err := os.WriteFile(junk, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		req   iface.LoadRequest
		msg   string
		isBad bool
	}{
		{"no model", iface.LoadRequest{NSlots: 1}, "--model", true},
		{"missing file", iface.LoadRequest{Model: "/nonexistent.gguf"}, "no such file", true},
		{"a directory", iface.LoadRequest{Model: t.TempDir()}, "not a regular file", true},
		{"not a GGUF", iface.LoadRequest{Model: junk}, "could not load model", false},
		{"too many slots", iface.LoadRequest{Model: tiny(t), NSlots: 300}, "n_slots 300", true},
		{"unknown option", iface.LoadRequest{Model: tiny(t), Options: map[string]string{"n_ctxx": "5"}}, `unknown option "n_ctxx"`, true},
		{"removed option", iface.LoadRequest{Model: tiny(t), Options: map[string]string{"copy_threads": "4"}}, `option "copy_threads" was removed`, true},
		{"lib_dir without a library", iface.LoadRequest{Model: tiny(t), Options: map[string]string{llamaopt.OptLibDir: "/nonexistent"}}, "", false},
	} {
		b := New(testLogger())
		_, err := b.Load(context.Background(), tc.req)
		if tc.msg == "" { // lib_dir without a library: CPU fallback, loads
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.msg) || errors.Is(err, iface.ErrBadRequest) != tc.isBad {
			t.Errorf("%s: err = %v, want one mentioning %q (bad request %v)", tc.name, err, tc.msg, tc.isBad)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	b := load(t, tiny(t), 1, nil)
	if _, err := b.Load(context.Background(), iface.LoadRequest{Model: tiny(t)}); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("second Load: %v", err)
	}
}

// benchModel: 16 KiB of F16 KV per token, so 2,048 tokens make a 32 MiB
// state. HYDRA_BENCH_ARCH (llama, qwen3moe, qwen35moe, gemma3),
// HYDRA_BENCH_MODEL=layers,embd,heads,kv_heads,ff and
// HYDRA_BENCH_TOKENS=n size it otherwise: "32,1024,8,8,1024" and 9200 make the
// GPU benchmark's 1.2 GB state (128 KiB per token).
func benchModel(b *testing.B) (string, int) {
	c, err := gguf.TinyFor(os.Getenv("HYDRA_BENCH_ARCH")) // "": llama
	if err != nil {
		b.Fatalf("HYDRA_BENCH_ARCH: %v", err)
	}
	c.Layers, c.Embd, c.Heads, c.KVHeads, c.FF, c.HeadSize = 16, 256, 4, 4, 256, 0
	tokens := 2048
	if v := os.Getenv("HYDRA_BENCH_MODEL"); v != "" {
		if _, err := fmt.Sscanf(v, "%d,%d,%d,%d,%d", &c.Layers, &c.Embd, &c.Heads, &c.KVHeads, &c.FF); err != nil {
			b.Fatalf("HYDRA_BENCH_MODEL=%q: want layers,embd,heads,kv_heads,ff: %v", v, err)
		}
		c.F16 = true
	}
	if v := os.Getenv("HYDRA_BENCH_TOKENS"); v != "" {
		if _, err := fmt.Sscan(v, &tokens); err != nil {
			b.Fatalf("HYDRA_BENCH_TOKENS=%q: %v", v, err)
		}
	}
	c.Ctx = max(c.Ctx, tokens)
	return modelFile(b, fmt.Sprintf("bench-%s-%d-%d-%d-%d-%d", c.Arch, c.Layers, c.Embd, c.Heads, c.KVHeads, c.FF), c), tokens
}

var bench struct {
	once   sync.Once
	b      *Backend
	toks   []int32
	logits []float32
}

// benchBackend is shared by the benchmarks: the prefill takes seconds on CPU.
func benchBackend(b *testing.B) (*Backend, []int32, []float32) {
	bench.once.Do(func() {
		model, n := benchModel(b)
		// Room for the source and a restored copy, and the scratch token.
		bench.b = load(b, model, 2, map[string]string{llamaopt.OptNCtx: fmt.Sprint(2*n + 256)})
		bench.toks = make([]int32, n)
		for i := range bench.toks {
			bench.toks[i] = int32(5 + i%500)
		}
		start := time.Now()
		bench.logits = prefillTokens(b, bench.b, 0, bench.toks).Logits
		b.Logf("prefill of %d tokens: %v; state %d bytes; device %q", n, time.Since(start),
			slotInfo(b, bench.b, 0).StateSize, bench.b.eng.Load().device)
	})
	if bench.b == nil {
		b.Fatal("no bench backend")
	}
	return bench.b, bench.toks, bench.logits
}

func BenchmarkStateGet(b *testing.B) {
	be, _, _ := benchBackend(b)
	size := slotInfo(b, be, 0).StateSize
	for _, chunk := range []int{256 << 10, 2 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("writer/chunk=%dKiB", chunk>>10), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := be.StateGet(context.Background(), 0, chunk, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("chunkwriter/chunk=%dKiB", chunk>>10), func(b *testing.B) {
			b.SetBytes(size)
			w := &discardChunks{buf: make([]byte, chunk)}
			for b.Loop() {
				if _, err := be.StateGet(context.Background(), 0, chunk, w); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// discardChunks is a ChunkWriter that reuses one buffer.
type discardChunks struct{ buf []byte }

func (d *discardChunks) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardChunks) Buffer() ([]byte, error)     { return d.buf, nil }
func (d *discardChunks) Commit(int) error            { return nil }

// BenchmarkStatePut: /logits restores a PREFILL blob (state + logits: the
// transfer alone) from an io.Reader; /ring from 2 MiB pieces of a mapping
// (the shm ring, as if the host's fills cost nothing), read into the restore
// ring or taken in place; /reeval a STATE_GET blob, whose last token is
// evaluated again (on CPU a decode step costs more than the copy).
func BenchmarkStatePut(b *testing.B) {
	be, toks, logits := benchBackend(b)
	state := stateOf(b, be, 0, 8<<20)
	withLogits := slices.Clone(state)
	for _, f := range logits {
		withLogits = binary.LittleEndian.AppendUint32(withLogits, math.Float32bits(f))
	}
	run := func(name string, blob []byte, r func([]byte) io.Reader) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(state)))
			for b.Loop() {
				if _, err := be.StatePut(context.Background(), 1, toks, r(blob), int64(len(blob))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	reader := func(p []byte) io.Reader { return bytes.NewReader(p) }
	run("logits", withLogits, reader)
	mapped := mmapCopy(b, withLogits)
	ring := func() *fakeRing { return &fakeRing{src: mapped, all: mapped, chunk: 2 << 20, lend: true} }
	// Hidden behind a plain io.Reader, the ring is read as any other reader.
	run("ring/in_place=false", mapped, func([]byte) io.Reader { return struct{ io.Reader }{ring()} })
	run("ring/in_place=true", mapped, func([]byte) io.Reader { return ring() })
	run("reeval", state, reader)
}

// BenchmarkReferenceGetData is llama.cpp's llama_state_seq_get_data into a
// fresh buffer, for comparison.
func BenchmarkReferenceGetData(b *testing.B) {
	be, _, _ := benchBackend(b)
	b.SetBytes(slotInfo(b, be, 0).StateSize)
	for b.Loop() {
		reference(b, be, 0)
	}
}

// TestRestoreIntoFullCache: a state that fills the KV cache's last free
// cells leaves none for the scratch re-evaluation; the last token is then
// re-evaluated in place, giving the same next-token distribution, within
// StatePut (restore_logits=eager) or by the first decode (lazy); on CPU with
// the reference kernels, as the prefill's batch and the re-evaluation differ
// in size.
func TestRestoreIntoFullCache(t *testing.T) {
	for _, mode := range []string{"lazy", "eager"} {
		t.Run(mode, func(t *testing.T) { testRestoreIntoFullCache(t, mode) })
	}
}

func testRestoreIntoFullCache(t *testing.T, mode string) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptNCtx: "256", llamaopt.OptRestoreLogits: mode})
	referenceKernels(t, b)
	toks := make([]int32, 100)
	for i := range toks {
		toks[i] = int32(5 + (i*37)%400)
	}
	want := prefillTokens(t, b, 0, toks).Logits
	state := stateOf(t, b, 0, 1<<20)
	prefillTokens(t, b, 1, make([]int32, 156)) // 100 + 156 = every cell
	if err := b.ClearSlot(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StatePut(context.Background(), 0, toks, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if mode == "lazy" {
		if _, l, _ := b.eng.Load().cells.Slots[0].Snapshot(); l != nil {
			t.Fatal("restore_logits=lazy: StatePut computed the logits")
		}
		// A decode of no tokens computes them and emits nothing.
		if got, res := decode(t, b, 0, 0, iface.SamplerParams{}); len(got) != 0 || res.NPast != 100 {
			t.Fatalf("decode of 0 tokens: %v %+v", got, res)
		}
	}
	_, got, _ := b.eng.Load().cells.Slots[0].Snapshot()
	if argmax(got) != argmax(want) {
		t.Fatalf("arg-max %d after an in-place re-evaluation, %d after the prefill", argmax(got), argmax(want))
	}
	// A one-token batch against the prefill's batch of 100: the same maths;
	// on CPU the same (reference) kernels, on a GPU other ones (~2e-3 apart).
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-2 {
			t.Fatalf("logit %d: %v, want %v", i, got[i], want[i])
		}
	}
	if si := slotInfo(t, b, 0); si.NPast != 100 || si.StateSize != int64(len(state)) {
		t.Fatalf("slot %+v", si)
	}
}

// TestStreamedRestore: restores through the restore ring stream the K/V
// runs at or over its threshold, piece by piece as the bytes arrive; the
// restored slot re-saves to the same bytes and decodes alike,
// into a fragmented cache (llama.cpp's per-row scatter path) as into an
// empty one, with transposed V too; a state cut inside a block fails cleanly
// and leaves the slot empty.
func TestStreamedRestore(t *testing.T) {
	t.Run("threshold", testStreamThreshold)
	for _, flash := range []string{"on", "off"} {
		t.Run("flash="+flash, func(t *testing.T) {
			for _, fragmented := range []bool{false, true} {
				testStreamedRestore(t, flash, fragmented)
			}
		})
	}
}

// testStreamThreshold: only blocks of the threshold or more are streamed.
func testStreamThreshold(t *testing.T) {
	src := load(t, tiny(t), 1, nil)
	prefill(t, src, 0, story)
	si := slotInfo(t, src, 0)
	state := stateOf(t, src, 0, 64<<10)
	for _, threshold := range []int64{1 << 20, 64} {
		streamBlocks(t, 1<<20, threshold)
		b := load(t, tiny(t), 2, nil)
		e := b.eng.Load()
		blocks0, _ := e.ctx.Streamed()
		if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
			t.Fatal(err)
		}
		if blocks, _ := e.ctx.Streamed(); (blocks > blocks0) != (threshold == 64) {
			t.Fatalf("a %d-byte threshold streamed %d blocks", threshold, blocks-blocks0)
		}
		if again := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(again), normSeq(state)) {
			t.Fatalf("a %d-byte threshold: the restored state re-saves differently", threshold)
		}
	}
}

func testStreamedRestore(t *testing.T, flash string, fragmented bool) {
	opts := map[string]string{llamaopt.OptFlashAttn: flash}
	src := load(t, tiny(t), 2, opts)
	prefill(t, src, 0, story)
	si := slotInfo(t, src, 0)
	state := stateOf(t, src, 0, 64<<10)
	want, wantRes := decode(t, src, 0, 12, iface.SamplerParams{})

	streamBlocks(t, 64, 64)
	var b *Backend
	if fragmented {
		b = fragmentedTarget(t, opts, si.NPast+1)
	} else {
		b = load(t, tiny(t), 3, opts)
	}
	e := b.eng.Load()
	blocks0, runs0 := e.ctx.Streamed()
	// One byte a read: pieces never line up with blocks.
	n, err := b.StatePut(context.Background(), 1, si.Tokens, iotest.OneByteReader(bytes.NewReader(state)), int64(len(state)))
	if err != nil || n != int64(len(state)) {
		t.Fatalf("fragmented %v: StatePut = %d, %v", fragmented, n, err)
	}
	blocks, runs := e.ctx.Streamed()
	if blocks == blocks0 {
		t.Fatalf("fragmented %v: no block was streamed", fragmented)
	}
	if fragmented && runs-runs0 <= blocks-blocks0 {
		t.Fatalf("the restore into alternating free cells was not scattered: %d blocks in %d runs", blocks-blocks0, runs-runs0)
	}
	if again := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(again), normSeq(state)) {
		t.Fatalf("fragmented %v: the restored state re-saves differently", fragmented)
	}
	if toks, res := decode(t, b, 1, 12, iface.SamplerParams{}); !slices.Equal(toks, want) || !reflect.DeepEqual(res, wantRes) {
		t.Fatalf("fragmented %v: decoded %v, want %v", fragmented, toks, want)
	}
	// Cut in the middle of the last layer's block: a bad request, the slot
	// empty, the engine still restoring.
	cut := state[:len(state)-40]
	if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(cut), int64(len(cut))); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("fragmented %v: a cut state: %v", fragmented, err)
	}
	if got := slotInfo(t, b, 1); got.NPast != 0 {
		t.Fatalf("fragmented %v: a failed restore left %d positions", fragmented, got.NPast)
	}
	if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatalf("fragmented %v: restoring after a failure: %v", fragmented, err)
	}
}

// fragmentedTarget is a backend (n_ctx 256) whose free cells, at least need
// of them, alternate with slot 0's: slots 0 and 1 take turns a token at a
// time, a prefill of slot 2 fills the rest, slot 1 goes. llama.cpp then
// scatters a restore into slot 1 over them, a tensor set a row.
func fragmentedTarget(t *testing.T, opts map[string]string, need int) *Backend {
	small := map[string]string{llamaopt.OptNCtx: "256"}
	for k, v := range opts {
		small[k] = v
	}
	b := load(t, tiny(t), 3, small)
	prefillTokens(t, b, 0, []int32{7})
	prefillTokens(t, b, 1, []int32{9})
	// Hot, seeded sampling a token at a time: an end of sequence is drawn
	// rarely, and not twice in a row.
	for i := range 200 {
		decode(t, b, i%2, 1, iface.SamplerParams{Temperature: 2, Seed: uint64(i + 1)})
	}
	used := slotInfo(t, b, 0).NPast + slotInfo(t, b, 1).NPast
	if holes := slotInfo(t, b, 1).NPast; holes < need {
		t.Fatalf("slot 1 took %d cells, fewer than the %d the restore needs", holes, need)
	}
	if rest := 256 - used; rest > 0 {
		prefillTokens(t, b, 2, make([]int32, rest))
	}
	if err := b.ClearSlot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRestoreInPlace: a restore from a RegionReader (the shm plane's ring)
// takes its buffers in place, streamed or not, whatever the buffers' size
// against the state's fields and blocks, with each buffer overwritten once
// freed; it restores exactly what a plain reader does. A cut state fails as
// a bad request and leaves the slot empty. A ring over maxInPlaceRegion is
// read into the restore ring instead.
func TestRestoreInPlace(t *testing.T) {
	for _, flash := range []string{"on", "off"} {
		for _, mode := range restoreModes {
			t.Run("flash="+flash+"/"+mode.name, func(t *testing.T) {
				streamBlocks(t, mode.stream, ringStreamMin)
				testRestoreInPlace(t, flash, mode.stream == 64)
			})
		}
	}
	src := load(t, tiny(t), 1, nil)
	prefill(t, src, 0, story)
	state := stateOf(t, src, 0, 64<<10)
	toks := slotInfo(t, src, 0).Tokens
	b := load(t, tiny(t), 2, nil)
	ring := newFakeRing(t, state, maxInPlaceRegion/4+4<<10, 4)
	if _, err := b.StatePut(context.Background(), 1, toks, ring, int64(len(state))); err != nil || ring.nexts != 0 {
		t.Fatalf("a %d-byte ring: %v (pieces taken in place: %d)", len(ring.mem), err, ring.nexts)
	}
	if again := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(again), normSeq(state)) {
		t.Fatal("a large ring: the restored state re-saves differently")
	}
}

func testRestoreInPlace(t *testing.T, flash string, streamed bool) {
	src := load(t, tiny(t), 1, map[string]string{llamaopt.OptFlashAttn: flash})
	prefill(t, src, 0, story)
	si := slotInfo(t, src, 0)
	state := stateOf(t, src, 0, 64<<10)
	want, _ := decode(t, src, 0, 12, iface.SamplerParams{})
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptFlashAttn: flash})
	e := b.eng.Load()
	for _, chunk := range []int{4 << 10, 7777, 64 << 10} {
		name := fmt.Sprintf("chunk %d", chunk)
		blocks0, _ := e.ctx.Streamed()
		ring := newFakeRing(t, state, chunk, 4)
		n, err := b.StatePut(context.Background(), 1, si.Tokens, ring, int64(len(state)))
		if err != nil || n != int64(len(state)) || ring.nexts == 0 {
			t.Fatalf("%s: StatePut = %d, %v (pieces taken in place: %d)", name, n, err, ring.nexts)
		}
		if blocks, _ := e.ctx.Streamed(); (blocks > blocks0) != streamed {
			t.Fatalf("%s: %d blocks streamed", name, blocks-blocks0)
		}
		if again := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(again), normSeq(state)) {
			t.Fatalf("%s: the restored state re-saves differently", name)
		}
		if toks, _ := decode(t, b, 1, 12, iface.SamplerParams{}); !slices.Equal(toks, want) {
			t.Fatalf("%s: decoded %v, want %v", name, toks, want)
		}
		cut := newFakeRing(t, state[:len(state)-40], chunk, 4)
		if _, err := b.StatePut(context.Background(), 1, si.Tokens, cut, int64(len(state)-40)); !errors.Is(err, iface.ErrBadRequest) {
			t.Fatalf("%s: a cut state: %v", name, err)
		}
		if got := slotInfo(t, b, 1); got.NPast != 0 {
			t.Fatalf("%s: a failed restore left %d positions", name, got.NPast)
		}
	}
}

// argmax is the index of the largest logit (the first of equals).
func argmax(logits []float32) int {
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	return best
}

// mmapCopy copies b into anonymous memory outside Go's heap (C keeps
// pointers into what a restore's source lends), unmapped when t ends.
func mmapCopy(t testing.TB, b []byte) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, max(len(b), 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	copy(m, b)
	return m[:len(b)]
}
