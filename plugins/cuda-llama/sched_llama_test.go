//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Tests of the batching scheduler: what a slot decodes does not depend on
// what the others do at the same time.

// decodeAll decodes n tokens in each of slots at once and returns them.
func decodeAll(t *testing.T, b *Backend, slots []int, n int, sp iface.SamplerParams) map[int][]int32 {
	t.Helper()
	return decodeEach(t, b, slots, func(s int) iface.DecodeRequest { return iface.DecodeRequest{Slot: s, NPredict: n, Sampler: sp} })
}

// decodeEach runs slot s's request req(s) in each of slots at once and
// returns their tokens.
func decodeEach(t *testing.T, b *Backend, slots []int, req func(s int) iface.DecodeRequest) map[int][]int32 {
	t.Helper()
	var mu sync.Mutex
	got := map[int][]int32{}
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Go(func() {
			var ids []int32
			if _, err := b.Decode(context.Background(), req(s),
				func(tok iface.Token) error { ids = append(ids, tok.ID); return nil }); err != nil {
				t.Errorf("slot %d: %v", s, err)
			}
			mu.Lock()
			got[s] = ids
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

var prompts = []string{"the first slot's prompt", "a second, rather longer prompt for the second slot",
	"three", "and the fourth slot, which decodes beside the others"}

// TestBatchedEqualsAlone: at temperature 0, with and without penalties,
// each sequence decodes the same tokens in a batch of four as alone (on a
// GPU: up to a tie, sameGreedy), and the steps really were shared. (Above temperature 0 a seeded draw can differ:
// where a sequence's cells lie in the cache moves its logits in the last
// digits — ggml's CPU attention sums in chunks of cells — and a draw near a
// boundary follows.)
// With a KV stream per slot llama.cpp splits a step into micro-batches of
// consecutive sequence ids: slot 2 idles, so slots 0, 1 and 3 take two.
func TestBatchedEqualsAlone(t *testing.T) {
	for name, tc := range map[string]struct {
		sp    iface.SamplerParams
		opts  map[string]string
		slots []int
	}{
		"greedy":                {iface.SamplerParams{IgnoreEOS: true}, nil, []int{0, 1, 2, 3}},
		"penalties":             {iface.SamplerParams{RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.4, FrequencyPenalty: 0.2, IgnoreEOS: true}, nil, []int{0, 1, 2, 3}},
		"kv per slot":           {iface.SamplerParams{IgnoreEOS: true}, map[string]string{llamaopt.OptKVUnified: "false"}, []int{0, 1, 2, 3}},
		"kv per slot, one idle": {iface.SamplerParams{IgnoreEOS: true}, map[string]string{llamaopt.OptKVUnified: "false"}, []int{3, 0, 1}},
	} {
		t.Run(name, func(t *testing.T) {
			sp := tc.sp
			b := load(t, tiny(t), 4, tc.opts)
			alone := map[int][]int32{}
			for s, p := range prompts {
				prefill(t, b, s, p)
				alone[s], _ = decode(t, b, s, 48, sp)
			}
			e := b.eng.Load()
			prompt := map[int][]int32{}
			for s, p := range prompts {
				prefill(t, b, s, p)
				prompt[s] = e.cells.Slots[s].Seq()
			}
			before := e.sched.Steps.Load()
			got := decodeAll(t, b, tc.slots, 48, sp)
			n := len(tc.slots) * 48
			steps := e.sched.Steps.Load() - before
			for _, s := range tc.slots {
				sameGreedy(t, b, s, prompt[s], got[s], alone[s], sp)
			}
			t.Logf("%d tokens in %d steps, at most %d decoders a step", n, steps, e.sched.Widest.Load())
			if e.sched.Widest.Load() < 2 || steps >= uint64(n) {
				t.Errorf("the decodes did not share steps: %d steps for %d tokens", steps, n)
			}
		})
	}
}

// TestPromptReuse: a prefill sharing a prefix with the slot's sequence keeps
// those cells, and the slot then holds and decodes exactly what a fresh
// prefill of the whole prompt gives (with reference kernels: the fresh
// prefill's one batch and the reused prompt's rest differ in size).
func TestPromptReuse(t *testing.T) {
	b := load(t, tiny(t), 2, nil)
	referenceKernels(t, b)
	base := tokensOf(t, b, strings.Repeat("a long shared system prompt ", 8))
	first := append(slices.Clone(base), tokensOf(t, b, " first question")...)
	second := append(slices.Clone(base), tokensOf(t, b, " another question")...)
	if r := prefillTokens(t, b, 0, first); r.Reused != 0 {
		t.Fatalf("reused %d of an empty slot", r.Reused)
	}
	decode(t, b, 0, 5, iface.SamplerParams{})
	r := prefillTokens(t, b, 0, second)
	if want := iface.CommonPrefix(first, second); r.Reused != want {
		t.Fatalf("reused %d tokens, the prompts share %d", r.Reused, want)
	}
	got, _ := decode(t, b, 0, 20, iface.SamplerParams{IgnoreEOS: true})
	reused := stateOf(t, b, 0, 1<<20)

	fresh := prefillTokens(t, b, 1, second)
	closeLogits(t, b, "the reply's logits against a fresh prefill's", r.Logits, fresh.Logits)
	want, _ := decode(t, b, 1, 20, iface.SamplerParams{IgnoreEOS: true})
	sameState(t, b, "the reused slot's state against a fresh prefill's", normSeq(reused), normSeq(stateOf(t, b, 1, 1<<20)))
	sameGreedy(t, b, 1, second, got, want, iface.SamplerParams{IgnoreEOS: true})
	// The same prompt again reuses all but its last token.
	if r := prefillTokens(t, b, 1, second); r.Reused != len(second)-1 {
		t.Errorf("the same prompt again reused %d of %d", r.Reused, len(second))
	}
}

func tokensOf(t *testing.T, b *Backend, text string) []int32 {
	t.Helper()
	toks, err := b.eng.Load().model.tokenize(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) > 0 && toks[0] == b.eng.Load().model.bos {
		toks = toks[1:]
	}
	return toks
}

// TestTextPrompt: a raw text prompt is tokenized by the backend as the
// model asks (BOS added, special tokens parsed).
func TestTextPrompt(t *testing.T) {
	b := load(t, tiny(t), 1, nil)
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Text: "<|im_start|>user\nhi"})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := b.eng.Load().model.tokenize("<|im_start|>user\nhi")
	if !slices.Equal(res.Slot.Tokens, want) || !slices.Contains(want, 3) {
		t.Fatalf("text prompt tokens %v, want %v with <|im_start|> (3)", res.Slot.Tokens, want)
	}
}

// TestSamplerRequests: a ban through logit_bias moves greedy decoding off
// the token, ignore_eos never emits an end of generation, log-probabilities
// come only when asked and agree with the alternatives.
func TestSamplerRequests(t *testing.T) {
	b := load(t, tiny(t), 1, nil)
	ctx := context.Background()
	prefill(t, b, 0, story)
	greedyToks, _ := decode(t, b, 0, 1, iface.SamplerParams{})
	prefill(t, b, 0, story)
	banned, _ := decode(t, b, 0, 1, iface.SamplerParams{LogitBias: map[int32]float32{greedyToks[0]: float32(math.Inf(-1))}})
	if banned[0] == greedyToks[0] {
		t.Errorf("banned token %d still chosen", banned[0])
	}

	prefill(t, b, 0, story)
	var toks []iface.Token
	res, err := b.Decode(ctx, iface.DecodeRequest{Slot: 0, NPredict: 30, Logprobs: true, NProbs: 3, Sampler: iface.SamplerParams{IgnoreEOS: true}},
		func(tok iface.Token) error { toks = append(toks, tok); return nil })
	if err != nil || res.TokensGenerated != 30 {
		t.Fatalf("%+v %v", res, err)
	}
	for i, tok := range toks {
		if b.eng.Load().model.IsEOG(tok.ID) {
			t.Fatalf("token %d is an end of generation despite ignore_eos", i)
		}
		if len(tok.Top) != 3 || tok.Logprob > 0 || tok.Logprob < tok.Top[2].Logprob-1e-4 ||
			tok.Top[0].Logprob < tok.Top[1].Logprob || tok.Top[1].Logprob < tok.Top[2].Logprob {
			t.Fatalf("token %d: %+v", i, tok)
		}
		if tok.Top[0].ID != tok.ID && !b.eng.Load().model.IsEOG(tok.Top[0].ID) {
			t.Fatalf("greedy token %d is not the most likely %+v", tok.ID, tok.Top)
		}
	}
	prefill(t, b, 0, story)
	if _, err := b.Decode(ctx, iface.DecodeRequest{Slot: 0, NPredict: 3}, func(tok iface.Token) error {
		if tok.Logprob != 0 || tok.Top != nil {
			return fmt.Errorf("log-probabilities nobody asked for: %+v", tok)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeCancelled: a caller that goes away mid-decode leaves the batch at
// once; its slot keeps the tokens it received, decodes on from there as if
// it had stopped on its own, and the other slots never noticed.
func TestDecodeCancelled(t *testing.T) {
	b := load(t, tiny(t), 2, nil)
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, b, 0, "the survivor")
	prefill(t, b, 1, "the one that goes away")
	base := slotInfo(t, b, 1).NPast
	var wg sync.WaitGroup
	var survivor []int32
	wg.Go(func() { survivor, _ = decode(t, b, 0, 120, sp) })

	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	start := time.Now()
	_, err := b.Decode(ctx, iface.DecodeRequest{Slot: 1, NPredict: 1000, Sampler: sp}, func(iface.Token) error {
		if n++; n == 7 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled decode: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the cancelled decode took %v to leave", d)
	}
	si := slotInfo(t, b, 1)
	if si.NPast < base+n || si.NPast > base+n+1 {
		t.Fatalf("slot holds %d tokens after %d emitted on %d", si.NPast, n, base)
	}
	wg.Wait()
	if len(survivor) != 120 {
		t.Fatalf("the other slot decoded %d of 120", len(survivor))
	}
	// The kept sequence decodes as a fresh prefill of it does.
	kept := si.Tokens
	got, _ := decode(t, b, 1, 10, sp)
	prefillTokens(t, b, 0, kept)
	want, _ := decode(t, b, 0, 10, sp)
	if !slices.Equal(got, want) {
		t.Errorf("after the cancel %v, fresh %v", got, want)
	}
}

// TestRestoredJoinsBatch: a state restored while another slot decodes joins
// the batch and decodes as its source did; the STATE_GET of a third slot,
// whose reader stalls, does not stop the decoding.
func TestRestoredJoinsBatch(t *testing.T) {
	t.Run("unified", func(t *testing.T) { testRestoredJoinsBatch(t, nil) })
	t.Run("kv per slot", func(t *testing.T) { testRestoredJoinsBatch(t, map[string]string{llamaopt.OptKVUnified: "false"}) })
}

func testRestoredJoinsBatch(t *testing.T, opts map[string]string) {
	b := load(t, tiny(t), 3, opts)
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, b, 2, story)
	state := stateOf(t, b, 2, 1<<20)
	toks := slotInfo(t, b, 2).Tokens
	want, _ := decode(t, b, 2, 40, sp)
	prefill(t, b, 2, story)

	prefill(t, b, 0, "the slot decoding throughout")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got0 []int32
	wg.Go(func() {
		_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 400, Sampler: sp}, func(tok iface.Token) error {
			mu.Lock()
			got0 = append(got0, tok.ID)
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	// A STATE_GET whose reader stalls on its first chunk: slot 0 goes on.
	stall := &stallWriter{release: make(chan struct{}), first: make(chan struct{})}
	wg.Go(func() {
		if _, err := b.StateGet(context.Background(), 2, 64<<10, stall); err != nil {
			t.Error(err)
		}
	})
	<-stall.first
	mu.Lock()
	before := len(got0)
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		moved := len(got0) - before
		mu.Unlock()
		if moved >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot 0 decoded %d tokens while a STATE_GET waited on its reader", moved)
		}
		time.Sleep(time.Millisecond)
	}
	close(stall.release)

	if _, err := b.StatePut(context.Background(), 1, toks, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	got1, _ := decode(t, b, 1, 40, sp)
	wg.Wait()
	if !slices.Equal(got1, want) {
		t.Errorf("restored slot decoded %v, its source %v", got1, want)
	}
}

// stallWriter blocks its first Write until release closes.
type stallWriter struct {
	once    sync.Once
	first   chan struct{}
	release chan struct{}
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.first); <-w.release })
	return io.Discard.Write(p)
}

// TestKVCapacity: with the cells split per slot a prompt over a slot's share
// is refused naming it; shared, a prompt that does not fit the free cells is
// refused naming both counts; INFO tells which.
func TestKVCapacity(t *testing.T) {
	split := load(t, tiny(t), 4, map[string]string{llamaopt.OptNCtx: "256", llamaopt.OptKVUnified: "false"})
	info, _ := split.Info(context.Background())
	if info.KVUnified || info.SlotCtx() != 64 {
		t.Fatalf("split cache: %+v", info)
	}
	if e := split.eng.Load(); e.ctx.nStream != 5 || e.ctx.NCtxSeq() < 64 {
		t.Fatalf("split cache: %d KV streams of %d cells, want 5 (4 slots and the scratch sequence) of 64 or more", e.ctx.nStream, e.ctx.NCtxSeq())
	}
	_, err := split.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: make([]int32, 65)})
	if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "a slot holds 64 (n_ctx 256 split across 4 slots)") {
		t.Fatalf("prompt over a slot's share: %v", err)
	}
	prefillTokens(t, split, 0, make([]int32, 60))
	_, res := decode(t, split, 0, 20, iface.SamplerParams{IgnoreEOS: true})
	if res.StopReason != StopNTokensLimit || res.NPast != 64 {
		t.Fatalf("decode to a slot's share: %+v", res)
	}

	shared := load(t, tiny(t), 2, map[string]string{llamaopt.OptNCtx: "256"})
	prefillTokens(t, shared, 0, make([]int32, 200))
	_, err = shared.Prefill(context.Background(), iface.PrefillRequest{Slot: 1, Tokens: make([]int32, 100)})
	if !errors.Is(err, iface.ErrNoRoom) || !strings.Contains(err.Error(), "needs 100 KV cells, 56 free (shared by all slots") {
		t.Fatalf("prompt over the free cells: %v", err)
	}
}

