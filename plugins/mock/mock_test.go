package mock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

func newLoaded(t testing.TB, nSlots int, opts map[string]string) *Backend {
	t.Helper()
	b := New(hclog.NewNullLogger())
	if _, err := b.Load(context.Background(), iface.LoadRequest{NSlots: nSlots, Options: opts}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	return b
}

func prefillTokens(t testing.TB, b *Backend, slot int, toks []int32) iface.PrefillResult {
	t.Helper()
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: slot, Tokens: toks})
	if err != nil {
		t.Fatalf("Prefill slot %d: %v", slot, err)
	}
	return res
}

func decode(t testing.TB, b *Backend, slot, n int, sp iface.SamplerParams) ([]iface.Token, iface.DecodeResult) {
	t.Helper()
	var out []iface.Token
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: slot, NPredict: n, Sampler: sp},
		func(tok iface.Token) error { out = append(out, tok); return nil })
	if err != nil {
		t.Fatalf("Decode slot %d: %v", slot, err)
	}
	if res.TokensGenerated != len(out) {
		t.Fatalf("Decode reported %d tokens, emitted %d", res.TokensGenerated, len(out))
	}
	return out, res
}

func slotInfo(t testing.TB, b *Backend, slot int) iface.SlotInfo {
	t.Helper()
	si, err := b.Slot(context.Background(), slot)
	if err != nil {
		t.Fatalf("Slot %d: %v", slot, err)
	}
	return si
}

func text(toks []iface.Token) string {
	var sb strings.Builder
	for _, t := range toks {
		sb.WriteString(t.Text)
	}
	return sb.String()
}

func TestTokenizerAndTemplate(t *testing.T) {
	if got, want := Tokenize("hé\n"), []int32{'h', 0xC3, 0xA9, '\n'}; !slices.Equal(got, want) {
		t.Fatalf("Tokenize = %v, want %v", got, want)
	}
	msgs := []iface.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	const want = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
	if got := RenderChat(msgs); got != want {
		t.Fatalf("RenderChat = %q, want %q", got, want)
	}
	b := newLoaded(t, 1, nil)
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Slot.Tokens, Tokenize(want)) || res.Slot.NPast != len(want) {
		t.Fatalf("prefill slot = %+v, want the template's bytes", res.Slot)
	}
	if res.Slot.StateSize != StateSize(DefaultKVBytesPerToken, len(want)) {
		t.Fatalf("StateSize = %d", res.Slot.StateSize)
	}
	if piece(EOS) != "" || piece('a') != "a" {
		t.Fatal("piece")
	}
}

