package mock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// referenceState builds a state the slow, obvious way from the format's
// description in state.go, to pin the format independently of stateGen.
func referenceState(tokens []int32, seqID int32, kvBytes int) []byte {
	le := binary.LittleEndian
	c := uint64(checksumSeed)
	fold := func(v uint64) { c = bits.RotateLeft64(c, 5) ^ v }
	var out []byte
	for _, v := range []uint32{0x4B434F4D, 2, uint32(seqID), uint32(len(tokens)), uint32(kvBytes)} {
		out = le.AppendUint32(out, v)
		fold(uint64(v))
	}
	for i, t := range tokens {
		out = le.AppendUint32(le.AppendUint32(out, uint32(i)), uint32(t))
		fold(uint64(i))
		fold(uint64(uint32(t)))
	}
	// The pattern's word k, from the format's description.
	patWord := func(k int) uint64 {
		s := mix64(patternSeed) + uint64(k)*golden
		return s ^ s>>29
	}
	for i := range tokens {
		key := mix64(seqHash(tokens[:i+1]) ^ kvSalt)
		out = le.AppendUint64(out, key)
		fold(key)
		start := int(key >> 51) // the window's first pattern word
		for k := range kvBytes/8 - 1 {
			out = le.AppendUint64(out, patWord(start+k))
		}
	}
	return le.AppendUint64(out, mix64(c))
}

// pieceWriter records how StateGet cut the stream.
type pieceWriter struct {
	h      hash.Hash
	pieces []int
	buf    *bytes.Buffer // nil: do not keep the bytes
}

func newPieceWriter(keep bool) *pieceWriter {
	w := &pieceWriter{h: sha256.New()}
	if keep {
		w.buf = new(bytes.Buffer)
	}
	return w
}

func (w *pieceWriter) Write(p []byte) (int, error) {
	w.pieces = append(w.pieces, len(p))
	w.h.Write(p)
	if w.buf != nil {
		w.buf.Write(p)
	}
	return len(p), nil
}

func (w *pieceWriter) digest() string {
	return fmt.Sprintf("%x", w.h.Sum(nil))
}

func stateOf(t testing.TB, b *Backend, slot, chunk int) []byte {
	t.Helper()
	w := newPieceWriter(true)
	n, err := b.StateGet(context.Background(), slot, chunk, w)
	if err != nil {
		t.Fatalf("StateGet: %v", err)
	}
	if n != int64(w.buf.Len()) {
		t.Fatalf("StateGet returned %d, wrote %d", n, w.buf.Len())
	}
	return w.buf.Bytes()
}

func TestStateFormat(t *testing.T) {
	b := newLoaded(t, 3, map[string]string{OptKVBytesPerToken: "24"})
	ctx := context.Background()
	// An empty slot has a header and a checksum only.
	if got, want := stateOf(t, b, 2, 1<<16), referenceState(nil, 2, 24); !bytes.Equal(got, want) || len(got) != minStateSize {
		t.Fatalf("empty state %x, want %x", got, want)
	}
	prefillTokens(t, b, 2, []int32{'a', EOS, 0, 255})
	decode(t, b, 2, 5, iface.SamplerParams{})
	si := slotInfo(t, b, 2)
	got := stateOf(t, b, 2, 1<<16)
	if want := referenceState(si.Tokens, 2, 24); !bytes.Equal(got, want) {
		t.Fatalf("state\n%x\nwant\n%x", got, want)
	}
	if string(got[:4]) != "MOCK" {
		t.Fatalf("magic bytes %q", got[:4])
	}
	if int64(len(got)) != si.StateSize {
		t.Fatalf("%d bytes, StateSize %d", len(got), si.StateSize)
	}
	if _, err := b.StateGet(ctx, 2, 0, io.Discard); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("chunk 0: %v", err)
	}
}

