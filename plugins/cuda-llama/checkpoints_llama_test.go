//go:build llama && cgo

package cudallama

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt/ckpttest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Checkpoint tests run with small batches so that a short prompt has its
// checkpoints: n_ubatch 16, so at N − 20 and N − 4.
var ckptOpts = map[string]string{llamaopt.OptNBatch: "64", llamaopt.OptNUBatch: "16"}

// promptOf is n token ids of the vocabulary's plain range, from seed on.
func promptOf(n, seed int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(100 + (seed+i*7)%300)
	}
	return t
}

// TestCheckpointCases: a slot holds prompt A and what it generated; the
// next prompt parts from that sequence where its memory cannot be cut.
// Each resumes from the checkpoint llama-server restores (the prompt tokens
// evaluated are llama-server's, the counts its rules give: internal/ckpt)
// and gives the logits and greedy tokens of the prompt evaluated whole in an
// engine of its own. The hybrid (qwen35moe) runs the three cases (A
// of N tokens, 4 generated; A + 64, A again, A cut 10 before its end + 64:
// checkpoints at N − 20 and N − 4 with n_ubatch 16); both it and the
// sliding-window model (gemma3, window 32, whose cache of 256 cells drops
// positions beyond the window once full) a long reply (A of 200, 250
// generated) then A + 64. Without checkpoints the hybrid starts over.
func TestCheckpointCases(t *testing.T) {
	a := promptOf(120, 0)
	more := promptOf(64, 11)
	long := promptOf(200, 5)
	cases := []struct {
		model     string
		name      string
		a         []int32
		gen       int
		prompt    []int32
		evaluated int
	}{
		{"qwen35moe", "extends", a, 4, append(slices.Clone(a), more...), 68},
		{"qwen35moe", "same", a, 4, a, 4},
		{"qwen35moe", "cut", a, 4, append(slices.Clone(a[:len(a)-10]), more...), 20 - 10 + 64},
		{"qwen35moe", "long reply", long, 250, append(slices.Clone(long), more...), 68},
		// The window's checkpoint ends a position early (llama-server's
		// [TAG_CHECKPOINTS_FIX_POS_MIN]): 69.
		{"gemma3", "long reply", long, 250, append(slices.Clone(long), more...), 69},
	}
	configs := map[string]gguf.Config{"qwen35moe": gguf.TinyQwen35MoE(), "gemma3": gguf.TinyGemma3()}
	// A restored window's cells lie in other cells of the cache than a
	// whole evaluation's, and ggml's CPU flash attention sums V in f16 in
	// cell order (0.1 % of the logits' span apart here): the window model is
	// compared without flash attention, in f32, where the sums are exact.
	exact := map[string]map[string]string{"gemma3": {llamaopt.OptFlashAttn: "off", llamaopt.OptCacheTypeK: "f32", llamaopt.OptCacheTypeV: "f32"}}
	for _, c := range cases {
		t.Run(c.model+"/"+c.name, func(t *testing.T) {
			path := modelFile(t, "ckpt-"+c.model, configs[c.model])
			opts := maps.Clone(ckptOpts)
			maps.Copy(opts, exact[c.model])
			b := load(t, path, 2, opts)
			referenceKernels(t, b)
			e := b.eng.Load()
			if e.ckpts == nil {
				t.Fatal("no checkpoint store for a memory that cannot be cut")
			}
			prefillTokens(t, b, 0, c.a)
			decode(t, b, 0, c.gen, iface.SamplerParams{IgnoreEOS: true})
			if held, _ := e.ckpts.Slot(0); held != 2 {
				t.Fatalf("%d checkpoints after a prompt of %d, want 2 (N − 20, N − 4)", held, len(c.a))
			}
			before := e.ckpts.Stats()
			r := prefillTokens(t, b, 0, c.prompt)
			if got := len(c.prompt) - r.Reused; got != c.evaluated {
				t.Errorf("evaluated %d prompt tokens, want %d (llama-server's)", got, c.evaluated)
			}
			if st := e.ckpts.Stats(); st.Restored != before.Restored+1 || st.TokensSaved != before.TokensSaved+uint64(r.Reused) {
				t.Errorf("counters %+v after %+v", st, before)
			}
			sameAsFresh(t, path, opts, c.prompt, r.Logits, b)
		})
	}

	t.Run("off", func(t *testing.T) {
		opts := maps.Clone(ckptOpts)
		opts[llamaopt.OptCtxCheckpoints] = "0"
		b := load(t, modelFile(t, "ckpt-qwen35moe", gguf.TinyQwen35MoE()), 1, opts)
		if b.eng.Load().ckpts != nil {
			t.Fatal("a checkpoint store with ctx_checkpoints=0")
		}
		prefillTokens(t, b, 0, a)
		decode(t, b, 0, 4, iface.SamplerParams{IgnoreEOS: true})
		if r := prefillTokens(t, b, 0, a); r.Reused != 0 {
			t.Fatalf("without checkpoints a hybrid kept %d tokens", r.Reused)
		}
	})
}