func TestPrefillValidation(t *testing.T) {
	b := newLoaded(t, 2, map[string]string{OptNCtx: "8"})
	ctx := context.Background()
	msgs := []iface.Message{{Role: "user", Content: "x"}}
	for _, tc := range []struct {
		name string
		req  iface.PrefillRequest
		msg  string
	}{
		{"both", iface.PrefillRequest{Messages: msgs, Tokens: []int32{1}}, "one of messages, tokens and text"},
		{"tokens and text", iface.PrefillRequest{Text: "a", Tokens: []int32{1}}, "one of messages, tokens and text"},
		{"neither", iface.PrefillRequest{}, "empty prompt"},
		{"empty tokens", iface.PrefillRequest{Tokens: []int32{}}, "empty prompt"},
		{"negative token", iface.PrefillRequest{Tokens: []int32{1, -1}}, "token -1 at position 1"},
		{"token past EOS", iface.PrefillRequest{Tokens: []int32{257}}, "token 257 at position 0"},
		{"over n_ctx", iface.PrefillRequest{Tokens: make([]int32, 9)}, "n_ctx is 8"},
		{"template over n_ctx", iface.PrefillRequest{Messages: msgs}, "n_ctx is 8"},
		{"no role", iface.PrefillRequest{Messages: []iface.Message{{Content: "x"}}}, "no role"},
	} {
		prefillTokens(t, b, 0, []int32{7})
		_, err := b.Prefill(ctx, tc.req)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want ErrBadRequest mentioning %q", tc.name, err, tc.msg)
		}
		if si := slotInfo(t, b, 0); si.NPast != 1 {
			t.Errorf("%s: a rejected prefill changed the slot: %+v", tc.name, si)
		}
	}

	// EOS is a valid prompt token; n_ctx tokens fit exactly.
	toks := []int32{EOS, 0, 255, 1, 2, 3, 4, 5}
	res := prefillTokens(t, b, 1, toks)
	if res.Slot.NPast != 8 || res.ModelFallback {
		t.Fatalf("prefill = %+v", res.Slot)
	}
	toks[0] = 9 // the slot owns its copy
	if si := slotInfo(t, b, 1); si.Tokens[0] != EOS {
		t.Fatal("slot shares the caller's token slice")
	}

	res, err := b.Prefill(ctx, iface.PrefillRequest{Slot: 1, Tokens: []int32{1}, Model: "mock"})
	if err != nil || res.ModelFallback {
		t.Fatalf("resident alias: fallback=%v err=%v", res.ModelFallback, err)
	}
	res, err = b.Prefill(ctx, iface.PrefillRequest{Slot: 1, Tokens: []int32{1}, Model: "llama-70b"})
	if err != nil || !res.ModelFallback || res.Slot.NPast != 1 {
		t.Fatalf("other alias: fallback=%v err=%v", res.ModelFallback, err)
	}
}

func TestDeterminism(t *testing.T) {
	msgs := []iface.Message{{Role: "user", Content: "Tell me a story."}}
	run := func() (iface.PrefillResult, []iface.Token, iface.DecodeResult) {
		b := newLoaded(t, 2, nil)
		p, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 1, Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		toks, res := decode(t, b, 1, 200, iface.SamplerParams{})
		return p, toks, res
	}
	p1, t1, r1 := run()
	p2, t2, r2 := run()
	if !slices.Equal(p1.Logits, p2.Logits) || !reflect.DeepEqual(t1, t2) || !reflect.DeepEqual(r1, r2) {
		t.Fatal("two backends decoded the same prompt differently")
	}
	if len(p1.Logits) != NVocab {
		t.Fatalf("%d logits, want %d", len(p1.Logits), NVocab)
	}
	if len(t1) > 0 {
		argmax := 0
		for v, l := range p1.Logits {
			if l > p1.Logits[argmax] {
				argmax = v
			}
		}
		if int32(argmax) != t1[0].ID {
			t.Fatalf("logits arg-max %d, first greedy token %d", argmax, t1[0].ID)
		}
	}
	for _, tok := range t1 {
		if tok.Logprob > 0 || tok.Logprob <= -5 {
			t.Fatalf("logprob %v outside (-5, 0]", tok.Logprob)
		}
		if !strings.ContainsRune(alphabet, rune(tok.ID)) || tok.Text != string(rune(tok.ID)) {
			t.Fatalf("token %+v is not from the alphabet", tok)
		}
	}
	t.Logf("decoded %q (%s)", text(t1), r1.StopReason)
	if r1.NPast != p1.Slot.NPast+len(t1) {
		t.Fatalf("n_past %d, want %d", r1.NPast, p1.Slot.NPast+len(t1))
	}
}