func TestStateGetChunking(t *testing.T) {
	for _, tc := range []struct {
		kvBytes, nTokens int
		chunks           []int
	}{
		{4096, 700, []int{64 << 10, 2 << 20, 100_003, 4096, 4100, 8 << 20}},
		{16, 6, []int{1, 3, 7, 8, 9, 13, 20, 21, 64, 1000}},
	} {
		b := newLoaded(t, 1, map[string]string{OptKVBytesPerToken: fmt.Sprint(tc.kvBytes)})
		toks := make([]int32, tc.nTokens)
		for i := range toks {
			toks[i] = int32(i*31) % 257
		}
		prefillTokens(t, b, 0, toks)
		size := slotInfo(t, b, 0).StateSize
		if size != StateSize(tc.kvBytes, tc.nTokens) {
			t.Fatalf("StateSize %d", size)
		}
		digest := ""
		for _, chunk := range tc.chunks {
			w := newPieceWriter(false)
			n, err := b.StateGet(context.Background(), 0, chunk, w)
			if err != nil || n != size {
				t.Fatalf("chunk %d: wrote %d of %d: %v", chunk, n, size, err)
			}
			var sum int64
			for k, p := range w.pieces {
				sum += int64(p)
				last := k == len(w.pieces)-1
				if p > chunk || p == 0 || (!last && p != chunk) {
					t.Fatalf("chunk %d: piece %d of %d is %d bytes", chunk, k, len(w.pieces), p)
				}
			}
			if sum != size {
				t.Fatalf("chunk %d: pieces sum to %d, want %d", chunk, sum, size)
			}
			if d := w.digest(); digest == "" {
				digest = d
			} else if d != digest {
				t.Fatalf("chunk %d: bytes differ from chunk %d's", chunk, tc.chunks[0])
			}
		}
	}
}

