//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// embedReferenceKernels makes the embedding context's CPU work run ggml's
// reference kernels, whose results do not depend on how many tokens a
// batch holds, so that an input's embedding in a batch of inputs and
// alone can be held equal bit for bit.
func embedReferenceKernels(t testing.TB, b *Backend) {
	t.Helper()
	e := b.eng.Load()
	if n := e.embed.c.UseReferenceKernels(); n == 0 && e.device == "" {
		t.Fatal("no CPU backend in the embedding context to switch to the reference kernels")
	}
}

func embed(t testing.TB, b *Backend, norm *int, inputs ...[]int32) []iface.Embedding {
	t.Helper()
	out, err := b.Embed(context.Background(), iface.EmbedRequest{Inputs: inputs, Normalize: norm})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	if len(out) != len(inputs) {
		t.Fatalf("Embed: %d embeddings for %d inputs", len(out), len(inputs))
	}
	for i, e := range out {
		if e.NTokens != len(inputs[i]) {
			t.Fatalf("input %d: %d tokens evaluated, it has %d", i, e.NTokens, len(inputs[i]))
		}
	}
	return out
}

func l2(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// embedInputs are token sequences of the tiny model's vocabulary of
// several lengths.
func embedInputs(t testing.TB, b *Backend) [][]int32 {
	t.Helper()
	var out [][]int32
	for _, s := range []string{"The quick brown fox", "jumps", story, "over the lazy dog, twice over"} {
		toks, err := b.eng.Load().model.tokenize(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, toks)
	}
	return out
}

// TestEmbedLlamaPoolings: each pooling of llama.cpp, its embeddings
// computed in the embedding context: pooling none gives every token's
// vector, and the pooled ones are those vectors pooled (the mean, the
// first, the last) and normalised by llama.cpp's common_embd_normalize to
// norm 1; an input's embedding in a batch is its embedding alone, bit for
// bit; INFO says the pooling and only an asked-for rank says rerank.
func TestEmbedLlamaPoolings(t *testing.T) {
	model := tiny(t)
	none := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "none"})
	embedReferenceKernels(t, none)
	inputs := embedInputs(t, none)
	rows := embed(t, none, nil, inputs...)
	for i, e := range rows {
		if len(e.Vectors) != len(inputs[i]) || len(e.Vectors[0]) != 64 {
			t.Fatalf("pooling none, input %d: %d vectors of %d", i, len(e.Vectors), len(e.Vectors[0]))
		}
	}
	pooled := map[string]func(rows [][]float32) []float32{
		"mean": func(rows [][]float32) []float32 {
			m := make([]float32, len(rows[0]))
			for _, r := range rows {
				for j, x := range r {
					m[j] += x / float32(len(rows))
				}
			}
			return m
		},
		"cls":  func(rows [][]float32) []float32 { return rows[0] },
		"last": func(rows [][]float32) []float32 { return rows[len(rows)-1] },
	}
	for name, pool := range pooled {
		b := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: name})
		embedReferenceKernels(t, b)
		info, _ := b.Info(context.Background())
		if info.Pooling != name || !slices.Contains(info.Capabilities, iface.CapEmbed) || slices.Contains(info.Capabilities, iface.CapRerank) {
			t.Errorf("%s: INFO pooling %q, capabilities %v", name, info.Pooling, info.Capabilities)
		}
		batch := embed(t, b, nil, inputs...)
		for i, e := range batch {
			v := e.Vectors[0]
			if len(e.Vectors) != 1 || len(v) != 64 || math.Abs(l2(v)-1) > 1e-5 {
				t.Errorf("%s, input %d: %d vectors, norm %v", name, i, len(e.Vectors), l2(v))
			}
			want := slices.Clone(pool(rows[i].Vectors))
			n := l2(want)
			for j := range want {
				want[j] /= float32(n)
			}
			if d := maxDiff(v, want); d > 1e-5 {
				t.Errorf("%s, input %d: differs from its tokens' vectors pooled by %g", name, i, d)
			}
			alone := embed(t, b, nil, inputs[i])
			if !reflect.DeepEqual(alone[0], e) {
				t.Errorf("%s, input %d: alone it differs from in the batch by %g", name, i, maxDiff(alone[0].Vectors[0], v))
			}
		}
		two, minusOne := 2, -1
		raw := embed(t, b, &minusOne, inputs[0])[0].Vectors[0]
		if d := maxDiff(raw, pool(rows[0].Vectors)); d > 1e-5 {
			t.Errorf("%s: unnormalised differs from the pooled vectors by %g", name, d)
		}
		if got := embed(t, b, &two, inputs[0])[0]; !reflect.DeepEqual(got, batch[0]) {
			t.Errorf("%s: normalize 2 differs from the default", name)
		}
	}
}