// sameAsFresh checks slot 0 of b, which resumed prompt with logits, against
// the prompt evaluated whole in an engine of its own (opts): the logits, and
// the next 12 greedy tokens (up to the GPU oracle's tie rule).
func sameAsFresh(t *testing.T, path string, opts map[string]string, prompt []int32, logits []float32, b *Backend) {
	t.Helper()
	sp := iface.SamplerParams{IgnoreEOS: true}
	got, _ := decode(t, b, 0, 12, sp)
	iso := load(t, path, 1, opts)
	referenceKernels(t, iso)
	fresh := prefillTokens(t, iso, 0, prompt)
	closeLogits(t, iso, "the resumed slot's logits against the prompt evaluated whole", logits, fresh.Logits)
	want, _ := decode(t, iso, 0, 12, sp)
	sameGreedy(t, iso, 0, prompt, got, want, sp)
}

// TestCheckpointsDropped: a slot cleared, or replaced by a STATE_PUT, holds
// no checkpoint (they restore onto cells that are gone); a plain cache and
// a swa_full window take none.
func TestCheckpointsDropped(t *testing.T) {
	b := load(t, modelFile(t, "ckpt-qwen35moe", gguf.TinyQwen35MoE()), 2, ckptOpts)
	e := b.eng.Load()
	a := promptOf(100, 3)
	prefillTokens(t, b, 0, a)
	prefillTokens(t, b, 1, a)
	if held, bytes := e.ckpts.Slot(0); held != 2 || bytes <= 0 {
		t.Fatalf("%d checkpoints, %d bytes", held, bytes)
	}
	info, err := b.Info(t.Context())
	if c := info.Checkpoints; err != nil || c == nil || c.Held != 4 || c.MaxPerSlot != 32 || c.MinStep != 8192 ||
		c.BudgetBytes != llamaopt.DefaultCheckpointRAM<<20 || c.Taken != 4 || len(c.Slots) != 2 || c.Slots[1].Held != 2 || c.Bytes != 2*c.Slots[1].Bytes {
		t.Fatalf("Info's checkpoints %+v (%v)", c, err)
	}
	if err := b.ClearSlot(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	if held, _ := e.ckpts.Slot(0); held != 0 {
		t.Fatalf("a cleared slot holds %d checkpoints", held)
	}
	state := stateOf(t, b, 1, 1<<20)
	if _, err := b.StatePut(t.Context(), 1, a, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if held, _ := e.ckpts.Slot(1); held != 0 {
		t.Fatalf("a restored slot holds %d checkpoints of its old sequence", held)
	}
	// A prompt parting from the restored sequence finds no checkpoint and
	// starts over, deciding as it should.
	if r := prefillTokens(t, b, 1, a[:90]); r.Reused != 0 {
		t.Fatalf("reused %d without a checkpoint", r.Reused)
	}

	plain := load(t, tiny(t), 1, ckptOpts)
	if info, _ := plain.Info(t.Context()); plain.eng.Load().ckpts != nil || info.Checkpoints != nil {
		t.Fatal("a plain cache keeps checkpoints")
	}
	// A window cache that keeps every position (swa_full) is cut anywhere:
	// none, as llama-server (its n_swa is 0 then).
	full := load(t, modelFile(t, "ckpt-gemma3", gguf.TinyGemma3()), 1, map[string]string{llamaopt.OptSWAFull: "true"})
	if full.eng.Load().ckpts != nil {
		t.Fatal("a swa_full window cache keeps checkpoints")
	}
}

// TestCheckpointBudget: the checkpoints never hold more than their budget
// (checkpoint_ram, here three checkpoints' worth); the oldest are dropped,
// of any slot, and the slots' sequences are untouched.
func TestCheckpointBudget(t *testing.T) {
	b := load(t, modelFile(t, "ckpt-qwen35moe", gguf.TinyQwen35MoE()), 2, ckptOpts)
	e := b.eng.Load()
	a := promptOf(100, 5)
	prefillTokens(t, b, 0, a)
	one := e.ckpts.Stats().Bytes / 2
	if one <= 0 {
		t.Fatal("no checkpoint taken")
	}
	t.Logf("a checkpoint of the tiny hybrid is %d bytes", one)
	e.mu.Lock()
	e.ckpts = ckpt.NewStore(e.ckpts.Rules(), len(e.cells.Slots), 3*one) // checkpoint_ram is in MiB
	e.mu.Unlock()
	for i := range 6 {
		prefillTokens(t, b, i%2, promptOf(100, 100+i))
		if st := e.ckpts.Stats(); st.Bytes > 3*one {
			t.Fatalf("the checkpoints hold %d bytes, over the budget of %d", st.Bytes, 3*one)
		}
	}
	if st := e.ckpts.Stats(); st.Dropped == 0 || st.Held != 3 {
		t.Fatalf("stats %+v: want 3 held, some dropped", st)
	}
	for i := range 2 {
		if si := slotInfo(t, b, i); si.NPast != 100 {
			t.Fatalf("slot %d holds %d tokens", i, si.NPast)
		}
	}
}

// TestCheckpointAcrossEngines: a hybrid slot's state and newest checkpoint
// moved to another engine (as STATE_GET writes them into a blob and
// STATE_PUT hands them over) serve the destination as they would the
// source: the same prompt again evaluates its last 4 tokens there, and
// decodes as the prompt evaluated whole. Checkpoints that do not fit the
// sequence or the memory are refused; a plain cache declines one.
func TestCheckpointAcrossEngines(t *testing.T) {
	path := modelFile(t, "ckpt-qwen35moe", gguf.TinyQwen35MoE())
	src := load(t, path, 2, ckptOpts)
	dst := load(t, path, 3, ckptOpts)
	referenceKernels(t, dst)
	a := promptOf(120, 9)
	prefillTokens(t, src, 0, a)
	decode(t, src, 0, 4, iface.SamplerParams{IgnoreEOS: true})
	c, err := src.SlotCheckpoint(t.Context(), 0)
	if err != nil || c == nil || c.NTokens != int64(len(a)-4) || c.PosMax != int32(len(a)-5) {
		t.Fatalf("the slot's newest checkpoint: %+v %v", c, err)
	}
	si := slotInfo(t, src, 0)
	state := stateOf(t, src, 0, 1<<20)
	put := func(c iface.Checkpoint) (bool, string, error) {
		t.Helper()
		if _, err := dst.StatePut(t.Context(), 2, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
			t.Fatal(err)
		}
		return dst.PutCheckpoint(t.Context(), 2, c)
	}
	for name, bad := range map[string]iface.Checkpoint{
		"cut short":           {PosMin: c.PosMin, PosMax: c.PosMax, NTokens: c.NTokens, Target: c.Target[:len(c.Target)-9]},
		"past the sequence":   {PosMin: c.PosMin, PosMax: int32(len(si.Tokens)), NTokens: int64(len(si.Tokens)) + 1, Target: c.Target},
		"ends after its end":  {PosMin: c.PosMin, PosMax: int32(c.NTokens), NTokens: c.NTokens, Target: c.Target},
		"not a state at all":  {PosMin: c.PosMin, PosMax: c.PosMax, NTokens: c.NTokens, Target: []byte("not a state")},
		"positions backwards": {PosMin: c.PosMax, PosMax: c.PosMin - 1, NTokens: c.NTokens, Target: c.Target},
	} {
		if kept, _, err := put(bad); kept || !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: kept %v, %v; want ErrBadRequest", name, kept, err)
		}
	}
	kept, why, err := put(*c)
	if !kept || why != "" || err != nil {
		t.Fatalf("PutCheckpoint: %v %q %v", kept, why, err)
	}
	r := prefillTokens(t, dst, 2, a)
	if r.Reused != len(a)-4 {
		t.Fatalf("the destination kept %d of the same prompt, the source would keep %d", r.Reused, len(a)-4)
	}
	got, _ := decode(t, dst, 2, 12, iface.SamplerParams{IgnoreEOS: true})
	iso := load(t, path, 1, ckptOpts)
	referenceKernels(t, iso)
	fresh := prefillTokens(t, iso, 0, a)
	closeLogits(t, iso, "the moved slot's logits after its checkpoint against a whole evaluation", r.Logits, fresh.Logits)
	want, _ := decode(t, iso, 0, 12, iface.SamplerParams{IgnoreEOS: true})
	sameGreedy(t, iso, 0, a, got, want, iface.SamplerParams{IgnoreEOS: true})

	plain := load(t, tiny(t), 1, nil)
	if kept, why, err := plain.PutCheckpoint(t.Context(), 0, *c); kept || why == "" || err != nil {
		t.Fatalf("a plain cache: kept %v, %q, %v", kept, why, err)
	}
}

// TestCheckpointsInPromptCache: a hybrid sequence that leaves its slot for
// the prompt cache takes its checkpoints with it (counted in the cache's
// bytes, no longer in the checkpoints'); a later prompt that parts from it
// near its end, or repeats it, restores the entry and then the checkpoint
// that serves it, evaluating what llama-server does (the counts of
// TestCheckpointCases), and decodes as the prompt evaluated whole. Without
// the checkpoints the entry serves neither prompt.
func TestCheckpointsInPromptCache(t *testing.T) {
	path := modelFile(t, "ckpt-qwen35moe", gguf.TinyQwen35MoE())
	a := promptOf(120, 0)
	for _, c := range []struct {
		name      string
		prompt    []int32
		evaluated int
	}{
		{"cut", append(slices.Clone(a[:110]), promptOf(64, 11)...), 20 - 10 + 64},
		{"same", a, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := maps.Clone(ckptOpts)
			opts[llamaopt.OptCacheRAM] = "64"
			b := load(t, path, 1, opts)
			referenceKernels(t, b)
			e := b.eng.Load()
			httpPromptDecode(t, b, 0, a, 4, true) // checkpoints at 100 and 116
			held, ckBytes := e.ckpts.Slot(0)
			if held != 2 {
				t.Fatalf("%d checkpoints after a prompt of 120, want 2", held)
			}
			httpPromptDecode(t, b, 0, promptOf(90, 3), 1, true) // A leaves for the cache
			st := cacheStats(t, b)
			if st.Saves != 1 || st.Entries != 1 || st.Bytes < ckBytes {
				t.Fatalf("the cache after A left: %+v (its checkpoints are %d bytes)", st, ckBytes)
			}
			before := e.ckpts.Stats()
			r := httpPrefill(t, b, 0, c.prompt, true)
			if got := len(c.prompt) - r.Reused; got != c.evaluated {
				t.Errorf("evaluated %d prompt tokens, want %d (llama-server's)", got, c.evaluated)
			}
			if after := cacheStats(t, b); after.Restores != st.Restores+1 {
				t.Errorf("cache restores %d → %d", st.Restores, after.Restores)
			}
			if after := e.ckpts.Stats(); after.Restored != before.Restored+1 || after.Taken < before.Taken {
				t.Errorf("checkpoint counters %+v after %+v", after, before)
			}
			sameAsFresh(t, path, ckptOpts, c.prompt, r.Logits, b)
		})
	}

	t.Run("no checkpoints", func(t *testing.T) {
		b := load(t, path, 1, map[string]string{llamaopt.OptNBatch: "64", llamaopt.OptNUBatch: "16", llamaopt.OptCacheRAM: "64", llamaopt.OptCtxCheckpoints: "0"})
		httpPromptDecode(t, b, 0, a, 4, true)
		httpPromptDecode(t, b, 0, promptOf(90, 3), 1, true)
		if r := httpPrefill(t, b, 0, a, true); r.Reused != 0 {
			t.Errorf("an entry without checkpoints served a prompt its recurrent state cannot be cut to: reused %d", r.Reused)
		}
	})
}