// StateGet streams: its memory does not grow with the state.
func TestStateGetMemory(t *testing.T) {
	b := newLoaded(t, 2, map[string]string{OptKVBytesPerToken: "65536"})
	toks := make([]int32, 256) // a 16 MiB state
	prefillTokens(t, b, 0, toks)
	const chunk = 64 << 10
	ctx := context.Background()
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := b.StateGet(ctx, 0, chunk, discard{}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 8 {
		t.Fatalf("StateGet made %v allocations", allocs)
	}
	state := stateReader(toks, 0, 65536)
	size := state.size()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := b.StateGet(ctx, 0, chunk, discard{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StatePut(ctx, 1, toks, state, size); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4*putChunk {
		t.Fatalf("StateGet+StatePut of %d-byte states allocated %d bytes", size, alloc)
	}
}

func stateReader(tokens []int32, seqID int32, kvBytes int) *stateGen {
	return newStateGen(tokens, seqID, kvBytes, newPattern(kvBytes))
}

func TestStateRoundTrip(t *testing.T) {
	opts := map[string]string{OptKVBytesPerToken: "256", OptNCtx: "4096"}
	prompt := Tokenize("The state survives a round trip.")
	const cont = 40

	// The reference: decode without any save/restore.
	ref := newLoaded(t, 1, opts)
	prefillTokens(t, ref, 0, prompt)
	decode(t, ref, 0, 10, iface.SamplerParams{})
	want, wantRes := decode(t, ref, 0, cont, iface.SamplerParams{})

	a := newLoaded(t, 3, opts)
	prefillTokens(t, a, 0, prompt)
	decode(t, a, 0, 10, iface.SamplerParams{})
	si := slotInfo(t, a, 0)
	state := stateOf(t, a, 0, 100_003)

	other := newLoaded(t, 2, opts)
	for _, tc := range []struct {
		name  string
		b     *Backend
		slot  int
		clear bool
	}{
		{"same slot", a, 0, true},
		{"other slot", a, 2, false},
		{"other backend", other, 1, false},
		{"over a live sequence", other, 1, false},
	} {
		if tc.clear {
			if err := tc.b.ClearSlot(context.Background(), tc.slot); err != nil {
				t.Fatal(err)
			}
		}
		n, err := tc.b.StatePut(context.Background(), tc.slot, si.Tokens, bytes.NewReader(state), int64(len(state)))
		if err != nil || n != int64(len(state)) {
			t.Fatalf("%s: StatePut = %d, %v", tc.name, n, err)
		}
		got := slotInfo(t, tc.b, tc.slot)
		if got.NPast != si.NPast || !slices.Equal(got.Tokens, si.Tokens) || got.StateSize != si.StateSize {
			t.Fatalf("%s: restored slot %+v, want %+v", tc.name, got, si)
		}
		toks, res := decode(t, tc.b, tc.slot, cont, iface.SamplerParams{})
		if !reflect.DeepEqual(toks, want) || !reflect.DeepEqual(res, wantRes) {
			t.Fatalf("%s: decoded %q (%+v), want %q (%+v)", tc.name, text(toks), res, text(want), wantRes)
		}
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

// pieceReader is an shm.ChunkReader over r, handing out pieces of odd,
// changing sizes from a buffer it overwrites on every call, as the shm ring's
// buffers are reused: a consumer that kept a piece past the next call would
// see other bytes.
type pieceReader struct {
	r    io.Reader
	buf  [70000]byte
	turn int
}

var _ shm.ChunkReader = (*pieceReader)(nil)

func (p *pieceReader) Next() ([]byte, error) {
	sizes := []int{1, 7, 13, 4099, 65537, 3, 70000}
	p.turn++
	clear(p.buf[:])
	n, err := io.ReadAtLeast(p.r, p.buf[:sizes[p.turn%len(sizes)]], 1)
	if n > 0 {
		return p.buf[:n], nil
	}
	return nil, err
}

func (p *pieceReader) Read(b []byte) (int, error) { return p.r.Read(b) }

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

// mockPutFailure is a StatePut that must fail.
type mockPutFailure struct {
	name   string
	tokens []int32
	r      func() io.Reader
	size   int64 // 0: the good state's
	msg    string
	isErr  error // also matched with errors.Is; errReaderFailed: a reader failure, not a bad request
}

var errReaderFailed = errors.New("connection reset")

// TestStatePutFailures: every malformed, truncated or mismatched state
// fails with a reason, from a plain reader and from in-place pieces alike,
// leaves the slot empty and other slots untouched, and drains the reader
// unless the reader itself failed.
func TestStatePutFailures(t *testing.T) {
	const kv = 64
	b := newLoaded(t, 3, map[string]string{OptKVBytesPerToken: fmt.Sprint(kv), OptNCtx: "100"})
	toks := Tokenize("forty-odd tokens of prompt for the state tests")
	prefillTokens(t, b, 0, toks)
	state := stateOf(t, b, 0, 1<<16)
	neighbour := prefillTokens(t, b, 2, []int32{5, 6, 7}).Slot
	for _, tc := range mockPutFailures(t, kv, toks, state) {
		for _, chunked := range []bool{false, true} {
			// Each failure must leave the target slot empty, whatever it held.
			prefillTokens(t, b, 0, toks)
			size := tc.size
			if size == 0 {
				size = int64(len(state))
			}
			er := &eofReader{r: tc.r()}
			var r io.Reader = er
			if chunked {
				r = &pieceReader{r: er} // the shm plane's in-place pieces
			}
			_, err := b.StatePut(context.Background(), 0, tc.tokens, r, size)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("%s (chunked %v): err = %v, want one mentioning %q", tc.name, chunked, err, tc.msg)
				continue
			}
			checkMockPutFailed(t, b, tc, err, er.eof, neighbour.Tokens)
		}
	}
	kvStart := 20 + 8*len(toks)
	bad := slices.Clone(state)
	bad[kvStart+kv*7+13] ^= 0x40
	_, err := b.StatePut(context.Background(), 0, toks, bytes.NewReader(bad), int64(len(state)))
	t.Logf("example: %v", err)
}

// mockPutFailures are the failing restores of state, a state of toks with
// kv bytes per token.
func mockPutFailures(t *testing.T, kv int, toks []int32, state []byte) []mockPutFailure {
	n := len(toks)
	kvStart := 20 + 8*n
	flip := func(off int) []byte {
		s := slices.Clone(state)
		s[off] ^= 0x40
		return s
	}
	otherTokens := slices.Clone(toks)
	otherTokens[9]++
	wide := newLoaded(t, 1, map[string]string{OptKVBytesPerToken: "128"})
	prefillTokens(t, wide, 0, toks)
	wideState := stateOf(t, wide, 0, 1<<16)
	rd := func(b []byte) func() io.Reader { return func() io.Reader { return bytes.NewReader(b) } }
	ea := func(b []byte, n int) func() io.Reader {
		return func() io.Reader { return &errAfter{bytes.NewReader(b), n, errReaderFailed} }
	}
	return []mockPutFailure{
		{"magic", toks, rd(flip(1)), 0, "magic", nil},
		{"version", toks, rd(flip(4)), 0, "format version", nil},
		{"seq_id", toks, rd(flip(9)), 0, "checksum", nil},
		{"n_cells", toks, rd(flip(12)), 0, "n_cells", nil},
		{"kv_bytes_per_token header", toks, rd(flip(16)), 0, "kv_bytes_per_token 0, this backend uses 64", nil},
		{"cell pos", toks, rd(flip(20 + 8*3)), 0, "cell 3: pos", nil},
		{"cell token", toks, rd(flip(20 + 8*5 + 4)), 0, "cell 5: token", nil},
		{"kv first byte", toks, rd(flip(kvStart)), 0, "cell 0: KV byte 0 differs", nil},
		{"kv", toks, rd(flip(kvStart + kv*7 + 13)), 0, "cell 7: KV byte 13 differs", nil},
		{"kv last byte", toks, rd(flip(kvStart + kv*n - 1)), 0, fmt.Sprintf("cell %d: KV byte %d", n-1, kv-1), nil},
		{"checksum", toks, rd(flip(len(state) - 1)), 0, "checksum", nil},
		{"truncated in header", toks, rd(state[:10]), 0, "truncated at offset 10", io.ErrUnexpectedEOF},
		{"truncated in cells", toks, rd(state[:30]), 0, "truncated at offset 30", io.ErrUnexpectedEOF},
		{"truncated in kv", toks, rd(state[:len(state)-100]), 0, "truncated", io.ErrUnexpectedEOF},
		{"truncated checksum", toks, rd(state[:len(state)-1]), 0, "truncated", io.ErrUnexpectedEOF},
		{"empty", toks, rd(nil), 0, "truncated at offset 0", io.ErrUnexpectedEOF},
		{"size below state", toks, rd(state), int64(len(state) - 1), "needs", nil},
		{"size below minimum", toks, rd(state), 27, "below the smallest state", nil},
		{"tokens mismatch", otherTokens, rd(state), 0, "cell 9: token", nil},
		{"fewer tokens", toks[:n-1], rd(state), 0, "n_cells", nil},
		{"token out of range", append(slices.Clone(toks[:n-1]), 300), rd(state), 0, "outside the vocabulary", nil},
		{"tokens over n_ctx", make([]int32, 101), rd(state), 0, "exceed n_ctx", nil},
		{"wrong kv_bytes_per_token", toks, rd(wideState), int64(len(wideState)), "kv_bytes_per_token 128, this backend uses 64", nil},
		{"reader error", toks, ea(state, 1000), 0, "connection reset", errReaderFailed},
		{"reader error in header", toks, ea(state, 3), 0, "offset 3", errReaderFailed},
	}
}

// checkMockPutFailed checks what a failed restore of slot 0 left: the
// error's class, the reader drained unless it failed, the slot empty, slot
// 2 still holding neighbour.
func checkMockPutFailed(t *testing.T, b *Backend, tc mockPutFailure, err error, drained bool, neighbour []int32) {
	t.Helper()
	if tc.isErr != errReaderFailed && !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("%s: %v is not ErrBadRequest", tc.name, err)
	}
	if tc.isErr != nil && !errors.Is(err, tc.isErr) {
		t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.isErr)
	}
	if tc.isErr == errReaderFailed {
		if errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: a reader error classed as a bad request", tc.name)
		}
	} else if !drained {
		t.Errorf("%s: the reader was not drained", tc.name)
	}
	if si := slotInfo(t, b, 0); si.NPast != 0 || len(si.Tokens) != 0 || si.StateSize != minStateSize {
		t.Errorf("%s: slot not empty after a failed restore: %+v", tc.name, si)
	}
	if si := slotInfo(t, b, 2); !slices.Equal(si.Tokens, neighbour) {
		t.Errorf("%s: another slot changed", tc.name)
	}
	if _, err := b.Decode(context.Background(), iface.DecodeRequest{NPredict: 1}, nil); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("%s: decode on the failed slot: %v", tc.name, err)
	}
}