// TestContextShift: with context_shift a slot that fills its cells drops
// the older half after n_keep and decodes on; the sequence stays within the
// slot and starts with what was kept.
func TestContextShift(t *testing.T) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptNCtx: "256", llamaopt.OptKVUnified: "false", llamaopt.OptContextShift: "true"})
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(10 + i%200)
	}
	prefillTokens(t, b, 0, prompt)
	var ids []int32
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 100, NKeep: 4, Sampler: iface.SamplerParams{IgnoreEOS: true}},
		func(tok iface.Token) error { ids = append(ids, tok.ID); return nil })
	if err != nil || res.TokensGenerated != 100 || res.StopReason != StopLength {
		t.Fatalf("decode through a shift: %+v %v", res, err)
	}
	si := slotInfo(t, b, 0)
	if si.NPast > 128 || !slices.Equal(si.Tokens[:4], prompt[:4]) || !slices.Equal(si.Tokens[len(si.Tokens)-10:], ids[len(ids)-10:]) {
		t.Fatalf("after the shift: n_past %d, starts %v, ends %v (last generated %v)", si.NPast, si.Tokens[:4],
			si.Tokens[len(si.Tokens)-10:], ids[len(ids)-10:])
	}
	if e := b.eng.Load(); e.ctx.nPos(0) != si.NPast {
		t.Fatalf("KV holds %d positions, the slot %d tokens", e.ctx.nPos(0), si.NPast)
	}
	// The shifted state saves and restores like any.
	state := stateOf(t, b, 0, 1<<20)
	if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
}

