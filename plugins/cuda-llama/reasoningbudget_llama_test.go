//go:build llama && cgo

package cudallama

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Tests of the reasoning budget (llama.cpp's common/reasoning-budget in the
// slot's sampler): a random-weight model with Qwen3's tokenizer, whose
// template, as Qwen3's thinking models have it, opens the reasoning in the
// generation prompt, so every reply starts inside <think> and would reason
// for as long as the decode lets it.

// thinkingBackend loads that model with nSlots slots.
func thinkingBackend(t *testing.T, nSlots int) *Backend {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "bin", "tokenizers", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Skipf("no Qwen3 tokenizer: %v (make tokenizers)", err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	const gen = `{{- '<|im_start|>assistant\n' }}`
	if !strings.Contains(cfg.ChatTemplate, gen) {
		t.Fatalf("the Qwen3 template has no generation prompt %s", gen)
	}
	file := filepath.Join(t.TempDir(), "qwen3-thinking.jinja")
	tmpl := strings.Replace(cfg.ChatTemplate, gen, `{{- '<|im_start|>assistant\n<think>\n' }}`, 1)
	if err := os.WriteFile(file, []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	return load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), nSlots, map[string]string{llamaopt.OptChatTemplateFile: file})
}

// specialToken is the one token text tokenizes to.
func specialToken(t *testing.T, b *Backend, text string) int32 {
	t.Helper()
	e, err := b.engine()
	if err != nil {
		t.Fatal(err)
	}
	toks, err := e.model.tokenizeWith(text, false, true)
	if err != nil || len(toks) != 1 {
		t.Fatalf("%q tokenizes to %v (%v), not one token", text, toks, err)
	}
	return toks[0]
}

var budgetChat = iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "Think about the weather."}}}

// budgetDecode decodes n tokens of a reply to budgetChat in slot with
// budget b (nil: none), returning the tokens and the parsed reply.
func budgetDecode(t *testing.T, be *Backend, slot int, b *iface.ReasoningBudget, n int, seed uint64) ([]iface.Token, iface.DecodeResult) {
	t.Helper()
	chat := budgetChat
	var toks []iface.Token
	res, err := be.Decode(context.Background(), iface.DecodeRequest{Slot: slot, NPredict: n, Prompt: &chat,
		Output: &iface.Output{Chat: &chat, ReasoningBudget: b}, Sampler: iface.SamplerParams{Temperature: 1, Seed: seed, IgnoreEOS: true}},
		func(tok iface.Token) error {
			toks = append(toks, tok)
			return nil
		})
	if err != nil {
		t.Fatalf("slot %d, budget %+v: %v", slot, b, err)
	}
	if res.Message == nil {
		t.Fatalf("slot %d, budget %+v: no parsed reply", slot, b)
	}
	return toks, res
}

// wholeUTF8 reports whether a token's piece ends with a whole UTF-8
// sequence: an exhausted budget lets the reasoning go on until one does.
func wholeUTF8(piece string) bool {
	if piece == "" {
		return true
	}
	r, size := utf8.DecodeLastRuneInString(piece)
	return r != utf8.RuneError || size > 1
}