func TestStatePutTrailing(t *testing.T) {
	b := newLoaded(t, 2, map[string]string{OptKVBytesPerToken: "32"})
	toks := Tokenize("trailing bytes")
	res := prefillTokens(t, b, 0, toks)
	state := stateOf(t, b, 0, 1<<16)
	logitBytes := make([]byte, 0, NVocab*4)
	for _, l := range res.Logits {
		logitBytes = binary.LittleEndian.AppendUint32(logitBytes, uint32(int32(l*1000)))
	}
	for name, trailing := range map[string][]byte{
		"logits": logitBytes,
		"odd":    []byte("thirteen byte"),
		"large":  make([]byte, 3*putChunk+5),
	} {
		blob := append(slices.Clone(state), trailing...)
		for _, chunked := range []bool{false, true} {
			r := &eofReader{r: bytes.NewReader(blob)}
			var src io.Reader = r
			if chunked {
				src = &pieceReader{r: r}
			}
			n, err := b.StatePut(context.Background(), 1, toks, src, int64(len(blob)))
			if err != nil || n != int64(len(state)) || !r.eof {
				t.Fatalf("%s (chunked %v): StatePut = %d, %v (drained %v)", name, chunked, n, err, r.eof)
			}
		}
		if si := slotInfo(t, b, 1); !slices.Equal(si.Tokens, toks) {
			t.Fatalf("%s: slot holds %v", name, si.Tokens)
		}
	}
	// A bad slot still drains the reader.
	r := &eofReader{r: bytes.NewReader(state)}
	if _, err := b.StatePut(context.Background(), 5, toks, r, int64(len(state))); !errors.Is(err, iface.ErrNoSlot) || !r.eof {
		t.Fatalf("bad slot: %v (drained %v)", err, r.eof)
	}
}

