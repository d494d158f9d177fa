//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Speculative decoding: the tokens are those of decoding without a draft,
// alone and batched, with penalties too; the drafts are verified and
// mostly accepted when the draft model is the target or a close copy.

// specDrafts are the ways of drafting: the target as its own draft model
// (nearly every greedy draft token accepted), its Q8_0 copy from the same
// seed, and llama.cpp's n-gram lookups of the slot's own tokens (greedy
// decoding of the random-weight model falls into loops they find).
func specDrafts(t *testing.T) map[string]map[string]string {
	q8 := gguf.Tiny()
	q8.Type = gguf.WeightQ8_0
	return map[string]map[string]string{
		"same":              {llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways},
		"q8_0":              {llamaopt.OptDraftModel: modelFile(t, "tiny-q8_0", q8), llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways},
		"same, kv per slot": {llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways, llamaopt.OptKVUnified: "false"},
		"ngram": {llamaopt.OptSpecType: "ngram-simple,ngram-map-k", llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways, llamaopt.OptSpecNgramSimpleSizeN: "3",
			llamaopt.OptSpecNgramSimpleSizeM: "6", llamaopt.OptSpecNgramMapSizeN: "3", llamaopt.OptSpecNgramMapSizeM: "6"},
	}
}

func specRate(b *Backend) (drafted, accepted uint64) {
	sp := b.eng.Load().spec
	return sp.Drafted.Load(), sp.Accepted.Load()
}

func TestSpecGreedyEqual(t *testing.T) {
	plains := map[bool]*Backend{true: load(t, tiny(t), 4, nil), false: load(t, tiny(t), 4, map[string]string{llamaopt.OptKVUnified: "false"})}
	for _, p := range plains {
		referenceKernels(t, p)
	}
	for name, opts := range specDrafts(t) {
		plain := plains[opts[llamaopt.OptKVUnified] != "false"]
		for sname, sp := range map[string]iface.SamplerParams{
			"greedy":    {IgnoreEOS: true},
			"penalties": {RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.4, FrequencyPenalty: 0.2, IgnoreEOS: true},
		} {
			t.Run(name+"/"+sname, func(t *testing.T) {
				spec := load(t, tiny(t), 4, opts)
				referenceKernels(t, spec)
				for s, p := range prompts {
					prefill(t, plain, s, p)
					prefill(t, spec, s, p)
					want, _ := decode(t, plain, s, 48, sp)
					got, _ := decode(t, spec, s, 48, sp)
					sameGreedy(t, spec, s, spec.eng.Load().cells.Slots[s].Seq()[:len(spec.eng.Load().cells.Slots[s].Seq())-len(got)], got, want, sp)
				}
				aloneDrafted, aloneAccepted := specRate(spec)
				slots := []int{0, 1, 2, 3}
				for s, p := range prompts {
					prefill(t, plain, s, p)
					prefill(t, spec, s, p)
				}
				want := decodeAll(t, plain, slots, 48, sp)
				got := decodeAll(t, spec, slots, 48, sp)
				for _, s := range slots {
					if !slices.Equal(got[s], want[s]) {
						t.Errorf("batched slot %d: %v\nwant %v", s, got[s], want[s])
					}
				}
				drafted, accepted := specRate(spec)
				t.Logf("alone: %d of %d draft tokens accepted (%.2f); 4 slots batched: %d of %d (%.2f)",
					aloneAccepted, aloneDrafted, float64(aloneAccepted)/float64(max(aloneDrafted, 1)),
					accepted-aloneAccepted, drafted-aloneDrafted, float64(accepted-aloneAccepted)/float64(max(drafted-aloneDrafted, 1)))
				if aloneDrafted == 0 || drafted == aloneDrafted {
					t.Fatalf("no drafts: %d alone, %d batched", aloneDrafted, drafted-aloneDrafted)
				}
				// The draft model drafts without the penalties, so only plain
				// greedy decoding of the target as its own draft agrees throughout.
				if strings.HasPrefix(name, "same") && sname == "greedy" && float64(accepted) < 0.9*float64(drafted) {
					t.Errorf("the target as its own draft: only %d of %d draft tokens accepted", accepted, drafted)
				}
			})
		}
	}
}