// TestCacheReuse: with cache_reuse a prompt that drops part of the slot's
// sequence (an early turn cut from a conversation) keeps the chunk after it,
// its cells moved into place; the slot then holds exactly the prompt and
// decodes on.
func TestCacheReuse(t *testing.T) {
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptCacheReuse: "8"})
	head := tokensOf(t, b, "a shared beginning")
	mid := tokensOf(t, b, strings.Repeat(" the long middle part that stays", 3))
	tail := tokensOf(t, b, " and an end")
	prefillTokens(t, b, 0, slices.Concat(head, tokensOf(t, b, " an early turn, since dropped"), mid, tail))
	prompt := slices.Concat(head, mid, tokensOf(t, b, " new end"))
	r := prefillTokens(t, b, 0, prompt)
	if r.Reused < len(head)+len(mid) {
		t.Fatalf("reused %d tokens, want at least the prefix %d and the middle %d", r.Reused, len(head), len(mid))
	}
	si := slotInfo(t, b, 0)
	if !slices.Equal(si.Tokens, prompt) || b.eng.Load().ctx.nPos(0) != len(prompt) {
		t.Fatalf("slot holds %d tokens (%d positions), the prompt %d", si.NPast, b.eng.Load().ctx.nPos(0), len(prompt))
	}
	if _, res := decode(t, b, 0, 10, iface.SamplerParams{IgnoreEOS: true}); res.TokensGenerated != 10 {
		t.Fatalf("decode after reuse: %+v", res)
	}
}