// TestEmbedLlamaSplit: last pooling takes inputs longer than a physical
// batch over several (the pooled token attends to the cells before it);
// the embedding is the one of a context whose batch holds it whole.
func TestEmbedLlamaSplit(t *testing.T) {
	model := tiny(t)
	small := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "last", llamaopt.OptNUBatch: "64"})
	whole := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "last", llamaopt.OptNUBatch: "512"})
	embedReferenceKernels(t, small)
	embedReferenceKernels(t, whole)
	long, err := small.eng.Load().model.tokenize(strings.Repeat(story+" ", 4))
	if err != nil || len(long) <= 64 {
		t.Fatalf("the story has %d tokens (%v): too short to split", len(long), err)
	}
	in := [][]int32{long[:40], long, long[:100]}
	a, b := embed(t, small, nil, in...), embed(t, whole, nil, in...)
	for i := range in {
		if d := maxDiff(a[i].Vectors[0], b[i].Vectors[0]); d > 1e-5 {
			t.Errorf("input %d of %d tokens: batches of 64 and of 512 differ by %g", i, len(in[i]), d)
		}
	}
	if small.eng.Load().embed.layout.cells != 2048 {
		t.Errorf("the split context holds %d cells, want a slot's 2048", small.eng.Load().embed.layout.cells)
	}
	mean := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "mean", llamaopt.OptNUBatch: "64"})
	if _, err := mean.Embed(context.Background(), iface.EmbedRequest{Inputs: [][]int32{long[:10], long}}); !errors.Is(err, iface.ErrBadRequest) ||
		!strings.Contains(err.Error(), "input[1]") || !strings.Contains(err.Error(), "physical batch of 64") {
		t.Errorf("a mean-pooled input longer than n_ubatch: %v", err)
	}
}

// TestEmbedLlamaSlotsUntouched: embeddings leave every slot's sequence and
// KV state as they were, and run while a slot decodes, whose tokens are
// the tokens it decodes alone.
func TestEmbedLlamaSlotsUntouched(t *testing.T) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "mean"})
	referenceKernels(t, b)
	embedReferenceKernels(t, b)
	inputs := embedInputs(t, b)
	prefill(t, b, 0, "Once upon a time")
	before := reference(t, b, 0)
	info0, _ := b.Slot(context.Background(), 0)
	embed(t, b, nil, inputs...)
	if after := reference(t, b, 0); !bytes.Equal(before, after) {
		t.Fatal("slot 0's state changed across an Embed")
	}
	if info1, _ := b.Slot(context.Background(), 0); !reflect.DeepEqual(info0, info1) {
		t.Fatalf("slot 0 was %+v, is %+v", info0, info1)
	}
	alone, _ := decode(t, b, 0, 24, iface.SamplerParams{})
	b.ClearSlot(context.Background(), 0)
	prefill(t, b, 0, "Once upon a time")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var embedErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.Embed(context.Background(), iface.EmbedRequest{Inputs: inputs}); err != nil {
				embedErr = err
				return
			}
		}
	}()
	during, _ := decode(t, b, 0, 24, iface.SamplerParams{})
	close(stop)
	wg.Wait()
	if embedErr != nil {
		t.Fatal(embedErr)
	}
	if !slices.Equal(alone, during) {
		t.Errorf("decoded %v while embedding, %v alone", during, alone)
	}
	if si, _ := b.Slot(context.Background(), 1); si.NPast != 0 {
		t.Errorf("slot 1 holds %d tokens after the embeddings", si.NPast)
	}
}