// TestSpecState: a STATE_GET of a slot that decoded with drafts moves
// exactly the target's sequence (the tokens emitted, no draft cells), and a
// STATE_PUT into a speculating engine decodes on as without a draft: the
// draft context re-derives that slot's cells from the tokens at its next
// step.
func TestSpecState(t *testing.T) {
	plain := load(t, tiny(t), 2, nil)
	spec := load(t, tiny(t), 2, map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, spec, 0, prompts[1])
	prefill(t, plain, 0, prompts[1])
	got, res := decode(t, spec, 0, 30, sp)
	want, plainRes := decode(t, plain, 0, 30, sp)
	if !slices.Equal(got, want) {
		t.Fatalf("decode: %v\nwant %v", got, want)
	}
	if res.DraftTokens == 0 || res.DraftAccepted > res.DraftTokens || plainRes.DraftTokens != 0 {
		t.Errorf("the decode's draft tokens: %d accepted of %d (without drafts %d)", res.DraftAccepted, res.DraftTokens, plainRes.DraftTokens)
	}
	si := slotInfo(t, spec, 0)
	state := stateOf(t, spec, 0, 1<<20)
	ref := stateOf(t, plain, 0, 1<<20)
	if len(state) != len(ref) || len(si.Tokens) != len(slotInfo(t, plain, 0).Tokens) {
		t.Fatalf("state of %d bytes for %d tokens, without drafts %d bytes", len(state), len(si.Tokens), len(ref))
	}
	if _, err := spec.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	before, _ := specRate(spec)
	got, _ = decode(t, spec, 1, 30, sp)
	want, _ = decode(t, plain, 1, 30, sp)
	if !slices.Equal(got, want) {
		t.Fatalf("after STATE_PUT: %v\nwant %v", got, want)
	}
	if after, _ := specRate(spec); after == before {
		t.Fatal("the restored slot decoded without drafts")
	}
}

// TestSpecBatchShrinks: with draft_batch_max 8 a slot alone drafts up to
// draft_max, while four decoding together (8/4 - 1 = 1 token each) draft
// one token at most, and the tokens stay those without drafts.
func TestSpecBatchShrinks(t *testing.T) {
	plain := load(t, tiny(t), 4, nil)
	spec := load(t, tiny(t), 4, map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways, llamaopt.OptDraftBatchMax: "8"})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	e := spec.eng.Load()
	prefill(t, spec, 0, prompts[0])
	before := e.sched.StepTokens.Load()
	steps := e.sched.Steps.Load()
	decode(t, spec, 0, 40, sp)
	if widest := float64(e.sched.StepTokens.Load()-before) / float64(e.sched.Steps.Load()-steps); widest < 3 {
		t.Errorf("alone: %.1f tokens a step, want drafts of several", widest)
	}
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
	}
	slots := []int{0, 1, 2, 3}
	want := decodeAll(t, plain, slots, 40, sp)
	before, steps = e.sched.StepTokens.Load(), e.sched.Steps.Load()
	got := decodeAll(t, spec, slots, 40, sp)
	for _, s := range slots {
		if !slices.Equal(got[s], want[s]) {
			t.Errorf("slot %d: %v\nwant %v", s, got[s], want[s])
		}
	}
	// A step of four decoders takes at most 4 × 2 tokens.
	perStep := float64(e.sched.StepTokens.Load()-before) / float64(e.sched.Steps.Load()-steps)
	t.Logf("four slots: %.2f tokens a step", perStep)
	if perStep > 8 {
		t.Errorf("four slots: %.2f tokens a step, above draft_batch_max 8", perStep)
	}
}

// TestSpecRequest: a request's speculative.n_max 0 decodes without drafts,
// n_max 2 with drafts of two at most, the same tokens either way; a p_min
// other than the load's is refused, since llama.cpp drafts at one p_min.
func TestSpecRequest(t *testing.T) {
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, b)
	e := b.eng.Load()
	var want []int32
	for _, tc := range []struct {
		nMax  int
		perSt float64 // the most tokens a step may take
	}{{0, 1}, {2, 3}, {-1, 7}} {
		sp := iface.NoSpeculativeOverride
		sp.NMax = tc.nMax
		prefill(t, b, 0, prompts[1])
		steps, toks := e.sched.Steps.Load(), e.sched.StepTokens.Load()
		var got []int32
		res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 40, Sampler: iface.SamplerParams{IgnoreEOS: true}, Speculative: &sp},
			func(tok iface.Token) error { got = append(got, tok.ID); return nil })
		if err != nil {
			t.Fatal(err)
		}
		perStep := float64(e.sched.StepTokens.Load()-toks) / float64(e.sched.Steps.Load()-steps)
		t.Logf("n_max %d: %d of %d draft tokens accepted, %.2f tokens a step", tc.nMax, res.DraftAccepted, res.DraftTokens, perStep)
		switch {
		case want == nil:
			want = got
		case !slices.Equal(got, want):
			t.Errorf("n_max %d: %v\nwant %v", tc.nMax, got, want)
		}
		if (tc.nMax == 0) != (res.DraftTokens == 0) || perStep > tc.perSt {
			t.Errorf("n_max %d: %d draft tokens, %.2f tokens a step (at most %.0f)", tc.nMax, res.DraftTokens, perStep, tc.perSt)
		}
	}
	sp := iface.NoSpeculativeOverride
	sp.PMin = 0.5
	if _, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 4, Speculative: &sp}, func(iface.Token) error { return nil }); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("p_min 0.5 against draft_p_min 0: %v", err)
	}
}

