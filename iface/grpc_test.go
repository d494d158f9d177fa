package iface

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const MiB = 1 << 20

// wait fails the test if ch yields nothing within a few seconds.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	info := BackendInfo{
		Name:          "fake",
		Version:       "1.2.3",
		Model:         ModelIdentity{Alias: "qwen", Hash: "ab12", Path: "/models/q.gguf"},
		NSlots:        4,
		NVocab:        151936,
		NCtx:          32768,
		Capabilities:  []string{"quant_swap", "experts"},
		NCtxSlot:      8192,
		KVUnified:     false,
		Quants:        []string{"base", "q8_0", "Q6_K/experts"},
		ActiveQuant:   "base+q8_0",
		ExpertMode:    "combined",
		PeerDevice:    "CUDA1",
		PeerReachable: true,
		LayerSplit:    "0-23:CUDA0,24-47:CUDA1",
		SplitMode:     "layer",
		PromptDecode:  true,
		MaxTokenBytes: 7,
		StateLayout:   `{"arch":"llama","kv_type":"q8_0","n_layer":48}`,
		ChatTemplate:  "{{ messages }}", BOSToken: "<s>", EOSToken: "</s>",
		PromptCache: &PromptCacheStats{BudgetBytes: -1, Bytes: 5 << 30, Entries: 3, Tokens: 40000, Hits: 7, Misses: 2,
			Saves: 9, SaveBytes: 1 << 33, SaveSeconds: 0.25, Restores: 6, RestoreBytes: 3 << 30, RestoreSeconds: 0.125,
			Evictions: 4, Skipped: 1, SaveFailures: 1, RestoreFailures: 2},
		Special: &SpecialTokens{BOS: 1, EOS: 2, SEP: NoToken, FIMPre: 151659, FIMSuf: 151661, FIMMid: 151660, FIMPad: 151662,
			FIMRep: 151663, FIMSep: 151664, AddBOS: true, AddSEP: true},
		RerankTemplate: "q: {query}\nd: {document}", NBatch: 2048, Pooling: PoolingRank,
		Checkpoints: &CheckpointStats{MaxPerSlot: 32, MinStep: 8192, BudgetBytes: -1, Held: 3, Bytes: 189 << 20, Taken: 11,
			Restored: 4, Dropped: 8, TokensSaved: 123456, OverBudget: 1, Slots: []SlotCheckpoints{{2, 126 << 20}, {0, 0}, {1, 63 << 20}}},
		Speculative: &SpeculativeStats{Rule: "measured", Drafting: true, PlainRate: 465.5, DraftRate: 731.25, Stops: 3, Probes: 17,
			PlainSteps: 1000, DraftSteps: 250, PlainSeconds: 2.5, DraftSeconds: 0.75, CatchUpSeconds: 0.125, SaveSeconds: 0.0625,
			VerifySeconds: 0.875, ReplaySeconds: 0.03125},
	}
	slotInfo := SlotInfo{Slot: 3, NPast: 5, Tokens: []int32{1, -2, math.MaxInt32, 4, 5}, StateSize: 1 << 40}
	swapped := SwapResult{Swapped: 144, Bytes: 5 << 30, Duration: 1234567 * time.Microsecond, KVPreserved: true}

	var (
		gotLoad    LoadRequest
		gotSlot    int
		gotCleared int
		gotPrefill PrefillRequest
		gotMode    string
		gotCkpt    Checkpoint
		gotQuant   [2]string
		gotEmbed   EmbedRequest
	)
	f := &fakeBackend{
		load: func(_ context.Context, req LoadRequest) (BackendInfo, error) {
			gotLoad = req
			return info, nil
		},
		info: func(context.Context) (BackendInfo, error) { return info, nil },
		slot: func(_ context.Context, slot int) (SlotInfo, error) {
			gotSlot = slot
			si := slotInfo
			si.Slot = slot
			return si, nil
		},
		clearSlot: func(_ context.Context, slot int) error {
			gotCleared = slot
			return nil
		},
		prefill: func(_ context.Context, req PrefillRequest) (PrefillResult, error) {
			gotPrefill = req
			return PrefillResult{
				Slot:          slotInfo,
				Logits:        []float32{-1.5, 0, float32(math.Inf(1)), math.MaxFloat32, math.SmallestNonzeroFloat32},
				ModelFallback: true,
				Reused:        3,
			}, nil
		},
		tokenize: func(_ context.Context, req PrefillRequest) (Prompt, error) {
			gotPrefill = req
			return Prompt{Tokens: []int32{5, 0, math.MaxInt32}, OpensThinking: true, Text: "a\xe2", Pieces: []string{"a", "", "\xe2"}}, nil
		},
		setExpertMode: func(_ context.Context, mode string) (string, error) {
			gotMode = mode
			return "solo", nil
		},
		swapQuant: func(_ context.Context, key, pattern string) (SwapResult, error) {
			gotQuant = [2]string{key, pattern}
			return swapped, nil
		},
		slotCkpt: func(_ context.Context, slot int) (*Checkpoint, error) {
			if slot == 1 {
				return nil, nil
			}
			return &Checkpoint{PosMin: 3, PosMax: 9, NTokens: 10, Target: bytes.Repeat([]byte{7}, 3<<20), Draft: []byte{1}}, nil
		},
		putCkpt: func(_ context.Context, slot int, c Checkpoint) (bool, string, error) {
			gotCkpt = c
			if slot == 1 {
				return false, "not needed", nil
			}
			if c.NTokens > 100 {
				return false, "", fmt.Errorf("%w: too many tokens", ErrBadRequest)
			}
			return true, "", nil
		},
		embed: func(_ context.Context, req EmbedRequest) ([]Embedding, error) {
			gotEmbed = req
			if len(req.Inputs) == 3 {
				return []Embedding{
					{Vectors: [][]float32{{0.5, -1, float32(math.Inf(-1))}}, NTokens: 3},
					{Vectors: [][]float32{{1, 2}, {3, 4}, {5, 6}}, NTokens: 3},
					{Vectors: [][]float32{}, NTokens: 1},
				}, nil
			}
			return []Embedding{{Vectors: [][]float32{{1, 2}, {3}}}}, nil // ragged: refused
		},
	}
	b := TestBackend(t, f)

	t.Run("Load", func(t *testing.T) {
		req := LoadRequest{Model: "/models/q.gguf", NSlots: 4, Options: map[string]string{"n_gpu_layers": "99", "empty": ""}}
		got, err := b.Load(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(gotLoad, req) {
			t.Errorf("plugin got %+v, want %+v", gotLoad, req)
		}
		if !reflect.DeepEqual(got, info) {
			t.Errorf("host got %+v, want %+v", got, info)
		}
	})
	t.Run("Info", func(t *testing.T) {
		got, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, info) {
			t.Errorf("host got %+v, want %+v", got, info)
		}
	})
	t.Run("Slot", func(t *testing.T) {
		// A slot beyond int32 proves no narrowing on the wire.
		for _, slot := range []int{0, 3, 1 << 40, -1} {
			got, err := b.Slot(ctx, slot)
			if err != nil {
				t.Fatal(err)
			}
			want := slotInfo
			want.Slot = slot
			if gotSlot != slot || !reflect.DeepEqual(got, want) {
				t.Errorf("slot %d: plugin got %d, host got %+v, want %+v", slot, gotSlot, got, want)
			}
		}
	})
	t.Run("ClearSlot", func(t *testing.T) {
		if err := b.ClearSlot(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if gotCleared != 2 {
			t.Errorf("plugin cleared slot %d, want 2", gotCleared)
		}
	})
	t.Run("Prefill", func(t *testing.T) {
		for _, req := range []PrefillRequest{
			{Slot: 1, Messages: []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "héllo ✓"}}, Model: "qwen"},
			{Slot: 2, Tokens: []int32{151643, 0, 7}, PromptCache: true, FromChat: true},
			{Slot: 3, Text: "<|im_start|>user\nraw ✓", PromptCache: true, SaveSequence: true},
		} {
			got, err := b.Prefill(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gotPrefill, req) {
				t.Errorf("plugin got %+v, want %+v", gotPrefill, req)
			}
			if !reflect.DeepEqual(got.Slot, slotInfo) || !got.ModelFallback || got.Reused != 3 || len(got.Logits) != 5 ||
				got.Logits[0] != -1.5 || !math.IsInf(float64(got.Logits[2]), 1) ||
				got.Logits[3] != math.MaxFloat32 || got.Logits[4] != math.SmallestNonzeroFloat32 {
				t.Errorf("host got %+v", got)
			}
		}
	})
	t.Run("Tokenize", func(t *testing.T) {
		req := PrefillRequest{Messages: []Message{{Role: "user", Content: "ünï"}, {Role: "assistant", ReasoningContent: "hm",
			ToolCalls: []ToolCall{{ID: "c1", Name: "f", Arguments: `{"a":1}`}}}, {Role: "tool", Content: "2", ToolCallID: "c1", Name: "f"}},
			Tools: []string{`{"type":"function"}`}, TemplateKwargs: `{"enable_thinking":false}`, Model: "m",
			Tokenize: &TokenizeOptions{ParseSpecial: true, WithPieces: true}}
		got, err := b.Tokenize(ctx, req)
		want := Prompt{Tokens: []int32{5, 0, math.MaxInt32}, OpensThinking: true, Text: "a\xe2", Pieces: []string{"a", "", "\xe2"}}
		if err != nil || !reflect.DeepEqual(gotPrefill, req) || !reflect.DeepEqual(got, want) {
			t.Errorf("plugin got %+v, host got %v %v", gotPrefill, got, err)
		}
	})
	t.Run("Embed", func(t *testing.T) {
		two := 2
		req := EmbedRequest{Inputs: [][]int32{{1, 2, math.MaxInt32}, {7, 8, 9}, {0}}, Normalize: &two}
		got, err := b.Embed(ctx, req)
		want := []Embedding{
			{Vectors: [][]float32{{0.5, -1, float32(math.Inf(-1))}}, NTokens: 3},
			{Vectors: [][]float32{{1, 2}, {3, 4}, {5, 6}}, NTokens: 3},
			{Vectors: [][]float32{}, NTokens: 1},
		}
		if err != nil || !reflect.DeepEqual(gotEmbed, req) || !reflect.DeepEqual(got, want) {
			t.Errorf("plugin got %+v, host got %v %v", gotEmbed, got, err)
		}
		// No normalisation named stays unset: the backend's default.
		req = EmbedRequest{Inputs: [][]int32{{1}}}
		if _, err := b.Embed(ctx, req); err == nil || gotEmbed.Normalize != nil {
			t.Errorf("a ragged embedding crossed the boundary (%v), or the plugin got normalize %v", err, gotEmbed.Normalize)
		}
	})
	t.Run("Checkpoints", func(t *testing.T) {
		c, err := b.SlotCheckpoint(ctx, 0)
		if err != nil || c == nil || c.PosMin != 3 || c.PosMax != 9 || c.NTokens != 10 || len(c.Target) != 3<<20 || !bytes.Equal(c.Draft, []byte{1}) {
			t.Fatalf("SlotCheckpoint: %v", err)
		}
		if none, err := b.SlotCheckpoint(ctx, 1); none != nil || err != nil {
			t.Fatalf("a slot without one: %+v %v", none, err)
		}
		if kept, why, err := b.PutCheckpoint(ctx, 0, *c); !kept || why != "" || err != nil || !reflect.DeepEqual(gotCkpt, *c) {
			t.Fatalf("PutCheckpoint: %v %q %v", kept, why, err)
		}
		if kept, why, err := b.PutCheckpoint(ctx, 1, *c); kept || why != "not needed" || err != nil {
			t.Fatalf("PutCheckpoint declined: %v %q %v", kept, why, err)
		}
		if _, _, err := b.PutCheckpoint(ctx, 0, Checkpoint{NTokens: 101}); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("a bad checkpoint: %v", err)
		}
	})
	t.Run("SetExpertMode", func(t *testing.T) {
		got, err := b.SetExpertMode(ctx, "combined")
		if err != nil {
			t.Fatal(err)
		}
		if gotMode != "combined" || got != "solo" {
			t.Errorf("plugin got %q, host got %q", gotMode, got)
		}
	})
	t.Run("SwapQuant", func(t *testing.T) {
		got, err := b.SwapQuant(ctx, "q4_k", `blk\.\d+\.ffn_.*`)
		if err != nil {
			t.Fatal(err)
		}
		if gotQuant != [2]string{"q4_k", `blk\.\d+\.ffn_.*`} || got != swapped {
			t.Errorf("plugin got %q, host got %+v", gotQuant, got)
		}
	})
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	var ret error // what every fake method returns
	f := &fakeBackend{
		load:      func(context.Context, LoadRequest) (BackendInfo, error) { return BackendInfo{}, ret },
		info:      func(context.Context) (BackendInfo, error) { return BackendInfo{}, ret },
		slot:      func(context.Context, int) (SlotInfo, error) { return SlotInfo{}, ret },
		clearSlot: func(context.Context, int) error { return ret },
		prefill:   func(context.Context, PrefillRequest) (PrefillResult, error) { return PrefillResult{}, ret },
		decode: func(context.Context, DecodeRequest, func(Token) error) (DecodeResult, error) {
			return DecodeResult{}, ret
		},
		stateGet:      func(context.Context, int, int, io.Writer) (int64, error) { return 0, ret },
		statePut:      func(context.Context, int, []int32, io.Reader, int64) (int64, error) { return 0, ret },
		setExpertMode: func(context.Context, string) (string, error) { return "", ret },
		swapQuant:     func(context.Context, string, string) (SwapResult, error) { return SwapResult{}, ret },
	}
	b := TestBackend(t, f)

	calls := map[string]func() error{
		"Load":      func() error { _, err := b.Load(ctx, LoadRequest{}); return err },
		"Info":      func() error { _, err := b.Info(ctx); return err },
		"Slot":      func() error { _, err := b.Slot(ctx, 0); return err },
		"ClearSlot": func() error { return b.ClearSlot(ctx, 0) },
		"Prefill":   func() error { _, err := b.Prefill(ctx, PrefillRequest{}); return err },
		"Decode": func() error {
			_, err := b.Decode(ctx, DecodeRequest{}, func(Token) error { return nil })
			return err
		},
		"StateGet": func() error { _, err := b.StateGet(ctx, 0, 1024, io.Discard); return err },
		"StatePut": func() error {
			_, err := b.StatePut(ctx, 0, nil, bytes.NewReader(make([]byte, 3*MiB)), 3*MiB)
			return err
		},
		"SetExpertMode": func() error { _, err := b.SetExpertMode(ctx, "solo"); return err },
		"SwapQuant":     func() error { _, err := b.SwapQuant(ctx, "k", "p"); return err },
	}

	for _, tc := range []struct {
		ret      error
		sentinel error
		text     string
		code     codes.Code
	}{
		{ErrNoSlot, ErrNoSlot, "invalid slot ID", codes.NotFound},
		{fmt.Errorf("%w: slot 7 of 4", ErrNoSlot), ErrNoSlot, "invalid slot ID: slot 7 of 4", codes.NotFound},
		{fmt.Errorf("%w: slot 2 is decoding", ErrBusy), ErrBusy, "slot busy: slot 2 is decoding", codes.Aborted},
		{fmt.Errorf("prefill: %w", ErrBadRequest), ErrBadRequest, "bad request: prefill: bad request", codes.InvalidArgument},
		{ErrBadRequest, ErrBadRequest, "bad request", codes.InvalidArgument},
		{ErrNotImplemented, ErrNotImplemented, "not implemented", codes.Unimplemented},
		{fmt.Errorf("%w: needs 9 KV cells, 2 free", ErrNoRoom), ErrNoRoom, "KV cache full: needs 9 KV cells, 2 free", codes.FailedPrecondition},
		{errors.New("CUDA error 700"), nil, "CUDA error 700", codes.Unknown},
		// A status error that is not a sentinel keeps its code; the host
		// still gets the sentinel its code stands for.
		{status.Error(codes.NotFound, "no such expert"), ErrNoSlot, "invalid slot ID: no such expert", codes.NotFound},
		{status.Error(codes.ResourceExhausted, "out of VRAM"), nil, "ResourceExhausted: out of VRAM", codes.ResourceExhausted},
		{context.Canceled, context.Canceled, "context canceled", codes.Canceled},
	} {
		ret = tc.ret
		for name, call := range calls {
			err := call()
			if err == nil {
				t.Fatalf("%s returning %v: no error", name, tc.ret)
			}
			for _, s := range []error{ErrNoSlot, ErrBusy, ErrBadRequest, ErrNotImplemented, ErrNoRoom, context.Canceled} {
				if errors.Is(err, s) != (s == tc.sentinel) {
					t.Errorf("%s returning %v: errors.Is(%v, %v) = %v", name, tc.ret, err, s, !(s == tc.sentinel))
				}
			}
			if err.Error() != tc.text {
				t.Errorf("%s returning %v: text %q, want %q", name, tc.ret, err.Error(), tc.text)
			}
			if c := status.Code(err); c != tc.code {
				t.Errorf("%s returning %v: status code %v, want %v", name, tc.ret, c, tc.code)
			}
		}
	}
}