// TestEmbedLlamaRefusals: no embeddings without the option; bad inputs
// named.
func TestEmbedLlamaRefusals(t *testing.T) {
	model := tiny(t)
	plain := load(t, model, 1, nil)
	if _, err := plain.Embed(context.Background(), iface.EmbedRequest{Inputs: [][]int32{{1, 2}}}); !errors.Is(err, iface.ErrNotImplemented) {
		t.Errorf("without embeddings: %v", err)
	}
	if info, _ := plain.Info(context.Background()); info.Pooling != "" || slices.Contains(info.Capabilities, iface.CapEmbed) {
		t.Errorf("without embeddings, INFO says pooling %q, capabilities %v", info.Pooling, info.Capabilities)
	}
	b := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true"})
	if info, _ := b.Info(context.Background()); info.Pooling != iface.PoolingNone {
		t.Errorf("a model naming no pooling pools %q, want none (llama.cpp's)", info.Pooling)
	}
	for _, c := range []struct {
		in   [][]int32
		want string
	}{
		{[][]int32{{1}, {}}, "input[1] is empty"},
		{[][]int32{{1, 512}}, "input[0]: token 512"},
		{[][]int32{{1, -1}}, "input[0]: token -1"},
		{[][]int32{make([]int32, 513)}, "input[0] has 513 tokens"},
	} {
		if _, err := b.Embed(context.Background(), iface.EmbedRequest{Inputs: c.in}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d inputs: %v, want %q", len(c.in), err, c.want)
		}
	}
}

// TestEmbedLlamaRank: a qwen3 reranker (rank pooling, a classifier head of
// two labels, a rerank template, as Qwen3-Reranker's GGUF): its scores are
// the head's outputs softmaxed (they sum to 1 unnormalised), the model's
// pooling is rank without the option, and rerank is advertised only when
// rank was asked for.
func TestEmbedLlamaRank(t *testing.T) {
	c := gguf.TinyQwen3()
	c.Pooling, c.Classifier, c.RerankTemplate = "rank", []string{"yes", "no"}, "Q: {query}\nD: {document}\n"
	model := modelFile(t, "qwen3-rank", c)
	asked := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptPooling: "rank"})
	info, _ := asked.Info(context.Background())
	if info.Pooling != iface.PoolingRank || !slices.Contains(info.Capabilities, iface.CapRerank) || info.RerankTemplate != c.RerankTemplate {
		t.Errorf("INFO: pooling %q, capabilities %v, rerank template %q", info.Pooling, info.Capabilities, info.RerankTemplate)
	}
	inputs := embedInputs(t, asked)
	minusOne := -1
	for i, e := range embed(t, asked, &minusOne, inputs...) {
		v := e.Vectors[0]
		if len(v) != 2 || math.Abs(float64(v[0]+v[1])-1) > 1e-5 || v[0] <= 0 || v[1] <= 0 {
			t.Errorf("input %d: scores %v, want a softmax of two", i, v)
		}
	}
	own := load(t, model, 1, map[string]string{llamaopt.OptEmbeddings: "true"})
	if info, _ := own.Info(context.Background()); info.Pooling != iface.PoolingRank || slices.Contains(info.Capabilities, iface.CapRerank) {
		t.Errorf("the model's own rank pooling: %q %v, want rank without the rerank capability", info.Pooling, info.Capabilities)
	}
}

// TestSpecialTokensLlama: INFO's special tokens are the vocabulary's:
// Qwen3's tokenizer has FIM tokens (each its text's one token), Llama 3's
// none; BOS is added by the generated vocabulary.
func TestSpecialTokensLlama(t *testing.T) {
	b := load(t, qwen3Model(t), 1, nil)
	info, _ := b.Info(context.Background())
	sp := info.Special
	if sp == nil || info.NBatch != llamaopt.DefaultNBatch {
		t.Fatalf("INFO: special %+v, n_batch %d", sp, info.NBatch)
	}
	for text, id := range map[string]int32{"<|fim_prefix|>": sp.FIMPre, "<|fim_suffix|>": sp.FIMSuf, "<|fim_middle|>": sp.FIMMid,
		"<|fim_pad|>": sp.FIMPad, "<|repo_name|>": sp.FIMRep, "<|file_sep|>": sp.FIMSep} {
		p, err := b.Tokenize(context.Background(), iface.PrefillRequest{Text: text, Tokenize: &iface.TokenizeOptions{ParseSpecial: true}})
		if err != nil || len(p.Tokens) != 1 || p.Tokens[0] != id {
			t.Errorf("%s: tokenized %v (%v), INFO says %d", text, p.Tokens, err, id)
		}
	}
	l3 := load(t, testModel(t, "llama-llama3"), 1, nil)
	info, _ = l3.Info(context.Background())
	if s := info.Special; s.FIMPre != iface.NoToken || s.FIMSuf != iface.NoToken || s.FIMMid != iface.NoToken || s.BOS == iface.NoToken {
		t.Errorf("Llama 3: %+v, want no FIM tokens, a BOS", s)
	}
	gen := load(t, tiny(t), 1, nil)
	info, _ = gen.Info(context.Background())
	if s := info.Special; s.BOS != gguf.TokBOS || s.EOS != gguf.TokEOS || !s.AddBOS || s.AddEOS || s.FIMPre != iface.NoToken {
		t.Errorf("the generated vocabulary: %+v", s)
	}
}