// TestSpecSeeded: above temperature 0 a seeded decode is the same with
// drafts as without, alone (the draw's number is a function of the seed and
// the position, and each token is sampled from its own row), while the
// draft model's greedy drafts are accepted less often.
func TestSpecSeeded(t *testing.T) {
	plain := load(t, tiny(t), 1, nil)
	spec := load(t, tiny(t), 1, map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{Temperature: 0.8, TopK: 40, TopP: 0.95, Seed: 7, IgnoreEOS: true}
	drafted := 0
	for s, p := range prompts {
		prefill(t, plain, 0, p)
		prefill(t, spec, 0, p)
		want, _ := decode(t, plain, 0, 48, sp)
		got, res := decode(t, spec, 0, 48, sp)
		if !slices.Equal(got, want) {
			t.Errorf("prompt %d: %v\nwant %v", s, got, want)
		}
		t.Logf("prompt %d: %d of %d draft tokens accepted", s, res.DraftAccepted, res.DraftTokens)
		drafted += res.DraftTokens
	}
	if drafted == 0 {
		t.Error("no drafts")
	}
}

// TestSpecContextShift: a slot that fills its cells and shifts its context
// decodes the same with drafts (they shrink to nothing at the edge, and the
// draft context re-derives the shifted sequence) as without.
func TestSpecContextShift(t *testing.T) {
	opts := map[string]string{llamaopt.OptNCtx: "256", llamaopt.OptContextShift: "true"}
	plain := load(t, tiny(t), 1, opts)
	specOpts := map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways}
	for k, v := range opts {
		specOpts[k] = v
	}
	spec := load(t, tiny(t), 1, specOpts)
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, plain, 0, prompts[1])
	prefill(t, spec, 0, prompts[1])
	want, _ := decode(t, plain, 0, 400, sp)
	got, res := decode(t, spec, 0, 400, sp)
	if !slices.Equal(got, want) {
		t.Errorf("first difference at %d of %d", iface.CommonPrefix(got, want), len(want))
	}
	if len(got) != 400 || res.DraftTokens == 0 {
		t.Errorf("%d tokens, %d drafted", len(got), res.DraftTokens)
	}
	t.Logf("%d of %d draft tokens accepted across the shifts", res.DraftAccepted, res.DraftTokens)
}