func TestContextCrossesBoundary(t *testing.T) {
	started := make(chan struct{}, 1)
	seen := make(chan error, 1)
	b := TestBackend(t, &fakeBackend{
		slot: func(ctx context.Context, _ int) (SlotInfo, error) {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				seen <- ctx.Err()
				return SlotInfo{}, ctx.Err()
			case <-time.After(5 * time.Second):
				seen <- nil
				return SlotInfo{}, nil
			}
		},
	})

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err := b.Slot(ctx, 0)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v, want context.Canceled", err)
	}
	if err := wait(t, seen, "plugin to see the cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("plugin saw %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = b.Slot(ctx, 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timed-out call: %v, want context.DeadlineExceeded", err)
	}
	<-started
	if err := wait(t, seen, "plugin to see the deadline"); err == nil {
		t.Error("plugin did not see the deadline")
	}
}

func TestStateGet(t *testing.T) {
	const size = 10*MiB + 123 // not a multiple of any chunk size
	state := randomBytes(size)
	var oneWrite bool // the fake writes all at once, ignoring chunkSize
	var gotSlot, gotChunk int
	b := TestBackend(t, &fakeBackend{
		stateGet: func(_ context.Context, slot, chunkSize int, w io.Writer) (int64, error) {
			gotSlot, gotChunk = slot, chunkSize
			if oneWrite {
				n, err := w.Write(state)
				return int64(n), err
			}
			var n int64
			for off := 0; off < len(state); off += chunkSize {
				m, err := w.Write(state[off:min(off+chunkSize, len(state))])
				n += int64(m)
				if err != nil {
					return n, err
				}
			}
			return n, nil
		},
	})
	for _, chunk := range []int{64 << 10, 4 * MiB} {
		for _, one := range []bool{false, true} {
			t.Run(fmt.Sprintf("chunk=%d/oneWrite=%v", chunk, one), func(t *testing.T) {
				oneWrite = one
				var w chunkRecorder
				n, err := b.StateGet(context.Background(), 5, chunk, &w)
				if err != nil {
					t.Fatal(err)
				}
				if gotSlot != 5 || gotChunk != chunk {
					t.Errorf("plugin got slot %d chunk %d", gotSlot, gotChunk)
				}
				if n != size || !bytes.Equal(w.data, state) {
					t.Fatalf("got %d bytes (n=%d), equal=%v; want %d", len(w.data), n, bytes.Equal(w.data, state), size)
				}
				if m := w.maxChunk(); m > chunk {
					t.Errorf("writer saw a %d-byte chunk, above the %d chunk size", m, chunk)
				}
				if want := (size + chunk - 1) / chunk; len(w.chunks) != want {
					t.Errorf("writer saw %d chunks, want %d", len(w.chunks), want)
				}
			})
		}
	}
	t.Run("empty", func(t *testing.T) {
		state = nil
		var w chunkRecorder
		n, err := b.StateGet(context.Background(), 0, 1024, &w)
		if err != nil || n != 0 || len(w.chunks) != 0 {
			t.Errorf("n=%d chunks=%d err=%v", n, len(w.chunks), err)
		}
	})
}