// TestChatTemplateOptions: chat_template_file replaces the model's
// template, reasoning and the request's kwargs drive enable_thinking (and
// Tokenize says when the prompt opens a reasoning block), tools reach the
// template, and a template's raise_exception is the request's error.
func TestChatTemplateOptions(t *testing.T) {
	file := t.TempDir() + "/t.jinja"
	tmpl := `{%- if tools %}[{{ tools | length }} tools]{% endif -%}
{%- for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking %}<think>
{% endif %}{% endif %}`
	if err := os.WriteFile(file, []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptChatTemplateFile: file, llamaopt.OptReasoning: "on"})
	ctx := context.Background()
	msgs := []iface.Message{{Role: "user", Content: "hi"}}
	p, err := b.Tokenize(ctx, iface.PrefillRequest{Messages: msgs})
	if err != nil || !p.OpensThinking {
		t.Fatalf("reasoning on: %+v %v", p, err)
	}
	want, _ := b.eng.Load().model.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
	if !slices.Equal(p.Tokens, want) {
		t.Errorf("tokens %v, want %v", p.Tokens, want)
	}
	if p, err := b.Tokenize(ctx, iface.PrefillRequest{Messages: msgs, TemplateKwargs: `{"enable_thinking":false}`}); err != nil || p.OpensThinking {
		t.Errorf("the request's kwargs: %+v %v", p, err)
	}
	withTools, err := b.Tokenize(ctx, iface.PrefillRequest{Messages: msgs, Tools: []string{`{"type":"function","function":{"name":"f"}}`}})
	if err != nil || len(withTools.Tokens) <= len(p.Tokens) {
		t.Errorf("tools: %+v %v", withTools, err)
	}
	_, err = b.Prefill(ctx, iface.PrefillRequest{Messages: []iface.Message{{Role: "bad", Content: "x"}}})
	if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "no bad roles") {
		t.Errorf("raise_exception: %v", err)
	}
	if _, err := b.Tokenize(ctx, iface.PrefillRequest{Messages: msgs, TemplateKwargs: `[1]`}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("kwargs that are not an object: %v", err)
	}

	builtin := load(t, tiny(t), 1, map[string]string{llamaopt.OptJinja: "false"})
	if _, err := builtin.Tokenize(ctx, iface.PrefillRequest{Messages: msgs, Tools: []string{`{}`}}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("tools without Jinja: %v", err)
	}
	if _, err := builtin.Tokenize(ctx, iface.PrefillRequest{Messages: msgs}); err != nil {
		t.Errorf("llama.cpp's matcher: %v", err)
	}
	if _, err := New(testLogger()).Load(ctx, iface.LoadRequest{Model: tiny(t), NSlots: 1,
		Options: map[string]string{llamaopt.OptChatTemplateFile: file + ".missing"}}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("a missing template file: %v", err)
	}
}