// TestSpecLoadRefusals: a draft model whose vocabulary differs by more
// than llama.cpp allows (128 tokens) and a model whose memory cannot drop a
// rejected draft are refused at load, by llama.cpp's check and ours, as bad
// requests.
func TestSpecLoadRefusals(t *testing.T) {
	other := gguf.Tiny()
	other.Vocab = 1024
	for name, tc := range map[string]struct{ model, draft string }{
		"vocabulary": {tiny(t), modelFile(t, "tiny-vocab1024", other)},
	} {
		_, err := New(testLogger()).Load(context.Background(), iface.LoadRequest{Model: tc.model, NSlots: 1,
			Options: map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "512", llamaopt.OptDraftModel: tc.draft}})
		if !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: %v, want a bad request", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}

// TestSpecSlidingWindow: a sliding-window model (window 32) decodes 200
// tokens the same with drafts as without, as its window caches move on past
// rejected drafts (llama-server speculates on these models too).
func TestSpecSlidingWindow(t *testing.T) {
	m := modelFile(t, "tiny-gemma3", gguf.TinyGemma3())
	plain := load(t, m, 2, nil)
	spec := load(t, m, 2, map[string]string{llamaopt.OptDraftModel: m, llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	for s, p := range prompts[:2] {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
		want, _ := decode(t, plain, s, 200, sp)
		got, res := decode(t, spec, s, 200, sp)
		if !slices.Equal(got, want) {
			t.Errorf("slot %d: first difference at %d", s, iface.CommonPrefix(got, want))
		}
		if res.DraftTokens == 0 {
			t.Errorf("slot %d: no drafts", s)
		}
		t.Logf("slot %d: %d of %d draft tokens accepted", s, res.DraftAccepted, res.DraftTokens)
	}
}

// TestSpecHybrid: on the nodes' hybrid architecture (qwen35moe), whose
// recurrent state cannot be cut back, a draft model with a plain cache (the
// tiny llama: another model, most of its drafts rejected) and n-gram drafts
// decode the tokens of decoding without drafts (up to the GPU oracle's tie
// rule: the kept tokens are evaluated again in a batch of their own), alone
// and four slots batched: each rejected draft is undone by restoring the
// state saved before the step and evaluating the kept tokens again. A
// STATE_GET after such a decode moves exactly the emitted sequence: an
// engine without drafts decodes on from it as the source does.
func TestSpecHybrid(t *testing.T) {
	target := modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE())
	plain := load(t, target, 4, nil)
	referenceKernels(t, plain)
	sp := iface.SamplerParams{IgnoreEOS: true}
	for name, c := range map[string]struct {
		opts map[string]string
		n    int // tokens a decode: the greedy text loops within 200, which n-grams find
	}{
		"draft model": {map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways}, 48},
		"ngram": {map[string]string{llamaopt.OptSpecType: "ngram-simple,ngram-map-k", llamaopt.OptDraftMax: "6", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways, llamaopt.OptSpecNgramSimpleSizeN: "2",
			llamaopt.OptSpecNgramSimpleSizeM: "6", llamaopt.OptSpecNgramMapSizeN: "2", llamaopt.OptSpecNgramMapSizeM: "6"}, 200},
	} {
		t.Run(name, func(t *testing.T) {
			opts := c.opts
			spec := load(t, target, 4, opts)
			referenceKernels(t, spec)
			aloneDrafted, aloneAccepted := aloneThenBatched(t, plain, spec, c.n, sp)
			drafted, accepted := specRate(spec)
			t.Logf("alone: %d of %d draft tokens accepted; 4 slots batched: %d of %d", aloneAccepted, aloneDrafted,
				accepted-aloneAccepted, drafted-aloneDrafted)
			if aloneDrafted == 0 || drafted == aloneDrafted || accepted == drafted {
				t.Fatalf("want drafts alone and batched, some rejected: %d of %d accepted (%d alone)", accepted, drafted, aloneDrafted)
			}

			// The snapshots a drafting context keeps (n_rs_seq) are not in
			// its states: the layout is a plain context's, and a state
			// moves into one.
			pi, _ := plain.Info(context.Background())
			spi, _ := spec.Info(context.Background())
			if pi.StateLayout != spi.StateLayout {
				t.Fatalf("state layout with drafts %s, without %s", spi.StateLayout, pi.StateLayout)
			}
			si := slotInfo(t, spec, 0)
			state := stateOf(t, spec, 0, 1<<20)
			if _, err := plain.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
				t.Fatal(err)
			}
			got0, _ := decode(t, spec, 0, 24, sp)
			want0, _ := decode(t, plain, 1, 24, sp)
			sameGreedy(t, plain, 1, si.Tokens, want0, got0, sp)
		})
	}
}

// aloneThenBatched decodes n tokens after each of the prompts on plain and
// spec, one slot at a time, then after the prompts again on the four slots
// batched, and checks that spec's tokens are plain's (sameGreedy); it
// returns spec's draft counts after the decodes one at a time.
func aloneThenBatched(t *testing.T, plain, spec *Backend, n int, sp iface.SamplerParams) (drafted, accepted uint64) {
	t.Helper()
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
		want, _ := decode(t, plain, s, n, sp)
		got, _ := decode(t, spec, s, n, sp)
		seq := spec.eng.Load().cells.Slots[s].Seq()
		sameGreedy(t, spec, s, seq[:len(seq)-len(got)], got, want, sp)
	}
	drafted, accepted = specRate(spec)
	slots := []int{0, 1, 2, 3}
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
	}
	want := decodeAll(t, plain, slots, n, sp)
	got := decodeAll(t, spec, slots, n, sp)
	for _, s := range slots {
		seq := spec.eng.Load().cells.Slots[s].Seq()
		sameGreedy(t, spec, s, seq[:len(seq)-len(got[s])], got[s], want[s], sp)
	}
	return drafted, accepted
}