func TestDecodeStops(t *testing.T) {
	ctx := context.Background()
	b := newLoaded(t, 2, map[string]string{OptNCtx: "12"})
	prompt := Tokenize("0123456789")
	prefillTokens(t, b, 0, prompt)

	if toks, res := decode(t, b, 0, 0, iface.SamplerParams{}); len(toks) != 0 || res.StopReason != StopLength || res.NPast != 10 {
		t.Fatalf("n_predict 0: %+v", res)
	}
	if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: 0, NPredict: -1}, nil); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("n_predict -1: %v", err)
	}
	if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: 1, NPredict: 1}, nil); !errors.Is(err, iface.ErrBadRequest) ||
		!strings.Contains(err.Error(), "slot is empty") {
		t.Fatalf("empty slot: %v", err)
	}
	toks, res := decode(t, b, 0, 100, iface.SamplerParams{})
	if res.StopReason == StopNTokensLimit && (len(toks) != 2 || res.NPast != 12) {
		t.Fatalf("n_ctx stop after %d tokens: %+v", len(toks), res)
	}
	if res.StopReason != StopNTokensLimit && res.StopReason != StopEOS {
		t.Fatalf("stop %q", res.StopReason)
	}
	want := append(slices.Clone(prompt), ids(toks)...)
	if si := slotInfo(t, b, 0); !slices.Equal(si.Tokens, want) || si.NPast != res.NPast {
		t.Fatalf("slot after decode: %v, want %v", si.Tokens, want)
	}

	// EOS: about one token in 509 is EOS, so a long decode meets one. It ends
	// the decode unemitted and stays out of the sequence.
	b = newLoaded(t, 1, nil)
	prefillTokens(t, b, 0, prompt)
	toks, res = decode(t, b, 0, 20000, iface.SamplerParams{})
	if res.StopReason != StopEOS {
		t.Fatalf("no EOS in %d tokens: %s", len(toks), res.StopReason)
	}
	si := slotInfo(t, b, 0)
	if si.NPast != len(prompt)+len(toks) || slices.Contains(si.Tokens[len(prompt):], EOS) {
		t.Fatalf("EOS in the sequence or n_past wrong: %d", si.NPast)
	}
	if _, h := b.eng.Load().slots[0].snapshot(); greedy(h) != EOS {
		t.Fatal("the decode stopped but the hash does not map to EOS")
	}

	// An emit error stops the decode and is returned; the token stays.
	prefillTokens(t, b, 0, prompt)
	boom := errors.New("client gone")
	res, err := b.Decode(ctx, iface.DecodeRequest{NPredict: 10}, func(iface.Token) error { return boom })
	if !errors.Is(err, boom) || res.TokensGenerated != 1 || slotInfo(t, b, 0).NPast != len(prompt)+1 {
		t.Fatalf("emit error: %+v %v", res, err)
	}
}

func ids(toks []iface.Token) []int32 {
	out := make([]int32, len(toks))
	for i, t := range toks {
		out[i] = t.ID
	}
	return out
}

func TestSampling(t *testing.T) {
	b := newLoaded(t, 4, nil)
	prompt := Tokenize("once upon a time")
	run := func(slot int, sp iface.SamplerParams) []int32 {
		prefillTokens(t, b, slot, prompt)
		toks, _ := decode(t, b, slot, 64, sp)
		return ids(toks)
	}
	greedyOut := run(0, iface.SamplerParams{})
	hot := iface.SamplerParams{Temperature: 0.8, Seed: 42}
	a, c := run(1, hot), run(2, hot)
	if !slices.Equal(a, c) {
		t.Fatal("same seed, different output")
	}
	if slices.Equal(a, greedyOut) {
		t.Fatal("temperature 0.8 decoded greedily")
	}
	if other := run(3, iface.SamplerParams{Temperature: 0.8, Seed: 43}); slices.Equal(a, other) {
		t.Fatal("different seeds, same output")
	}
	if k1 := run(3, iface.SamplerParams{Temperature: 0.8, Seed: 42, TopK: 1}); !slices.Equal(k1, greedyOut) {
		t.Fatal("top_k 1 is not greedy")
	}
}