// checkBudget checks a reply of budget n (message msg) in toks: n
// reasoning tokens, more only while the budget's last ones end inside a
// UTF-8 sequence, then the message's tokens and the end tag (end), and
// content after it.
func checkBudget(t *testing.T, toks []iface.Token, res iface.DecodeResult, n int, msg []int32, end int32) {
	t.Helper()
	ids := make([]int32, len(toks))
	for i, tok := range toks {
		ids[i] = tok.ID
	}
	k := slices.Index(ids, end)
	if k < 0 {
		t.Fatalf("budget %d: no end tag in %d tokens", n, len(ids))
	}
	k -= len(msg)
	if k < n || !slices.Equal(ids[k:k+len(msg)], msg) {
		t.Fatalf("budget %d: the end tag after %d reasoning tokens, with %v before it (want the message %v)", n, k, ids[max(k, 0):k+len(msg)], msg)
	}
	for i := n; i < k; i++ { // past the budget only to finish a character
		if wholeUTF8(toks[i-1].Text) {
			t.Errorf("budget %d: reasoning token %d follows %q, which ends a character", n, i, toks[i-1].Text)
		}
	}
	if k > n && !wholeUTF8(toks[k-1].Text) {
		t.Errorf("budget %d: forced after %q, inside a character", n, toks[k-1].Text)
	}
	m := res.Message
	if n == 0 && m.Reasoning != "" {
		t.Errorf("budget 0: reasoning %q", m.Reasoning)
	}
	if n > 0 && m.Reasoning == "" {
		t.Errorf("budget %d: no reasoning in the reply", n)
	}
	if strings.Contains(m.Content, "</think>") || strings.Contains(m.Reasoning, "</think>") {
		t.Errorf("budget %d: the end tag is in the reply: %+v", n, *m)
	}
	if m.Content == "" {
		t.Errorf("budget %d: no content after the reasoning (%d tokens after it)", n, len(toks)-k-len(msg)-1)
	}
	t.Logf("budget %d: %d reasoning tokens, reasoning %q, content %q", n, k, m.Reasoning, m.Content)
}

// TestReasoningBudget: a reply with budget N reasons for N tokens (more
// only to end a UTF-8 character), then the end tag is forced, with the
// budget's message before it, and the reply goes on as content; budget 0
// has no reasoning; without a budget the same reply reasons on.
func TestReasoningBudget(t *testing.T) {
	b := thinkingBackend(t, 1)
	end := specialToken(t, b, "</think>")
	e, _ := b.engine()
	for _, n := range []int{0, 1, 6, 25} {
		toks, res := budgetDecode(t, b, 0, &iface.ReasoningBudget{Tokens: int32(n)}, n+24, 7)
		checkBudget(t, toks, res, n, nil, end)
	}
	msg := "Enough thinking."
	msgToks, err := e.model.tokenizeWith(msg, false, true)
	if err != nil {
		t.Fatal(err)
	}
	toks, res := budgetDecode(t, b, 0, &iface.ReasoningBudget{Tokens: 4, Message: msg}, 40, 7)
	checkBudget(t, toks, res, 4, msgToks, end)
	if !strings.HasSuffix(res.Message.Reasoning, msg) {
		t.Errorf("with a message: reasoning %q does not end with it", res.Message.Reasoning)
	}
	toks, res = budgetDecode(t, b, 0, nil, 40, 7)
	for i, tok := range toks {
		if tok.ID == end {
			t.Errorf("no budget: the reasoning ended at token %d", i)
		}
	}
	if res.Message.Content != "" || res.Message.Reasoning == "" {
		t.Errorf("no budget: the reply is not all reasoning: %+v", *res.Message)
	}
}

// TestReasoningBudgetModelOpens: where the model writes the start tag
// itself (Qwen3's own template leaves it to the model; a logit bias makes
// these random weights write it), the budget counts from it, wins over the
// bias, and a block opened again gets a budget of its own.
func TestReasoningBudgetModelOpens(t *testing.T) {
	b := load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), 1, nil)
	start, end := specialToken(t, b, "<think>"), specialToken(t, b, "</think>")
	chat := budgetChat
	var ids []int32
	_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 10, Prompt: &chat,
		Output:  &iface.Output{Chat: &chat, ReasoningBudget: &iface.ReasoningBudget{Tokens: 3}},
		Sampler: iface.SamplerParams{Temperature: 1, Seed: 3, LogitBias: map[int32]float32{start: 100}}},
		func(tok iface.Token) error {
			ids = append(ids, tok.ID)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	s, E := start, end
	if want := []int32{s, s, s, s, E, s, s, s, s, E}; !slices.Equal(ids, want) {
		t.Errorf("tokens %v, want %v (<think> %d, </think> %d)", ids, want, start, end)
	}
}