func TestStateGetWriterErrorsAndCancel(t *testing.T) {
	b := newLoaded(t, 1, map[string]string{OptKVBytesPerToken: "4096"})
	prefillTokens(t, b, 0, make([]int32, 100))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := b.StateGet(ctx, 0, 1<<16, discard{}); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("cancelled StateGet: %d, %v", n, err)
	}
	boom := errors.New("broken pipe")
	w := &failWriter{after: 3, err: boom}
	if n, err := b.StateGet(context.Background(), 0, 1000, w); !errors.Is(err, boom) || n != 3000 {
		t.Fatalf("failing writer: %d, %v", n, err)
	}
	short := &failWriter{after: 1, short: true}
	if _, err := b.StateGet(context.Background(), 0, 1000, short); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short writer: %v", err)
	}
	// The slot is still usable afterwards.
	if _, err := b.StateGet(context.Background(), 0, 1000, discard{}); err != nil {
		t.Fatal(err)
	}
	// A cancelled StatePut stops reading and leaves the slot empty.
	state := stateOf(t, b, 0, 1<<16)
	n, err := b.StatePut(ctx, 0, make([]int32, 100), bytes.NewReader(state), int64(len(state)))
	if !errors.Is(err, context.Canceled) || n != 0 || slotInfo(t, b, 0).NPast != 0 {
		t.Fatalf("cancelled StatePut: %d, %v", n, err)
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

// A state the size of a real one: 9,200 tokens of 32 layers × 8 KV heads ×
// 128 × f16 × (K+V) = 131072 bytes per token, 1.2 GB.
const benchKV, benchTokens = 131072, 9200

func benchBackend(b *testing.B) (*Backend, []int32) {
	be := newLoaded(b, 2, map[string]string{OptKVBytesPerToken: fmt.Sprint(benchKV), OptNCtx: "16384"})
	toks := make([]int32, benchTokens)
	for i := range toks {
		toks[i] = int32(i % 256)
	}
	prefillTokens(b, be, 0, toks)
	return be, toks
}

func reportGBs(b *testing.B, size int64) {
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func BenchmarkStateGet(b *testing.B) {
	be, _ := benchBackend(b)
	size := slotInfo(b, be, 0).StateSize
	for _, chunk := range []int{256 << 10, 2 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := be.StateGet(context.Background(), 0, chunk, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
			reportGBs(b, size)
		})
	}
}

// BenchmarkStatePut/generated feeds the 1.2 GB state straight from a
// generator, so it measures generation plus verification (about twice the
// work StatePut itself does); /memory restores a 134 MB state held in memory,
// which isolates StatePut's own cost.
func BenchmarkStatePut(b *testing.B) {
	be, toks := benchBackend(b)
	b.Run("generated", func(b *testing.B) {
		size := StateSize(benchKV, len(toks))
		b.SetBytes(size)
		for b.Loop() {
			if _, err := be.StatePut(context.Background(), 1, toks, stateReader(toks, 0, benchKV), size); err != nil {
				b.Fatal(err)
			}
		}
		reportGBs(b, size)
	})
	b.Run("memory", func(b *testing.B) {
		small := toks[:1024]
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, stateReader(small, 0, benchKV)); err != nil {
			b.Fatal(err)
		}
		state := buf.Bytes()
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			if _, err := be.StatePut(context.Background(), 1, small, bytes.NewReader(state), int64(len(state))); err != nil {
				b.Fatal(err)
			}
		}
		reportGBs(b, int64(len(state)))
	})
}

// Keep the race-enabled test run quick: one small timed round trip.
func TestStateThroughputSmoke(t *testing.T) {
	b := newLoaded(t, 2, map[string]string{OptKVBytesPerToken: "8192"})
	toks := make([]int32, 256)
	prefillTokens(t, b, 0, toks)
	start := time.Now()
	state := stateOf(t, b, 0, 2<<20)
	if _, err := b.StatePut(context.Background(), 1, toks, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d-byte state out and back in %v", len(state), time.Since(start))
}