// TestLastUnevaluated: a decode asked to end with its last token
// unevaluated (an HTTP completion's, as llama-server's end) sends the same
// tokens, alone or batched, ends a step sooner, and leaves the slot holding
// the tokens before the last with the logits that token was sampled from:
// a decode that continues the slot samples that token again first.
func TestLastUnevaluated(t *testing.T) {
	b := load(t, tiny(t), 2, nil)
	ref := load(t, tiny(t), 2, nil)
	referenceKernels(t, b)
	referenceKernels(t, ref)
	sp := iface.SamplerParams{IgnoreEOS: true}
	for _, n := range []int{1, 5} {
		prefill(t, b, 0, prompts[0])
		prefill(t, ref, 0, prompts[0])
		before := len(slotInfo(t, b, 0).Tokens)
		steps := b.eng.Load().sched.Steps.Load()
		var got []int32
		res, err := b.Decode(t.Context(), iface.DecodeRequest{Slot: 0, NPredict: n, Sampler: sp, LastUnevaluated: true},
			func(tok iface.Token) error { got = append(got, tok.ID); return nil })
		if err != nil {
			t.Fatal(err)
		}
		want, _ := decode(t, ref, 0, n, sp)
		if !slices.Equal(got, want) {
			t.Fatalf("n %d: %v, want %v", n, got, want)
		}
		if res.NPast != before+n-1 || len(slotInfo(t, b, 0).Tokens) != before+n-1 || res.StopReason != StopLength {
			t.Errorf("n %d: the slot holds %d tokens (result %+v), want the %d before the last", n, len(slotInfo(t, b, 0).Tokens), res, before+n-1)
		}
		if took := b.eng.Load().sched.Steps.Load() - steps; took != uint64(n-1) {
			t.Errorf("n %d: %d steps, want %d (the last token is not evaluated)", n, took, n-1)
		}
		// A decode that continues the slot samples the left-out token
		// again from those logits, then goes on as the reference, which
		// evaluated it.
		next, _ := decode(t, b, 0, 6, sp)
		refNext, _ := decode(t, ref, 0, 5, sp)
		if wantNext := append([]int32{got[n-1]}, refNext...); !slices.Equal(next, wantNext) {
			t.Errorf("n %d: the next decode %v, want %v", n, next, wantNext)
		}
	}
	// With its prompt (the HTTP path): the prompt's last step samples the
	// one token, and the job ends there.
	prefill(t, ref, 1, prompts[1])
	toks := slotInfo(t, ref, 1).Tokens
	want, _ := decode(t, ref, 1, 1, sp)
	var got []int32
	res, err := b.Decode(t.Context(), iface.DecodeRequest{Slot: 1, NPredict: 1, Sampler: sp, LastUnevaluated: true,
		Prompt: &iface.PrefillRequest{Tokens: toks}}, func(tok iface.Token) error { got = append(got, tok.ID); return nil })
	if err != nil || !slices.Equal(got, want) || res.NPast != len(toks) || len(slotInfo(t, b, 1).Tokens) != len(toks) {
		t.Errorf("with its prompt: %v (%v), want %v; the slot holds %d tokens (result %+v), want the prompt's %d",
			got, err, want, len(slotInfo(t, b, 1).Tokens), res, len(toks))
	}
}
