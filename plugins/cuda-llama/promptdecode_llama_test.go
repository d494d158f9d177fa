//go:build llama && cgo

package cudallama

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// promptDecode runs a Decode with a prompt of toks and returns its tokens.
func promptDecode(ctx context.Context, b *Backend, slot int, toks []int32, n int, sp iface.SamplerParams) ([]int32, iface.DecodeResult, error) {
	var ids []int32
	res, err := b.Decode(ctx, iface.DecodeRequest{Slot: slot, NPredict: n, Sampler: sp,
		Prompt: &iface.PrefillRequest{Slot: -1, Tokens: toks}}, // the prompt's slot is the request's
		func(tok iface.Token) error { ids = append(ids, tok.ID); return nil })
	return ids, res, err
}

// TestPromptDecode: a Decode with a prompt decodes what a Prefill then a
// Decode do, alone (leaving the same state) and four at once (the same
// sequences; their KV differs from alone in the last bits, as any batch's;
// on a GPU up to a tie, sameGreedy), and says what its prompt did.
func TestPromptDecode(t *testing.T) {
	for name, tc := range map[string]struct {
		sp   iface.SamplerParams
		opts map[string]string
	}{
		"greedy":      {iface.SamplerParams{IgnoreEOS: true}, nil},
		"penalties":   {iface.SamplerParams{RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.4, IgnoreEOS: true}, nil},
		"kv per slot": {iface.SamplerParams{IgnoreEOS: true}, map[string]string{llamaopt.OptKVUnified: "false"}},
	} {
		t.Run(name, func(t *testing.T) {
			sp := tc.sp
			b := load(t, tiny(t), 4, tc.opts)
			toks := make([][]int32, len(prompts))
			want := map[int][]int32{}
			var wantState []byte
			for s, p := range prompts {
				toks[s] = tokensOf(t, b, p)
				prefillTokens(t, b, s, toks[s])
				want[s], _ = decode(t, b, s, 32, sp)
				if s == 0 {
					wantState = normSeq(stateOf(t, b, s, 1<<20))
				}
				if err := b.ClearSlot(context.Background(), s); err != nil {
					t.Fatal(err)
				}
			}
			got, res, err := promptDecode(context.Background(), b, 0, toks[0], 32, sp)
			if err != nil {
				t.Fatalf("alone: %v", err)
			}
			if p := res.Prompt; p == nil || p.NTokens != len(toks[0]) || p.Reused != 0 || p.Prefill <= 0 ||
				res.TokensGenerated != 32 || res.NPast != len(toks[0])+32 || res.StopReason != StopLength {
				t.Fatalf("alone: %+v, prompt %+v", res, res.Prompt)
			}
			if slices.Equal(got, want[0]) {
				sameState(t, b, "alone: the state against a Prefill and Decode's", normSeq(stateOf(t, b, 0, 1<<20)), wantState)
			}
			sameGreedy(t, b, 0, toks[0], got, want[0], sp)

			var wg sync.WaitGroup
			var mu sync.Mutex
			batched := map[int][]int32{}
			for s := range prompts {
				wg.Go(func() {
					ids, _, err := promptDecode(context.Background(), b, s, toks[s], 32, sp)
					if err != nil {
						t.Errorf("slot %d: %v", s, err)
					}
					mu.Lock()
					batched[s] = ids
					mu.Unlock()
				})
			}
			wg.Wait()
			for s := range prompts {
				if si := slotInfo(t, b, s); !slices.Equal(si.Tokens, append(slices.Clone(toks[s]), batched[s]...)) {
					t.Errorf("slot %d holds %d tokens, want the prompt's %d and the 32 decoded", s, si.NPast, len(toks[s]))
				}
				sameGreedy(t, b, s, toks[s], batched[s], want[s], sp)
			}
			// The same prompt again keeps all its tokens but the last.
			_, res, err = promptDecode(context.Background(), b, 1, toks[1], 4, sp)
			if err != nil || res.Prompt == nil || res.Prompt.Reused != len(toks[1])-1 {
				t.Errorf("the same prompt again: %+v, %v", res.Prompt, err)
			}
		})
	}
}

// TestPromptDecodeFailures: a prompt that cannot be evaluated fails the call
// before any token: one refused before it starts leaves the slot as it was,
// one that fails on the way leaves it empty, as Prefill does; no tokens asked
// for is the prompt's prefill alone; the other slot keeps its sequence.
func TestPromptDecodeFailures(t *testing.T) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptNCtx: "256"})
	sp := iface.SamplerParams{IgnoreEOS: true}
	prefill(t, b, 1, "the other slot")
	other := slotInfo(t, b, 1)

	old := prefill(t, b, 0, "an old sequence").Slot.Tokens
	ids, _, err := promptDecode(context.Background(), b, 0, make([]int32, 300), 8, sp)
	if !errors.Is(err, iface.ErrBadRequest) || len(ids) != 0 || !slices.Equal(slotInfo(t, b, 0).Tokens, old) {
		t.Fatalf("prompt over n_ctx: %v, %d tokens, slot holds %d", err, len(ids), slotInfo(t, b, 0).NPast)
	}
	ids, _, err = promptDecode(context.Background(), b, 0, []int32{1, 1 << 30}, 8, sp)
	if !errors.Is(err, iface.ErrBadRequest) || len(ids) != 0 || !slices.Equal(slotInfo(t, b, 0).Tokens, old) {
		t.Fatalf("token outside the vocabulary: %v", err)
	}
	ids, _, err = promptDecode(context.Background(), b, 0, make([]int32, 250), 8, sp)
	if !errors.Is(err, iface.ErrNoRoom) || !strings.Contains(err.Error(), "KV cells") || len(ids) != 0 ||
		slotInfo(t, b, 0).NPast != 0 {
		t.Fatalf("prompt over the free cells: %v, %d tokens", err, len(ids))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ids, _, err = promptDecode(ctx, b, 0, tokensOf(t, b, strings.Repeat("a prompt nobody waits for ", 4)), 8, sp)
	if !errors.Is(err, context.Canceled) || len(ids) != 0 || slotInfo(t, b, 0).NPast != 0 {
		t.Fatalf("cancelled: %v, %d tokens, slot holds %d", err, len(ids), slotInfo(t, b, 0).NPast)
	}

	toks := tokensOf(t, b, "only a prefill")
	ids, res, err := promptDecode(context.Background(), b, 0, toks, 0, sp)
	if err != nil || len(ids) != 0 || res.StopReason != StopLength || res.Prompt == nil || res.Prompt.NTokens != len(toks) ||
		!slices.Equal(slotInfo(t, b, 0).Tokens, toks) {
		t.Fatalf("no tokens asked for: %v, %+v", err, res)
	}
	got, _ := decode(t, b, 0, 6, sp) // the prefill's logits were kept
	prefillTokens(t, b, 0, toks)
	want, _ := decode(t, b, 0, 6, sp)
	if !slices.Equal(got, want) {
		t.Errorf("after a prompt alone %v, after a Prefill %v", got, want)
	}
	if si := slotInfo(t, b, 1); !slices.Equal(si.Tokens, other.Tokens) {
		t.Errorf("the other slot changed: %d tokens, had %d", si.NPast, other.NPast)
	}
}