// TestReasoningBudgetBatched: slots decoding in the same steps each keep
// the budget of their own request.
func TestReasoningBudgetBatched(t *testing.T) {
	budgets := []int{2, 9, 17, -1}
	b := thinkingBackend(t, len(budgets))
	end := specialToken(t, b, "</think>")
	e, _ := b.engine()
	before := e.sched.Steps.Load()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int][]iface.Token{}
	res := map[int]iface.DecodeResult{}
	for slot, n := range budgets {
		wg.Go(func() {
			var rb *iface.ReasoningBudget
			if n >= 0 {
				rb = &iface.ReasoningBudget{Tokens: int32(n)}
			}
			toks, r := budgetDecode(t, b, slot, rb, 40, uint64(11+slot))
			mu.Lock()
			got[slot], res[slot] = toks, r
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for slot, n := range budgets {
		if n < 0 {
			if slices.ContainsFunc(got[slot], func(tok iface.Token) bool { return tok.ID == end }) {
				t.Errorf("slot %d, no budget: the reasoning ended", slot)
			}
			continue
		}
		checkBudget(t, got[slot], res[slot], n, nil, end)
	}
	steps := e.sched.Steps.Load() - before
	if e.sched.Widest.Load() < 2 || steps >= uint64(40*len(budgets)) {
		t.Errorf("the decodes did not share steps: %d steps, at most %d decoders a step", steps, e.sched.Widest.Load())
	}
}

// TestReasoningBudgetGatesLazyGrammar: a tool call's lazy grammar sleeps
// inside the reasoning, as llama-server's, whose sampler holds an unbounded
// budget for that alone, and wakes after it. A logit bias makes these
// weights write only <tool_call> and newlines, so its trigger, "<tool_call>"
// and a newline, comes early: inside the reasoning a <tool_call> still
// follows it; after the forced end tag the woken grammar allows none.
func TestReasoningBudgetGatesLazyGrammar(t *testing.T) {
	b := thinkingBackend(t, 1)
	call, nl, end := specialToken(t, b, "<tool_call>"), specialToken(t, b, "\n"), specialToken(t, b, "</think>")
	// triggered is where the trigger's newline is, from index from on; -1: none.
	triggered := func(ids []int32, from int) int {
		for i := max(from, 1); i < len(ids); i++ {
			if ids[i-1] == call && ids[i] == nl {
				return i
			}
		}
		return -1
	}
	for _, budget := range []*iface.ReasoningBudget{nil, {Tokens: 3}} {
		chat := budgetChat
		chat.Tools = []string{weatherTool}
		var ids []int32
		_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 16, Prompt: &chat,
			Output:  &iface.Output{Chat: &chat, ReasoningBudget: budget},
			Sampler: iface.SamplerParams{Temperature: 1, Seed: 5, LogitBias: map[int32]float32{call: 100, nl: 100}}},
			func(tok iface.Token) error {
				ids = append(ids, tok.ID)
				return nil
			})
		if err != nil {
			t.Fatalf("budget %+v: %v", budget, err)
		}
		t.Logf("budget %+v: %v (<tool_call> %d, newline %d, </think> %d)", budget, ids, call, nl, end)
		if budget == nil {
			i := triggered(ids, 0)
			if i < 0 || !slices.Contains(ids[i:], call) || slices.Contains(ids, end) {
				t.Errorf("no budget: the grammar did not sleep through the reasoning")
			}
			continue
		}
		if !slices.Equal(ids[:4], []int32{ids[0], ids[1], ids[2], end}) {
			t.Fatalf("budget 3: no end tag after 3 tokens")
		}
		i := triggered(ids, 5)
		if i < 0 || slices.Contains(ids[i:], call) {
			t.Errorf("budget 3: after the reasoning the grammar did not wake at its trigger")
		}
	}
}