// The server's writer must not keep the backend's buffer: a backend reusing
// it right after Write must not corrupt what the host receives.
func TestStateGetWriterDoesNotRetain(t *testing.T) {
	const chunk, size = 256 << 10, 8 * MiB
	state := randomBytes(size)
	b := TestBackend(t, &fakeBackend{
		stateGet: func(_ context.Context, _, _ int, w io.Writer) (int64, error) {
			buf := make([]byte, chunk)
			var n int64
			for off := 0; off < size; off += chunk {
				copy(buf, state[off:off+chunk])
				m, err := w.Write(buf)
				n += int64(m)
				if err != nil {
					return n, err
				}
				for i := range buf {
					buf[i] = 0xAA
				}
			}
			return n, nil
		},
	})
	var w chunkRecorder
	if _, err := b.StateGet(context.Background(), 0, chunk, &w); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.data, state) {
		t.Error("host received data the backend overwrote after Write returned")
	}
}

type failingWriter struct {
	n, failAt int
	err       error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.n++
	if w.n == w.failAt {
		return 0, w.err
	}
	return len(p), nil
}

func TestStateGetWriterFails(t *testing.T) {
	const chunk = 64 << 10
	seen := make(chan error, 1)
	b := TestBackend(t, &fakeBackend{
		stateGet: func(ctx context.Context, _, _ int, w io.Writer) (int64, error) {
			// An endless state: only the host stopping the stream ends it.
			buf := make([]byte, chunk)
			var n int64
			for {
				m, err := w.Write(buf)
				n += int64(m)
				if err == nil {
					err = ctx.Err()
				}
				if err != nil {
					seen <- err
					return n, err
				}
			}
		},
	})
	errDisk := errors.New("disk full")
	w := &failingWriter{failAt: 3, err: errDisk}
	n, err := b.StateGet(context.Background(), 0, chunk, w)
	if !errors.Is(err, errDisk) {
		t.Fatalf("StateGet: %v, want the writer's error", err)
	}
	if n != 2*chunk {
		t.Errorf("n = %d, want %d", n, 2*chunk)
	}
	perr := wait(t, seen, "the plugin to stop producing")
	if !errors.Is(perr, context.Canceled) {
		t.Errorf("plugin stopped with %v, want context.Canceled", perr)
	}
}