// embedBenchModel is a dense qwen3 big enough for its steps to be timed: 4
// blocks of 256, a vocabulary of 8192 (an embedding pass computes every
// token's logits, as llama.cpp does for a context that outputs embeddings).
func embedBenchModel(b *testing.B, pooling string) string {
	c := gguf.TinyQwen3()
	c.Layers, c.Embd, c.Heads, c.KVHeads, c.FF, c.Vocab, c.Type, c.Pooling = 4, 256, 8, 4, 768, 8192, gguf.WeightF16, pooling
	return modelFile(b, "bench-qwen3-"+pooling, c)
}

func benchInputs(n, length int) [][]int32 {
	in := make([][]int32, n)
	for i := range in {
		for j := range length {
			in[i] = append(in[i], int32(100+(i*7919+j*104729)%8000))
		}
	}
	return in
}

// BenchmarkEmbedBeside times a slot's greedy decode of 32 tokens alone and
// while embeddings of 8 inputs of 32 tokens run without pause beside it:
// the embedding context's passes take the context lock between decode
// steps, so each step waits for one pass. It reports ms per decoded token
// both ways, embedded tokens per second beside the decode, and the
// embedding context's memory.
func BenchmarkEmbedBeside(b *testing.B) {
	be := load(b, embedBenchModel(b, "mean"), 2, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptNThreads: "2", llamaopt.OptNCtx: "4096"})
	e := be.eng.Load()
	in := benchInputs(8, 32)
	ctx := context.Background()
	run := func() time.Duration {
		be.ClearSlot(ctx, 0)
		prefillTokens(b, be, 0, in[0])
		start := time.Now()
		decode(b, be, 0, 32, iface.SamplerParams{})
		return time.Since(start)
	}
	var alone, beside time.Duration
	var embedded int64
	for b.Loop() {
		alone += run()
		stop := make(chan struct{})
		done := make(chan int64)
		go func() {
			var n int64
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				if _, err := be.Embed(ctx, iface.EmbedRequest{Inputs: in}); err != nil {
					b.Error(err)
					done <- n
					return
				}
				n += 8 * 32
			}
		}()
		d := run()
		close(stop)
		beside += d
		embedded += <-done
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / 32 / float64(b.N) }
	b.ReportMetric(per(alone), "ms/token-alone")
	b.ReportMetric(per(beside), "ms/token-beside")
	b.ReportMetric(float64(embedded)/beside.Seconds(), "embedded-tokens/s")
	b.ReportMetric(float64(e.embed.kvBytes)/(1<<20), "kv-MiB")
	b.ReportMetric(float64(e.embed.computeBytes)/(1<<20), "compute-MiB")
}

// BenchmarkEmbedBatch times 32 inputs of 64 tokens in one Embed (passes of
// 8: the physical batch of 512) against one Embed an input.
func BenchmarkEmbedBatch(b *testing.B) {
	be := load(b, embedBenchModel(b, "mean"), 1, map[string]string{llamaopt.OptEmbeddings: "true", llamaopt.OptNThreads: "2"})
	in := benchInputs(32, 64)
	ctx := context.Background()
	var batched, single time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := be.Embed(ctx, iface.EmbedRequest{Inputs: in}); err != nil {
			b.Fatal(err)
		}
		batched += time.Since(start)
		start = time.Now()
		for i := range in {
			if _, err := be.Embed(ctx, iface.EmbedRequest{Inputs: in[i : i+1]}); err != nil {
				b.Fatal(err)
			}
		}
		single += time.Since(start)
	}
	tokens := float64(32 * 64 * b.N)
	b.ReportMetric(tokens/batched.Seconds(), "tokens/s-batched")
	b.ReportMetric(tokens/single.Seconds(), "tokens/s-one-by-one")
}