// TestSpecHybridReplay: drafts of a chosen acceptance (the tokens decoding
// without drafts gives, every third draft wrong from its second token, every
// fifth from its first) on the hybrid target: accepted in full, in part and
// not at all, alone and four slots batched, each undone by rollback and
// replay where rejected, and the tokens are those without drafts.
func TestSpecHybridReplay(t *testing.T) {
	target := modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE())
	plain := load(t, target, 4, nil)
	spec := load(t, target, 4, map[string]string{llamaopt.OptSpecType: "ngram-simple", llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	const n = 40
	slots := []int{0, 1, 2, 3}
	wants, starts := map[int][]int32{}, map[int]int{}
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
		starts[s] = len(slotInfo(t, spec, s).Tokens)
	}
	wants = decodeAll(t, plain, slots, n, sp)
	var mu sync.Mutex
	step := 0
	testDrafts = func(slot int, seq []int32, pending int32, max int) []int32 {
		mu.Lock()
		defer mu.Unlock()
		step++
		g := len(seq) - starts[slot] + 1 // the index in want of the token after pending
		w := wants[slot]
		if g >= len(w) {
			return nil
		}
		d := slices.Clone(w[g:min(len(w), g+max)])
		switch {
		case step%5 == 0:
			d[0] ^= 1
		case step%3 == 0 && len(d) > 1:
			d[1] ^= 1
		}
		return d
	}
	defer func() { testDrafts = nil }()
	for _, batched := range []bool{false, true} {
		if batched {
			for s, p := range prompts {
				prefill(t, spec, s, p)
			}
		}
		before, beforeAcc := specRate(spec)
		got := map[int][]int32{}
		if batched {
			got = decodeAll(t, spec, slots, n, sp)
		} else {
			for _, s := range slots {
				got[s], _ = decode(t, spec, s, n, sp)
			}
		}
		for _, s := range slots {
			sameGreedy(t, spec, s, slotInfo(t, spec, s).Tokens[:starts[s]], got[s], wants[s], sp)
		}
		drafted, accepted := specRate(spec)
		t.Logf("batched %v: %d of %d draft tokens accepted", batched, accepted-beforeAcc, drafted-before)
		if accepted == beforeAcc || accepted-beforeAcc == drafted-before {
			t.Errorf("batched %v: want drafts accepted and rejected: %d of %d", batched, accepted-beforeAcc, drafted-before)
		}
	}
}

// TestSpecMeasured: under the measured rule (the default) the scheduler
// gives the rule its steps' times, so that it knows a plain step's rate
// after a decode, operators see its decision in Info, and the text is
// decoding's without drafts whatever it decides, on the dense and the
// hybrid target alike. Whether drafts pay on this CPU is the rule's to
// measure, not the test's to assume.
func TestSpecMeasured(t *testing.T) {
	sp := iface.SamplerParams{IgnoreEOS: true}
	for name, target := range map[string]string{"llama": tiny(t), "qwen35moe": modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE())} {
		t.Run(name, func(t *testing.T) {
			plain := load(t, target, 1, nil)
			spec := load(t, target, 1, map[string]string{llamaopt.OptDraftModel: tiny(t), llamaopt.OptDraftMax: "4"})
			prefill(t, plain, 0, prompts[1])
			prefill(t, spec, 0, prompts[1])
			want, _ := decode(t, plain, 0, 96, sp)
			got, res := decode(t, spec, 0, 96, sp)
			seq := spec.eng.Load().cells.Slots[0].Seq()
			sameGreedy(t, spec, 0, seq[:len(seq)-len(got)], got, want, sp)
			info, err := spec.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			st := info.Speculative
			if st == nil || st.Rule != llamaopt.DraftRuleMeasured || st.PlainRate <= 0 {
				t.Fatalf("the rule measured nothing: %+v", st)
			}
			t.Logf("%d of %d draft tokens accepted; rule %+v", res.DraftAccepted, res.DraftTokens, *st)
			// Each decode-only step gives one token and its accepted drafts.
			if steps := int(st.PlainSteps + st.DraftSteps); steps+res.DraftAccepted != len(got) {
				t.Errorf("%d steps and %d accepted drafts for %d tokens", steps, res.DraftAccepted, len(got))
			}
			if (st.PlainSteps > 0) != (st.PlainSeconds > 0) || (st.DraftSteps > 0) != (st.VerifySeconds > 0 && st.DraftSeconds > 0) ||
				(res.DraftTokens > 0) != (st.DraftSteps > 0) {
				t.Errorf("the rule's totals do not add up: %+v, %d draft tokens", *st, res.DraftTokens)
			}
			if off, _ := plain.Info(context.Background()); off.Speculative != nil {
				t.Errorf("an engine without drafts reports a rule: %+v", off.Speculative)
			}
		})
	}
}