// TestCheckpointAgentTurns: an agent's nine turns on the nodes' model
// (qwen35moe with Qwen3's tokenizer and chat template), as chat messages or
// as the host sends them (the rendering's tokens, FromChat):
// tool calls and their results, then a new user message, three times. Each
// prompt parts from the slot's sequence (the reply is re-rendered, and
// Qwen3's template drops earlier turns' reasoning once a user speaks), and
// each evaluates exactly the tokens the checkpoint rules played alone give
// (ckpttest.Sim, checkpoints at the last user message, N − 20 and N − 4),
// with the logits of the prompt evaluated whole.
func TestCheckpointAgentTurns(t *testing.T) {
	path := familyModel(t, gguf.ArchQwen35MoE, "qwen3")
	b := load(t, path, 1, ckptOpts)
	referenceKernels(t, b)
	iso := load(t, path, 1, ckptOpts)
	referenceKernels(t, iso)
	e := b.eng.Load()
	if !slices.ContainsFunc(e.delims, func(d ckpt.Delimiter) bool { return d.User }) {
		t.Fatalf("no user message delimiter found in Qwen3's template: %v", e.delims)
	}
	sim := ckpttest.NewSim(t, e.ckpts.Rules())

	msgs := []iface.Message{
		{Role: "system", Content: "You are a coding agent. Read files with read_file and answer briefly."},
		{Role: "user", Content: "Why does the build fail on the CI machine but not here?"},
	}
	call := func(n int) iface.Message {
		return iface.Message{Role: "assistant", ReasoningContent: fmt.Sprintf("I should look at file %d first.", n),
			ToolCalls: []iface.ToolCall{{ID: fmt.Sprintf("call_%d", n), Name: "read_file", Arguments: fmt.Sprintf(`{"path": "src/f%d.go"}`, n)}}}
	}
	result := func(n int) iface.Message {
		return iface.Message{Role: "tool", ToolCallID: fmt.Sprintf("call_%d", n), Name: "read_file",
			Content: strings.Repeat(fmt.Sprintf("line %d of the file; ", n), 6)}
	}
	var evaluated []int
	for turn := range 9 {
		prompt, err := b.Tokenize(t.Context(), iface.PrefillRequest{Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		toks := prompt.Tokens
		want := sim.Prompt(toks, ckpt.UserStarts(toks, e.delims), 0)
		// The host's way (its Tokenize's tokens, FromChat) and the
		// messages themselves, turn about: both find the user messages.
		req := iface.PrefillRequest{Tokens: toks, FromChat: true}
		if turn%2 == 1 {
			req = iface.PrefillRequest{Messages: msgs}
		}
		r, err := b.Prefill(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		got := len(toks) - r.Reused
		evaluated = append(evaluated, got)
		if got != want {
			t.Errorf("turn %d: evaluated %d of %d prompt tokens, the rules give %d", turn, got, len(toks), want)
		}
		if err := iso.ClearSlot(t.Context(), 0); err != nil {
			t.Fatal(err)
		}
		closeLogits(t, iso, fmt.Sprintf("turn %d against the prompt evaluated whole", turn), r.Logits, prefillTokens(t, iso, 0, toks).Logits)
		reply, _ := decode(t, b, 0, 6, iface.SamplerParams{IgnoreEOS: true})
		sim.Seq = append(sim.Seq, reply...)

		n := turn + 1
		switch turn % 3 {
		case 0, 1: // a tool call and its result
			msgs = append(msgs, call(n), result(n))
		case 2: // the answer, and the user speaks again
			msgs = append(msgs, iface.Message{Role: "assistant", ReasoningContent: "The files say enough.", Content: fmt.Sprintf("Answer %d.", n)},
				iface.Message{Role: "user", Content: fmt.Sprintf("Thanks. Now question %d: what about the tests?", n)})
		}
	}
	t.Logf("prompt tokens evaluated by turn: %v; checkpoints taken at %v", evaluated, sim.Taken)
	if st := e.ckpts.Stats(); st.Restored == 0 {
		t.Errorf("no checkpoint restored in nine turns: %+v", st)
	}
}