func TestStatePut(t *testing.T) {
	const stateSize, trailing = 10 * MiB, 4 * 1000 // state, then NVocab×4 bytes of logits
	blob := randomBytes(stateSize + trailing)
	tokens := []int32{9, 8, 7, 151643}
	type got struct {
		slot            int
		tokens          []int32
		size            int64
		state, trailing []byte
	}
	gotCh := make(chan got, 1)
	b := TestBackend(t, &fakeBackend{
		statePut: func(_ context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
			g := got{slot: slot, tokens: tokens, size: size, state: make([]byte, stateSize)}
			if _, err := io.ReadFull(r, g.state); err != nil {
				return 0, err
			}
			var err error
			if g.trailing, err = io.ReadAll(r); err != nil {
				return 0, err
			}
			gotCh <- g
			return stateSize, nil
		},
	})
	for _, piece := range []int{0, 100_003, 3 * MiB} {
		t.Run(fmt.Sprintf("piece=%d", piece), func(t *testing.T) {
			// The harness server keeps gRPC's 4 MiB receive limit.
			b.putPiece = piece
			r := bytes.NewReader(blob)
			consumed, err := b.StatePut(context.Background(), 2, tokens, r, int64(len(blob)))
			if err != nil {
				t.Fatal(err)
			}
			if consumed != stateSize {
				t.Errorf("consumed %d, want %d", consumed, stateSize)
			}
			g := <-gotCh
			if g.slot != 2 || !reflect.DeepEqual(g.tokens, tokens) || g.size != int64(len(blob)) {
				t.Errorf("plugin got slot %d tokens %v size %d", g.slot, g.tokens, g.size)
			}
			if !bytes.Equal(g.state, blob[:stateSize]) || !bytes.Equal(g.trailing, blob[stateSize:]) {
				t.Errorf("plugin got %d+%d bytes that differ from what was sent", len(g.state), len(g.trailing))
			}
		})
	}
	b.putPiece = 0

	t.Run("reader longer than size", func(t *testing.T) {
		// Only size bytes are sent; the rest stays in the host's reader.
		r := bytes.NewReader(append(append([]byte(nil), blob...), "next blob"...))
		if _, err := b.StatePut(context.Background(), 0, nil, r, int64(len(blob))); err != nil {
			t.Fatal(err)
		}
		if g := <-gotCh; !bytes.Equal(g.trailing, blob[stateSize:]) {
			t.Errorf("plugin got %d trailing bytes, want %d", len(g.trailing), trailing)
		}
		if r.Len() != len("next blob") {
			t.Errorf("%d bytes left in the reader, want %d", r.Len(), len("next blob"))
		}
	})
}