// TestSpecStateWhileDrafting: STATE_GET and STATE_PUT of other slots while a
// slot of the hybrid target decodes with drafts that are partly rejected
// (each step's rollback saved, restored and replayed): the transfers take
// the context between steps, never inside one, so the decoding slot's
// tokens are those without drafts and each moved state is its source's.
func TestSpecStateWhileDrafting(t *testing.T) {
	target := modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE())
	plain := load(t, target, 3, nil)
	spec := load(t, target, 3, map[string]string{llamaopt.OptSpecType: "ngram-simple", llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	const n = 120
	prefill(t, plain, 0, prompts[0])
	want, _ := decode(t, plain, 0, n, sp)
	prefill(t, spec, 0, prompts[0])
	prefill(t, spec, 1, prompts[1])
	start := len(slotInfo(t, spec, 0).Tokens)
	src := stateOf(t, spec, 1, 1<<20)
	srcTokens := slotInfo(t, spec, 1).Tokens
	var mu sync.Mutex
	steps := 0
	testDrafts = func(slot int, seq []int32, pending int32, max int) []int32 {
		mu.Lock()
		defer mu.Unlock()
		steps++
		g := len(seq) - start + 1
		if slot != 0 || g >= len(want) {
			return nil
		}
		d := slices.Clone(want[g:min(len(want), g+max)])
		if steps%3 == 0 && len(d) > 1 {
			d[1] ^= 1 // rejected from its second token: a rollback and a replay
		}
		return d
	}
	defer func() { testDrafts = nil }()

	stop, done := make(chan struct{}), make(chan error, 1)
	moves := 0 // made while slot 0 was drafting
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var w recorder
			if _, err := spec.StateGet(context.Background(), 1, 1<<16, &w); err != nil {
				done <- fmt.Errorf("StateGet slot 1: %w", err)
				return
			}
			if !bytes.Equal(w.data, src) {
				done <- fmt.Errorf("slot 1's state changed while slot 0 drafted: %d bytes, was %d", len(w.data), len(src))
				return
			}
			if _, err := spec.StatePut(context.Background(), 2, srcTokens, bytes.NewReader(w.data), int64(len(w.data))); err != nil {
				done <- fmt.Errorf("StatePut slot 2: %w", err)
				return
			}
			mu.Lock()
			if steps > 0 {
				moves++
			}
			mu.Unlock()
		}
	}()
	before, beforeAcc := specRate(spec)
	got, _ := decode(t, spec, 0, n, sp)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if moves == 0 {
		t.Error("no state moved while slot 0 drafted")
	}
	sameGreedy(t, spec, 0, slotInfo(t, spec, 0).Tokens[:start], got, want, sp)
	drafted, accepted := specRate(spec)
	if drafted == before || accepted-beforeAcc == drafted-before {
		t.Errorf("want drafts accepted and rejected: %d of %d", accepted-beforeAcc, drafted-before)
	}
	// The state moved last decodes as its source does.
	if _, err := plain.StatePut(context.Background(), 1, srcTokens, bytes.NewReader(src), int64(len(src))); err != nil {
		t.Fatal(err)
	}
	want2, _ := decode(t, plain, 1, 24, sp)
	got2, _ := decode(t, spec, 2, 24, sp)
	sameGreedy(t, spec, 2, srcTokens, got2, want2, sp)
	t.Logf("%d moves beside the decode; %d of %d draft tokens accepted", moves, accepted-beforeAcc, drafted-before)
}

// TestSpecHybridDraft: a draft model whose state cannot be cut back (the
// hybrid qwen35moe), drafting for a dense target and for itself, alone and
// four slots batched: its state is saved before each draft and restored
// after, and the tokens are those without drafts; a prompt that parts from
// a slot's sequence makes the draft evaluate the slot's tokens again.
func TestSpecHybridDraft(t *testing.T) {
	hybrid := modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE())
	sp := iface.SamplerParams{IgnoreEOS: true}
	for name, target := range map[string]string{"dense target": tiny(t), "hybrid target": hybrid} {
		t.Run(name, func(t *testing.T) {
			plain := load(t, target, 4, nil)
			spec := load(t, target, 4, map[string]string{llamaopt.OptDraftModel: hybrid, llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways})
			referenceKernels(t, plain)
			referenceKernels(t, spec)
			if spec.eng.Load().spec.dctx == nil {
				t.Fatal("the hybrid draft model's state is not saved and restored")
			}
			// The batched half takes the same prompts again: each slot's
			// sequence parts from the one the draft context holds for it.
			aloneDrafted, _ := aloneThenBatched(t, plain, spec, 40, sp)
			drafted, accepted := specRate(spec)
			t.Logf("alone: %d draft tokens; batched: %d, %d accepted in all", aloneDrafted, drafted-aloneDrafted, accepted)
			if aloneDrafted == 0 || drafted == aloneDrafted {
				t.Fatalf("no drafts: %d alone, %d batched", aloneDrafted, drafted-aloneDrafted)
			}
			if name == "hybrid target" && float64(accepted) < 0.9*float64(drafted) {
				t.Errorf("the target as its own draft: %d of %d accepted", accepted, drafted)
			}
		})
	}
}