func TestBadSlot(t *testing.T) {
	ctx := context.Background()
	b := New(nil)
	if _, err := b.Info(ctx); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("Info before Load: %v", err)
	}
	if _, err := b.Slot(ctx, 0); err == nil {
		t.Fatal("Slot before Load succeeded")
	}
	b = newLoaded(t, 2, nil)
	for _, slot := range []int{-1, 2, 1 << 30} {
		checks := map[string]error{}
		_, checks["Slot"] = b.Slot(ctx, slot)
		checks["ClearSlot"] = b.ClearSlot(ctx, slot)
		_, checks["Prefill"] = b.Prefill(ctx, iface.PrefillRequest{Slot: slot, Tokens: []int32{1}})
		_, checks["Decode"] = b.Decode(ctx, iface.DecodeRequest{Slot: slot, NPredict: 1}, nil)
		_, checks["StateGet"] = b.StateGet(ctx, slot, 1<<16, discard{})
		_, checks["StatePut"] = b.StatePut(ctx, slot, nil, strings.NewReader(""), 0)
		for op, err := range checks {
			if !errors.Is(err, iface.ErrNoSlot) {
				t.Errorf("%s(%d): %v, want ErrNoSlot", op, slot, err)
			}
		}
	}
	if _, err := b.Load(ctx, iface.LoadRequest{}); err == nil {
		t.Fatal("second Load succeeded")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestLoadOptions(t *testing.T) {
	ctx := context.Background()
	info, err := New(nil).Load(ctx, iface.LoadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != Name || info.Version != Version || info.NVocab != NVocab || info.NCtx != DefaultNCtx*DefaultNSlots ||
		info.NCtxSlot != DefaultNCtx || info.KVUnified ||
		info.NSlots != DefaultNSlots || info.Capabilities != nil || info.Model.Alias != "mock" || info.Model.Path != "" ||
		len(info.Model.Hash) != 64 {
		t.Fatalf("default info %+v", info)
	}

	for _, tc := range []struct {
		opts   map[string]string
		nSlots int
		msg    string
	}{
		{map[string]string{"kv_bytes": "8"}, 1, `unknown option "kv_bytes" (known: alias, cache_ram, embd_normalize, embeddings, kv_bytes_per_token, kv_unified, n_ctx, op_delay_ms, pooling; and, without effect,`},
		{map[string]string{OptKVUnified: "shared"}, 1, `kv_unified="shared": not a boolean`},
		{map[string]string{OptKVBytesPerToken: "12"}, 1, "kv_bytes_per_token=\"12\": must be a multiple of 8"},
		{map[string]string{OptKVBytesPerToken: "0"}, 1, "kv_bytes_per_token=0: out of range"},
		{map[string]string{OptKVBytesPerToken: "-8"}, 1, "kv_bytes_per_token=-8: out of range"},
		{map[string]string{OptKVBytesPerToken: "16777224"}, 1, "out of range"},
		{map[string]string{OptKVBytesPerToken: "1k"}, 1, "kv_bytes_per_token=\"1k\": not an integer"},
		{map[string]string{OptNCtx: "0"}, 1, "n_ctx=0: out of range"},
		{map[string]string{OptNCtx: "many"}, 1, "n_ctx=\"many\": not an integer"},
		{map[string]string{OptOpDelayMS: "-1"}, 1, "op_delay_ms=-1: out of range"},
		{map[string]string{OptAlias: " "}, 1, "alias: must not be empty"},
		{nil, -1, "n_slots -1"},
	} {
		_, err := New(nil).Load(ctx, iface.LoadRequest{NSlots: tc.nSlots, Options: tc.opts})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: err = %v, want ErrBadRequest containing %q", tc.opts, err, tc.msg)
		}
	}

	info, err = New(nil).Load(ctx, iface.LoadRequest{NSlots: 3, Options: map[string]string{
		OptKVBytesPerToken: "16777216", OptNCtx: "100", OptOpDelayMS: "0", OptAlias: "tiny"}})
	if err != nil || info.NSlots != 3 || info.NCtx != 300 || info.SlotCtx() != 100 || !info.SplitKV() || info.Model.Alias != "tiny" {
		t.Fatalf("info %+v, err %v", info, err)
	}
	info, err = New(nil).Load(ctx, iface.LoadRequest{NSlots: 3, Options: map[string]string{OptNCtx: "100", OptKVUnified: "true"}})
	if err != nil || info.NCtx != 100 || info.SlotCtx() != 100 || info.SplitKV() || !info.KVUnified {
		t.Fatalf("kv_unified: info %+v, err %v", info, err)
	}
}

// TestSharedPool: with kv_unified the slots share n_ctx cells: a prompt
// that finds them held by other slots fails with ErrNoRoom and leaves its
// slot empty, a decode stops when the pool is full, a restore that does not
// fit fails alike, and clearing a slot makes room.
func TestSharedPool(t *testing.T) {
	ctx := context.Background()
	b := New(nil)
	if _, err := b.Load(ctx, iface.LoadRequest{NSlots: 3, Options: map[string]string{OptNCtx: "100", OptKVUnified: "true"}}); err != nil {
		t.Fatal(err)
	}
	fill := func(slot, n int) error {
		_, err := b.Prefill(ctx, iface.PrefillRequest{Slot: slot, Tokens: make([]int32, n)})
		return err
	}
	if err := fill(0, 60); err != nil {
		t.Fatal(err)
	}
	if err := fill(1, 30); err != nil {
		t.Fatal(err)
	}
	if err := fill(2, 20); !errors.Is(err, iface.ErrNoRoom) || !strings.Contains(err.Error(), "needs 20 KV cells, 10 free") {
		t.Fatalf("a prompt past the pool: %v", err)
	}
	if si, _ := b.Slot(ctx, 2); si.NPast != 0 {
		t.Fatalf("the refused slot holds %d tokens", si.NPast)
	}
	res, err := b.Decode(ctx, iface.DecodeRequest{Slot: 1, NPredict: 50, Sampler: iface.SamplerParams{IgnoreEOS: true}}, nil)
	if err != nil || res.StopReason != StopNTokensLimit || res.NPast != 40 {
		t.Fatalf("a decode that fills the pool: %+v %v", res, err)
	}
	var buf bytes.Buffer
	si, _ := b.Slot(ctx, 1)
	if _, err := b.StateGet(ctx, 1, 1<<20, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StatePut(ctx, 2, si.Tokens, bytes.NewReader(buf.Bytes()), int64(buf.Len())); !errors.Is(err, iface.ErrNoRoom) {
		t.Fatalf("a restore past the pool: %v", err)
	}
	if err := b.ClearSlot(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.StatePut(ctx, 2, si.Tokens, bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		t.Fatalf("the restore after a clear: %v", err)
	}
	if err := fill(0, 21); !errors.Is(err, iface.ErrNoRoom) {
		t.Fatalf("a prompt past what is left: %v", err)
	}
	if err := fill(0, 20); err != nil {
		t.Fatal(err)
	}
}

// Without a model file the identity follows the state-shaping options only.
func TestIdentityFromOptions(t *testing.T) {
	ctx := context.Background()
	id := func(opts map[string]string) iface.ModelIdentity {
		info, err := New(nil).Load(ctx, iface.LoadRequest{NSlots: 1, Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		return info.Model
	}
	base := id(map[string]string{OptKVBytesPerToken: "64"})
	if got := id(map[string]string{OptKVBytesPerToken: "64", OptOpDelayMS: "5"}); got != base {
		t.Fatalf("op_delay_ms changed the identity: %+v vs %+v", got, base)
	}
	if got := id(map[string]string{OptKVBytesPerToken: "64", OptAlias: "x"}); got.Hash != base.Hash || got.Alias != "x" {
		t.Fatalf("alias: %+v", got)
	}
	if got := id(map[string]string{OptKVBytesPerToken: "128"}); got.Hash == base.Hash {
		t.Fatal("kv_bytes_per_token did not change the identity")
	}
	if got := id(map[string]string{OptKVBytesPerToken: "64", OptNCtx: "64"}); got.Hash == base.Hash {
		t.Fatal("n_ctx did not change the identity")
	}
}

// With a model file the identity is the file's.
func TestIdentityFromFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny-model.Q4_K_M.gguf")
	content := []byte("not really a gguf")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	info, err := New(nil).Load(ctx, iface.LoadRequest{Model: path})
	want := iface.ModelIdentity{Alias: "tiny-model.Q4_K_M", Hash: hex.EncodeToString(sum[:]), Path: path}
	if err != nil || info.Model != want {
		t.Fatalf("model identity %+v (err %v), want %+v", info.Model, err, want)
	}
	if _, err := New(nil).Load(ctx, iface.LoadRequest{Model: filepath.Join(dir, "missing.gguf")}); !errors.Is(err, os.ErrNotExist) ||
		!errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("missing model: %v", err)
	}
	if _, err := New(nil).Load(ctx, iface.LoadRequest{Model: dir}); err == nil {
		t.Fatal("a directory was accepted as a model file")
	}
}

func TestExpertModeAndSwapQuant(t *testing.T) {
	ctx := context.Background()
	b := newLoaded(t, 1, nil)
	for in, want := range map[string]string{"solo": "solo", "combined": "solo"} {
		if got, err := b.SetExpertMode(ctx, in); err != nil || got != want {
			t.Errorf("SetExpertMode(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "Solo", "COMBINED", "solo ", "pipeline"} {
		_, err := b.SetExpertMode(ctx, bad)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "expert_mode must be 'solo' or 'combined'") {
			t.Errorf("SetExpertMode(%q): %v", bad, err)
		}
	}
	if _, err := b.SwapQuant(ctx, "q8_0", ".*"); !errors.Is(err, iface.ErrNotImplemented) {
		t.Fatalf("SwapQuant: %v", err)
	}
}

// op_delay_ms holds a slot busy; cancellation cuts the wait short, Slot still
// answers, the busy slot refuses a second operation and other slots work.
func TestOpDelay(t *testing.T) {
	ctx := context.Background()
	b := newLoaded(t, 2, map[string]string{OptOpDelayMS: "60000"})

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Prefill(short, iface.PrefillRequest{Tokens: []int32{1, 2}})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Prefill: %v after %v", err, time.Since(start))
	}
	if si := slotInfo(t, b, 0); si.NPast != 0 {
		t.Fatalf("interrupted prefill left %d tokens", si.NPast)
	}

	b = newLoaded(t, 2, map[string]string{OptOpDelayMS: "20"})
	prefillTokens(t, b, 0, []int32{1, 2, 3})
	dctx, dcancel := context.WithCancel(ctx)
	first := make(chan struct{})
	done := make(chan error, 1)
	var n int
	go func() {
		_, err := b.Decode(dctx, iface.DecodeRequest{NPredict: 1 << 20}, func(iface.Token) error {
			if n++; n == 1 {
				close(first)
			}
			return nil
		})
		done <- err
	}()
	<-first
	if si := slotInfo(t, b, 0); si.NPast < 4 {
		t.Fatalf("Slot during decode: %+v", si)
	}
	if _, err := b.Prefill(ctx, iface.PrefillRequest{Tokens: []int32{1}}); !errors.Is(err, iface.ErrBusy) {
		t.Fatalf("Prefill on a decoding slot: %v", err)
	}
	if _, err := b.StatePut(ctx, 0, nil, strings.NewReader("xyz"), 3); !errors.Is(err, iface.ErrBusy) {
		t.Fatalf("StatePut on a decoding slot: %v", err)
	}
	prefillTokens(t, b, 1, []int32{4})
	dcancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Decode after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Decode ignored cancellation")
	}
	if si := slotInfo(t, b, 0); si.NPast != 3+n {
		t.Fatalf("n_past %d after %d emitted tokens", si.NPast, n)
	}
}

// Operations on different slots run concurrently (go test -race checks the
// sharing).
func TestConcurrentSlots(t *testing.T) {
	b := newLoaded(t, 4, map[string]string{OptKVBytesPerToken: "64"})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for slot := range 4 {
		wg.Go(func() {
			for round := range 5 {
				prompt := Tokenize(fmt.Sprintf("slot %d round %d", slot, round))
				if _, err := b.Prefill(ctx, iface.PrefillRequest{Slot: slot, Tokens: prompt}); err != nil {
					errs <- err
					return
				}
				if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: slot, NPredict: 50}, nil); err != nil {
					errs <- err
					return
				}
				si, _ := b.Slot(ctx, (slot+1)%4) // a neighbour's, while it works
				_ = si
				var buf strings.Builder
				if _, err := b.StateGet(ctx, slot, 1000, &buf); err != nil {
					errs <- err
					return
				}
				mine, _ := b.Slot(ctx, slot)
				if _, err := b.StatePut(ctx, slot, mine.Tokens, strings.NewReader(buf.String()), int64(buf.Len())); err != nil {
					errs <- err
					return
				}
				if _, err := b.Info(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// The llama plugin's options that llama-server mode passes load, with one
// log line naming them as without effect; the mock's own still act.
func TestLoadLlamaServerOptions(t *testing.T) {
	var logs strings.Builder
	b := New(hclog.New(&hclog.LoggerOptions{Output: &logs}))
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2, Options: map[string]string{
		"flash_attn": "on", "n_cpu_moe": "8", "combined_pattern": `blk\.([0-9]+)\.ffn_.*_exps\.weight=CPU`, OptNCtx: "64", OptKVUnified: "true"}})
	if err != nil || info.NCtx != 64 || !info.KVUnified {
		t.Fatalf("%+v %v", info, err)
	}
	want := `options of the llama plugin, no effect on the mock: combined_pattern=blk\.([0-9]+)\.ffn_.*_exps\.weight=CPU flash_attn=on n_cpu_moe=8`
	if strings.Count(logs.String(), "no effect on the mock") != 1 || !strings.Contains(logs.String(), want) {
		t.Errorf("log:\n%s", logs.String())
	}
}

// TestDecodeRefusesOutput: the mock constrains and parses nothing and
// bounds no reasoning, so a decode asking it to says so rather than
// decoding free text; its info claims neither capability.
func TestDecodeRefusesOutput(t *testing.T) {
	b := newLoaded(t, 1, nil)
	if _, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: []int32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	chat := &iface.PrefillRequest{Messages: []iface.Message{{Role: "user"}}}
	for _, o := range []*iface.Output{{Grammar: `root ::= "a"`}, {Chat: chat}, {Chat: chat, ReasoningBudget: &iface.ReasoningBudget{Tokens: 4}}} {
		n := 0
		_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 3, Output: o},
			func(iface.Token) error { n++; return nil })
		if !errors.Is(err, iface.ErrNotImplemented) || n != 0 {
			t.Errorf("output %+v: %v after %d tokens, want ErrNotImplemented before any", o, err, n)
		}
	}
	info, err := b.Info(context.Background())
	if err != nil || slices.Contains(info.Capabilities, iface.CapOutput) || slices.Contains(info.Capabilities, iface.CapReasoningBudget) {
		t.Errorf("capabilities %v (%v)", info.Capabilities, err)
	}
}

// TestDecodeRefusesSpeculative: the mock drafts nothing, so a decode with
// speculative bounds (an HTTP request's speculative.n_max …) says so rather
// than decoding as if they applied; the speculative options are refused at
// load by name.
func TestDecodeRefusesSpeculative(t *testing.T) {
	b := newLoaded(t, 1, nil)
	if _, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: []int32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	sp := iface.NoSpeculativeOverride
	sp.NMax = 4
	_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 3, Speculative: &sp}, func(iface.Token) error { return nil })
	if !errors.Is(err, iface.ErrNotImplemented) || !strings.Contains(err.Error(), "speculative") {
		t.Errorf("decode with speculative bounds: %v", err)
	}
	for _, k := range SpecOptions {
		if _, err := New(hclog.NewNullLogger()).Load(context.Background(), iface.LoadRequest{NSlots: 1, Options: map[string]string{k: "1"}}); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("option %s: %v", k, err)
		}
	}
}