func TestStatePutEmpty(t *testing.T) {
	b := TestBackend(t, &fakeBackend{
		statePut: func(_ context.Context, _ int, _ []int32, r io.Reader, size int64) (int64, error) {
			data, err := io.ReadAll(r)
			if err != nil || len(data) != 0 || size != 0 {
				return 0, fmt.Errorf("%w: read %d bytes of %d, err %v", ErrBadRequest, len(data), size, err)
			}
			return 0, nil
		},
	})
	if _, err := b.StatePut(context.Background(), 0, nil, bytes.NewReader(nil), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StatePut(context.Background(), 0, nil, bytes.NewReader(nil), -1); !errors.Is(err, ErrBadRequest) {
		t.Errorf("negative size: %v, want ErrBadRequest", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestStatePutReaderFails(t *testing.T) {
	const size = 10 * MiB
	seen := make(chan error, 1)
	b := TestBackend(t, &fakeBackend{
		statePut: func(_ context.Context, _ int, _ []int32, r io.Reader, _ int64) (int64, error) {
			n, err := io.Copy(io.Discard, r)
			if err == nil {
				seen <- nil
				return n, nil
			}
			seen <- err
			return 0, err
		},
	})

	errSrc := errors.New("upload interrupted")
	src := io.MultiReader(bytes.NewReader(randomBytes(3*MiB+5)), errReader{errSrc})
	_, err := b.StatePut(context.Background(), 0, nil, src, size)
	if !errors.Is(err, errSrc) {
		t.Errorf("failing reader: %v, want the reader's error", err)
	}
	if perr := wait(t, seen, "the plugin's read to end"); perr == nil {
		t.Error("failing reader: plugin read a whole state")
	}

	// A reader that ends before size is an error too, never a short state.
	_, err = b.StatePut(context.Background(), 0, nil, bytes.NewReader(randomBytes(3*MiB)), size)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short reader: %v, want io.ErrUnexpectedEOF", err)
	}
	if perr := wait(t, seen, "the plugin's read to end"); perr == nil {
		t.Error("short reader: plugin read a whole state")
	}
}

func TestStatePutBackendEndsEarly(t *testing.T) {
	const size = 10 * MiB
	var reject bool
	b := TestBackend(t, &fakeBackend{
		statePut: func(_ context.Context, slot int, _ []int32, r io.Reader, _ int64) (int64, error) {
			if reject {
				return 0, fmt.Errorf("%w: slot %d", ErrBusy, slot)
			}
			// Violates the contract by not reading to the end; the server
			// finishes the read for it.
			buf := make([]byte, MiB)
			n, err := io.ReadFull(r, buf)
			return int64(n), err
		},
	})

	reject = true
	r := bytes.NewReader(randomBytes(size))
	if _, err := b.StatePut(context.Background(), 4, nil, r, size); !errors.Is(err, ErrBusy) || err.Error() != "slot busy: slot 4" {
		t.Errorf("rejected put: %v, want ErrBusy", err)
	}

	reject = false
	r = bytes.NewReader(randomBytes(size))
	consumed, err := b.StatePut(context.Background(), 4, nil, r, size)
	if err != nil || consumed != MiB {
		t.Errorf("early return: consumed %d, err %v; want %d, nil", consumed, err, MiB)
	}
	if r.Len() != 0 {
		t.Errorf("%d bytes of the state were never sent", r.Len())
	}
}

func TestDecode(t *testing.T) {
	const nTokens = 200
	var gotReq DecodeRequest
	b := TestBackend(t, &fakeBackend{
		decode: func(_ context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error) {
			gotReq = req
			for i := range req.NPredict {
				// "\xe2\x82" is half of "€": a token piece need not be
				// valid UTF-8 on its own.
				if err := emit(testToken(i)); err != nil {
					return DecodeResult{}, err
				}
			}
			return DecodeResult{TokensGenerated: req.NPredict, NPast: 1000 + req.NPredict, StopReason: "length"}, nil
		},
	})
	req := DecodeRequest{Slot: 1, NPredict: nTokens, Logprobs: true, NProbs: 3, NKeep: 17, LastUnevaluated: true, Sampler: SamplerParams{
		Temperature: 0.7, TopK: 40, TopP: 0.95, MinP: 0.05, Seed: math.MaxUint64,
		RepeatPenalty: 1.1, RepeatLastN: -1, PresencePenalty: 0.5, FrequencyPenalty: -0.25,
		IgnoreEOS: true, LogitBias: map[int32]float32{7: -100, 42: 2.5},
	}}
	var toks []Token
	res, err := b.Decode(context.Background(), req, func(t Token) error {
		toks = append(toks, t)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotReq, req) {
		t.Errorf("plugin got %+v, want %+v", gotReq, req)
	}
	want := DecodeResult{TokensGenerated: nTokens, NPast: 1000 + nTokens, StopReason: "length"}
	if !reflect.DeepEqual(res, want) {
		t.Errorf("result %+v, want %+v", res, want)
	}
	if len(toks) != nTokens {
		t.Fatalf("got %d tokens, want %d", len(toks), nTokens)
	}
	for i, tok := range toks {
		if w := testToken(i); !reflect.DeepEqual(tok, w) {
			t.Fatalf("token %d: %+v, want %+v", i, tok, w)
		}
	}
}

// TestDecodePrompt: a Decode's prompt reaches the plugin whole, and what it
// did comes back with the result.
func TestDecodePrompt(t *testing.T) {
	var gotReq DecodeRequest
	pr := &PromptResult{NTokens: 517, Reused: 300, ModelFallback: true, Prefill: 1234567 * time.Nanosecond}
	b := TestBackend(t, &fakeBackend{
		decode: func(_ context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error) {
			gotReq = req
			if err := emit(testToken(1)); err != nil {
				return DecodeResult{}, err
			}
			return DecodeResult{TokensGenerated: 1, NPast: 518, StopReason: "eos", Prompt: pr}, nil
		},
	})
	for name, prompt := range map[string]*PrefillRequest{
		"tokens": {Slot: 2, Tokens: []int32{1, 2, 3}, Model: "other"},
		"chat": {Slot: 2, Messages: []Message{{Role: "user", Content: "hi"}}, Tools: []string{`{"type":"function"}`},
			TemplateKwargs: `{"enable_thinking":false}`},
		"text": {Slot: 2, Text: "once upon a time"},
	} {
		req := DecodeRequest{Slot: 2, NPredict: 4, Prompt: prompt}
		res, err := b.Decode(context.Background(), req, func(Token) error { return nil })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(gotReq, req) {
			t.Errorf("%s: plugin got %+v (prompt %+v), want %+v", name, gotReq, gotReq.Prompt, prompt)
		}
		if res.Prompt == nil || *res.Prompt != *pr || res.NPast != 518 {
			t.Errorf("%s: result %+v, prompt %+v", name, res, res.Prompt)
		}
	}
}

// testToken is the i-th token TestDecode streams: an incomplete UTF-8 piece,
// and alternatives on odd positions.
func testToken(i int) Token {
	t := Token{ID: int32(i), Text: fmt.Sprintf("t%d\xe2\x82", i), Logprob: -float32(i) / 8}
	if i%2 == 1 {
		t.Top = []TokenProb{{ID: int32(i), Text: t.Text, Logprob: t.Logprob}, {ID: 9, Text: "\xff", Logprob: -3}}
	}
	return t
}

func TestDecodeEmitFails(t *testing.T) {
	seen := make(chan error, 1)
	b := TestBackend(t, &fakeBackend{
		decode: func(ctx context.Context, _ DecodeRequest, emit func(Token) error) (DecodeResult, error) {
			for i := 0; ; i++ {
				err := emit(Token{ID: int32(i), Text: "x"})
				if err == nil {
					err = ctx.Err()
				}
				if err != nil {
					seen <- err
					return DecodeResult{}, err
				}
			}
		},
	})
	errClient := errors.New("client went away")
	var ids []int32
	_, err := b.Decode(context.Background(), DecodeRequest{NPredict: 1 << 30}, func(t Token) error {
		ids = append(ids, t.ID)
		if len(ids) == 5 {
			return errClient
		}
		return nil
	})
	if !errors.Is(err, errClient) {
		t.Fatalf("Decode: %v, want emit's error", err)
	}
	if !reflect.DeepEqual(ids, []int32{0, 1, 2, 3, 4}) {
		t.Errorf("emitted %v", ids)
	}
	if perr := wait(t, seen, "the plugin to stop generating"); !errors.Is(perr, context.Canceled) {
		t.Errorf("plugin stopped with %v, want context.Canceled", perr)
	}
}

// TestDecodeOutput: a decode's output request reaches the plugin whole (the
// chat with its tool choice, a reasoning budget of 0 still a budget), and
// the parsed deltas and reply come back, tool call indices 0 and none (-1)
// alike, the speculative bounds and the draft token counts.
func TestDecodeOutput(t *testing.T) {
	var gotReq DecodeRequest
	deltas := []ChatDelta{{Reasoning: "hm", ToolCall: -1}, {ToolCall: 0, ToolID: "call_1", ToolName: "f", ToolArgs: `{"a"`},
		{ToolCall: 1, ToolArgs: ":1}"}, {Content: "x", ToolCall: -1}}
	reply := &ChatReply{Content: "x", Reasoning: "hm", ToolCalls: []ToolCall{{ID: "call_1", Name: "f", Arguments: `{"a":1}`}}}
	b := TestBackend(t, &fakeBackend{
		decode: func(_ context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error) {
			gotReq = req
			for i, d := range deltas {
				if err := emit(Token{ID: int32(i), Text: "t", Deltas: []ChatDelta{d}}); err != nil {
					return DecodeResult{}, err
				}
			}
			return DecodeResult{TokensGenerated: len(deltas), StopReason: StopString, Message: reply, Deltas: deltas[1:3],
				DraftTokens: 7, DraftAccepted: 5}, nil
		},
	})
	yes := false
	req := DecodeRequest{Slot: 1, NPredict: 9, Output: &Output{
		Chat: &PrefillRequest{Messages: []Message{{Role: "user", Content: "hi"}}, Tools: []string{`{"type":"function"}`},
			ToolChoice: "required", ToolChoiceName: "f", ParallelToolCalls: &yes},
		JSONSchema: `{"type":"object"}`, Stops: []string{"\n\n"}, ReasoningBudget: &ReasoningBudget{Message: "Enough."}},
		Speculative: &SpeculativeParams{NMax: 4, NMin: -1, PMin: 0.5}}
	var got []ChatDelta
	res, err := b.Decode(context.Background(), req, func(t Token) error {
		got = append(got, t.Deltas...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotReq, req) {
		t.Errorf("plugin got %+v (output %+v, chat %+v), want %+v", gotReq, gotReq.Output, gotReq.Output.Chat, req)
	}
	if !reflect.DeepEqual(got, deltas) {
		t.Errorf("deltas %+v, want %+v", got, deltas)
	}
	if !reflect.DeepEqual(res.Message, reply) || res.StopReason != StopString || !reflect.DeepEqual(res.Deltas, deltas[1:3]) ||
		res.DraftTokens != 7 || res.DraftAccepted != 5 {
		t.Errorf("result %+v (message %+v), want %+v", res, res.Message, reply)
	}
}