// tinyMTP is the tests' hybrid model with its MTP block.
func tinyMTP(t *testing.T) string {
	c := gguf.TinyQwen35MoE()
	c.MTP = 1
	return modelFile(t, "tiny-qwen35moe-mtp", c)
}

// TestSpecMTP: draft-mtp drafts with the model's own multi-token-prediction
// block (gguf-gen's, random weights: nearly every draft is rejected) and
// with chosen drafts where the block's are replaced (accepted and
// rejected), alone and on 4 slots batched: the tokens are those of the same
// file decoded without it, the MTP context holds each slot's positions
// after every decode, a state moves out of and into a drafting engine, and
// a model without the block is refused.
func TestSpecMTP(t *testing.T) {
	target := tinyMTP(t)
	opts := map[string]string{llamaopt.OptSpecType: "draft-mtp", llamaopt.OptDraftMax: "4", llamaopt.OptDraftRule: llamaopt.DraftRuleAlways}
	_, err := New(testLogger()).Load(context.Background(), iface.LoadRequest{Model: modelFile(t, "tiny-qwen35moe", gguf.TinyQwen35MoE()),
		NSlots: 1, Options: map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "512", llamaopt.OptSpecType: "draft-mtp"}})
	if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "no multi-token-prediction block") {
		t.Fatalf("draft-mtp on a model without the block: %v, want a bad request", err)
	}
	plain := load(t, target, 4, nil)
	spec := load(t, target, 4, opts)
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	slots := []int{0, 1, 2, 3}
	holdsAll := func(b *Backend, when string) {
		t.Helper()
		e := b.eng.Load()
		for _, s := range slots {
			seq := e.cells.Slots[s].Seq()
			held, last := e.spec.mtpHolds(s)
			if !slices.Equal(held, seq) || last != len(seq)-1 {
				t.Errorf("%s: slot %d: the MTP context holds %d tokens (last position %d) of %d, want them all", when, s, len(held), last, len(seq))
			}
		}
	}

	// The block's drafts at a position are the same alone and batched:
	// each row is paired with the hidden state of its own sequence's
	// position before it, whatever else the batch holds. Two engines, so
	// that each slot's sequence has the same history in both.
	batchedSpec := load(t, target, 4, opts)
	referenceKernels(t, batchedSpec)
	type at struct{ slot, pos int }
	var mu sync.Mutex
	seen, batched := map[at][]int32{}, false
	differ, compared := 0, 0
	testSawDraft = func(slot, pos int, d []int32) {
		mu.Lock()
		defer mu.Unlock()
		k := at{slot, pos}
		if !batched {
			seen[k] = slices.Clone(d)
		} else if w, ok := seen[k]; ok {
			// A draft's length is the step's cap, which depends on the
			// decoders beside it (draft_batch_max's share, each one's room):
			// the tokens both drafted must be the same.
			compared++
			if n := min(len(w), len(d)); !slices.Equal(w[:n], d[:n]) {
				differ++
				t.Logf("slot %d position %d: alone %v, batched %v", slot, pos, w, d)
			}
		}
	}
	defer func() { testSawDraft = nil }()
	// Each slot drafts at most slot+1 tokens, so that a batch holds runs
	// of every length (llama.cpp splits those into ubatches out of the
	// batch's order).
	decodeSpec := func(b *Backend, slots []int) map[int][]int32 {
		return decodeEach(t, b, slots, func(s int) iface.DecodeRequest {
			return iface.DecodeRequest{Slot: s, NPredict: 32, Sampler: sp, Speculative: &iface.SpeculativeParams{NMax: s + 1}}
		})
	}
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
		want, _ := decode(t, plain, s, 32, sp)
		got := decodeSpec(spec, []int{s})[s]
		seq := spec.eng.Load().cells.Slots[s].Seq()
		sameGreedy(t, spec, s, seq[:len(seq)-len(got)], got, want, sp)
	}
	holdsAll(spec, "alone")
	drafted, accepted := specRate(spec)
	mu.Lock()
	batched = true
	mu.Unlock()
	// Slot 0's prompt is evaluated while the others decode: batches of a
	// prompt's rows, one of them an output, beside decoders' rows.
	for s, p := range prompts {
		prefill(t, plain, s, p)
		if s > 0 {
			prefill(t, batchedSpec, s, p)
		}
	}
	wantAll := decodeAll(t, plain, slots, 32, sp)
	var gotAll, got0 map[int][]int32
	var wg sync.WaitGroup
	wg.Go(func() { gotAll = decodeSpec(batchedSpec, slots[1:]) })
	prefill(t, batchedSpec, 0, prompts[0])
	got0 = decodeSpec(batchedSpec, slots[:1])
	wg.Wait()
	gotAll[0] = got0[0]
	for _, s := range slots {
		seq := batchedSpec.eng.Load().cells.Slots[s].Seq()
		sameGreedy(t, batchedSpec, s, seq[:len(seq)-len(gotAll[s])], gotAll[s], wantAll[s], sp)
	}
	holdsAll(batchedSpec, "batched")
	testSawDraft = nil
	if batchedDrafted, _ := specRate(batchedSpec); drafted == 0 || batchedDrafted == 0 || compared == 0 || differ > 0 {
		t.Errorf("the MTP block's drafts alone (%d tokens) and batched (%d): %d of %d at the same positions differ, want 0 of some",
			drafted, batchedDrafted, differ, compared)
	}
	t.Logf("own drafts: %d of %d accepted alone", accepted, drafted)

	// Chosen drafts: the plain model's own continuation, with a token
	// changed every few steps, so that drafts are accepted whole, in part
	// and not at all.
	starts := map[int]int{}
	for s, p := range prompts {
		prefill(t, plain, s, p)
		prefill(t, spec, s, p)
		starts[s] = len(slotInfo(t, spec, s).Tokens)
	}
	wants := decodeAll(t, plain, slots, 40, sp)
	step := 0
	testDrafts = func(slot int, seq []int32, pending int32, max int) []int32 {
		mu.Lock()
		defer mu.Unlock()
		step++
		g := len(seq) - starts[slot] + 1
		if w := wants[slot]; g < len(w) {
			d := slices.Clone(w[g:min(len(w), g+max)])
			if step%4 == 0 {
				d[len(d)/2] ^= 1
			}
			return d
		}
		return nil
	}
	defer func() { testDrafts = nil }()
	before, beforeAcc := specRate(spec)
	got := decodeAll(t, spec, slots, 40, sp)
	for _, s := range slots {
		sameGreedy(t, spec, s, slotInfo(t, spec, s).Tokens[:starts[s]], got[s], wants[s], sp)
	}
	holdsAll(spec, "chosen drafts")
	all, acc := specRate(spec)
	if acc == beforeAcc || acc-beforeAcc == all-before {
		t.Errorf("chosen drafts: want drafts accepted and rejected: %d of %d", acc-beforeAcc, all-before)
	}
	testDrafts = nil

	// A state moves out of the drafting engine and into it.
	si := slotInfo(t, spec, 0)
	state := stateOf(t, spec, 0, 1<<20)
	if _, err := plain.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if _, err := spec.StatePut(context.Background(), 2, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	want, _ := decode(t, plain, 1, 24, sp)
	for _, s := range []int{0, 2} {
		got, _ := decode(t, spec, s, 24, sp)
		sameGreedy(t, plain, 1, si.Tokens, want, got, sp)
	}
}

// TestSpecMTPStops: under the measured rule (the default) the MTP block's
// random-weight drafts, never accepted, stop drafting, and with it the
// block's evaluation of every batch (its cost a step): the block then
// lacks the positions decoded since, and the text is decoding's without
// drafts.
func TestSpecMTPStops(t *testing.T) {
	target := tinyMTP(t)
	plain := load(t, target, 1, nil)
	spec := load(t, target, 1, map[string]string{llamaopt.OptSpecType: "draft-mtp", llamaopt.OptDraftMax: "4"})
	referenceKernels(t, plain)
	referenceKernels(t, spec)
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, plain, 0, prompts[1])
	prefill(t, spec, 0, prompts[1])
	want, _ := decode(t, plain, 0, 96, sp)
	got, _ := decode(t, spec, 0, 96, sp)
	e := spec.eng.Load()
	seq := e.cells.Slots[0].Seq()
	sameGreedy(t, spec, 0, seq[:len(seq)-len(got)], got, want, sp)
	_, last := e.spec.mtpHolds(0)
	drafted, accepted := specRate(spec)
	t.Logf("%d of %d draft tokens accepted; the block holds positions to %d of %d", accepted, drafted, last, len(seq)-1)
	if e.spec.Rule.Status().Drafting || drafted == 0 || last >= len(seq)-1 {
		t.Errorf("want drafts, then the rule stopped (drafting %v) and the block not fed since (last position %d of %d)",
			e.spec.Rule.Status().Drafting, last, len(seq)-1)
	}
}
