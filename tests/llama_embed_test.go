//go:build llama

package tests

// Embeddings, rerank and infill end to end: `hydra-engine llama-server`
// with --embeddings or --reranking on the llama plugin, beside llama.cpp's
// own llama-server built from the plugin's tree (make llama-server) on the
// same random-weight Qwen3 models with Qwen3's real tokenizer, and the
// replies compared: the same vectors, the same scores and order, the same
// infill prompt (tokens_evaluated) and greedy completion, the same errors.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

// referenceServer is llama.cpp's llama-server of the plugin's tree.
func referenceServer(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "bin", "llama-server", "llama-server"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no llama.cpp llama-server at %s to compare with: make llama-server", p)
	}
	return p
}

// startReference runs llama.cpp's llama-server until /health answers 200.
func startReference(t *testing.T, bin string, port int, args []string) {
	t.Helper()
	logs := enginetest.NewLog(0)
	cmd := exec.Command(bin, append([]string{"--host", "127.0.0.1", "--port", fmt.Sprint(port), "--no-webui"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("LLAMA-SERVER LOG\n%s", logs)
		}
	})
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("llama-server exited during start: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("llama-server not healthy after 90s\n%s", logs)
		}
	}
}

// pair is the engine and llama-server started alike on one model.
type pair struct{ ours, ref string }

func startPair(t *testing.T, model string, flags ...string) pair {
	t.Helper()
	ref := referenceServer(t)
	llamaSetup(t)
	args := append([]string{"--model", model, "--parallel", "2", "--ctx-size", "2048", "--threads", "1", "--threads-batch", "1"}, flags...)
	op, rp := freePort(t), freePort(t)
	startLlamaServer(t, op, append([]string{"--host", "127.0.0.1", "--port", fmt.Sprint(op)}, args...))
	startReference(t, ref, rp, args)
	return pair{fmt.Sprintf("http://127.0.0.1:%d", op), fmt.Sprintf("http://127.0.0.1:%d", rp)}
}

func postBody(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// both posts body to path on each server; their statuses must agree.
func (p pair) both(t *testing.T, path, body string) (ours, ref []byte) {
	t.Helper()
	oc, ours := postBody(t, p.ours+path, body)
	rc, ref := postBody(t, p.ref+path, body)
	if oc != rc {
		t.Errorf("%s %s: status %d here, %d from llama-server\nhere: %s\nllama-server: %s", path, body, oc, rc, ours, ref)
	}
	return ours, ref
}

func vecDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

func vecNorm(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// embeddingTolerance bounds the difference of a value computed here and by
// llama-server: the same kernels on the same CPU, in batches of other
// shapes.
const embeddingTolerance = 1e-4

// batchTolerance bounds it where the batches' shapes differ enough for
// ggml's CPU kernels to take other paths (flash attention tiles 64 queries
// or more with Q in f32, fewer go row by row with Q rounded to f16): a
// softmaxed score moves in the third decimal.
const batchTolerance = 5e-3

// qwen3Models writes a Qwen3-Embedding-like model (last pooling) and a
// Qwen3-Reranker-like one (rank pooling, a yes/no classifier head, a rerank
// template), with Qwen3's real tokenizer, FIM tokens included.
func qwen3Models(t *testing.T) (embedding, reranker string) {
	t.Helper()
	dir := t.TempDir()
	c := withQwen3Tokenizer(t, gguf.TinyQwen3())
	c.Type = gguf.WeightF16
	c.Pooling = "last"
	embedding = filepath.Join(dir, "embedding.gguf")
	if err := gguf.WriteFile(embedding, c); err != nil {
		t.Fatal(err)
	}
	c.Pooling, c.Classifier = "rank", []string{"yes", "no"}
	c.RerankTemplate = "<|im_start|>system\nJudge the document.<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
	reranker = filepath.Join(dir, "reranker.gguf")
	if err := gguf.WriteFile(reranker, c); err != nil {
		t.Fatal(err)
	}
	return embedding, reranker
}

// TestLlamaEmbeddings: /v1/embeddings and /embeddings give llama-server's
// vectors (norm 1, an input in a batch as alone), the OpenAI Node SDK reads
// them (base64, its default, and float); /infill builds llama-server's
// prompt and decodes its greedy completion; bad input is a 400 naming the
// field with no slot left busy; /rerank without --reranking is llama-server's
// 501.
func TestLlamaEmbeddings(t *testing.T) {
	embedding, _ := qwen3Models(t)
	p := startPair(t, embedding, "--embeddings")
	inputs := `["The quick brown fox","jumps over","the lazy dog, twice over and again"]`
	ours, ref := p.both(t, "/v1/embeddings", `{"input":`+inputs+`,"encoding_format":"float"}`)
	type oai struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	var o, r oai
	if json.Unmarshal(ours, &o) != nil || json.Unmarshal(ref, &r) != nil || len(o.Data) != 3 || len(r.Data) != 3 {
		t.Fatalf("/v1/embeddings: %s\nllama-server: %s", ours, ref)
	}
	if o.Usage != r.Usage {
		t.Errorf("usage %+v, llama-server %+v", o.Usage, r.Usage)
	}
	worst := 0.0
	for i := range o.Data {
		d := vecDiff(o.Data[i].Embedding, r.Data[i].Embedding)
		worst = max(worst, d)
		if o.Data[i].Index != i || d > embeddingTolerance || math.Abs(vecNorm(o.Data[i].Embedding)-1) > 1e-5 {
			t.Errorf("input %d: index %d, %d values differing from llama-server's by %g, norm %v", i, o.Data[i].Index,
				len(o.Data[i].Embedding), d, vecNorm(o.Data[i].Embedding))
		}
	}
	t.Logf("/v1/embeddings: %d inputs of %d values, the largest difference from llama-server %g", len(o.Data), len(o.Data[0].Embedding), worst)

	// llama-server's own shape, alone: the batch's vector.
	ours, ref = p.both(t, "/embeddings", `{"content":"jumps over"}`)
	var on, rn []struct {
		Index     int         `json:"index"`
		Embedding [][]float64 `json:"embedding"`
	}
	if json.Unmarshal(ours, &on) != nil || json.Unmarshal(ref, &rn) != nil || len(on) != 1 || len(rn) != 1 || len(on[0].Embedding) != 1 {
		t.Fatalf("/embeddings: %s\nllama-server: %s", ours, ref)
	}
	if d := vecDiff(on[0].Embedding[0], rn[0].Embedding[0]); d > embeddingTolerance {
		t.Errorf("/embeddings differs from llama-server's by %g", d)
	}
	if d := vecDiff(on[0].Embedding[0], o.Data[1].Embedding); d > embeddingTolerance {
		t.Errorf("an input alone differs from it in a batch by %g", d)
	}

	checkSDKEmbeddings(t, p.ours, o.Data[1].Embedding)
	checkInfill(t, p)
	checkEmbedRefusals(t, p)
}

// checkSDKEmbeddings runs tests/openai/embeddings.mjs against the engine.
func checkSDKEmbeddings(t *testing.T, base string, want []float64) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the OpenAI Node SDK runs under node")
	}
	if _, err := os.Stat(filepath.Join("openai", "node_modules", "openai", "package.json")); err != nil {
		t.Skip("the OpenAI SDK is not installed in tests/openai: make openai-client (npm)")
	}
	cmd := exec.Command(node, filepath.Join("openai", "embeddings.mjs"), base)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("embeddings.mjs: %v: %s %s", err, out, stderr.Bytes())
	}
	var got struct {
		Batch struct {
			Data []struct {
				Index     int       `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		} `json:"batch"`
		One struct {
			Embedding []float64 `json:"embedding"`
		} `json:"one"`
		Bad struct {
			Status int    `json:"status"`
			Param  string `json:"param"`
		} `json:"bad"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Batch.Data) != 3 {
		t.Fatalf("embeddings.mjs printed %s: %v", out, err)
	}
	// base64 decodes to the float32s the float reply writes.
	if d := vecDiff(got.Batch.Data[1].Embedding, want); d > 1e-6 {
		t.Errorf("the SDK's base64 batch differs from the float reply by %g", d)
	}
	if d := vecDiff(got.One.Embedding, want); d > embeddingTolerance {
		t.Errorf("the SDK's float reply differs by %g", d)
	}
	if got.Batch.Usage.PromptTokens == 0 || got.Batch.Usage.TotalTokens != got.Batch.Usage.PromptTokens {
		t.Errorf("the SDK read usage %+v", got.Batch.Usage)
	}
	if got.Bad.Status != 400 || got.Bad.Param != "encoding_format" {
		t.Errorf("encoding_format int8: %+v", got.Bad)
	}
}

// checkInfill: the same prompt (its tokens) and the same greedy completion
// as llama-server's, streamed too; a slot's share of 1024 cells leaves
// room for the repository's files (n_batch is n_ubatch's 512 with
// --embeddings, in llama-server as here).
func checkInfill(t *testing.T, p pair) {
	t.Helper()
	body := `{"input_prefix":"def add(a, b):\n    ","input_suffix":"\n\nprint(add(1, 2))\n",` +
		`"input_extra":[{"filename":"util.py","text":"import math\n\ndef sub(a, b):\n    return a - b\n"},{"text":"x = 1\n"}],` +
		`"prompt":"return","n_predict":8,"temperature":0,"top_k":1}`
	ours, ref := p.both(t, "/infill", body)
	type native struct {
		Content         *string `json:"content"`
		TokensEvaluated int     `json:"tokens_evaluated"`
		TokensPredicted int     `json:"tokens_predicted"`
		Stop            bool    `json:"stop"`
		StopType        string  `json:"stop_type"`
		Prompt          string  `json:"prompt"` // the prompt's tokens as text: the FIM tokens and the files
	}
	var o, r native
	if json.Unmarshal(ours, &o) != nil || json.Unmarshal(ref, &r) != nil || o.Content == nil || r.Content == nil {
		t.Fatalf("/infill: %s\nllama-server: %s", ours, ref)
	}
	if o.TokensEvaluated != r.TokensEvaluated || *o.Content != *r.Content || o.TokensPredicted != r.TokensPredicted ||
		o.Stop != r.Stop || o.StopType != r.StopType || o.Prompt != r.Prompt || !strings.Contains(o.Prompt, "<|file_sep|>util.py\n") {
		t.Errorf("/infill: %+v %q\nllama-server: %+v %q", o, *o.Content, r, *r.Content)
	}
	t.Logf("/infill: a prompt of %d tokens, %q: %q (llama-server: %d, %q)", o.TokensEvaluated, o.Prompt, *o.Content, r.TokensEvaluated, *r.Content)
	streamed := streamInfill(t, p.ours+"/infill", strings.Replace(body, `"n_predict":8`, `"n_predict":8,"stream":true`, 1))
	refStreamed := streamInfill(t, p.ref+"/infill", strings.Replace(body, `"n_predict":8`, `"n_predict":8,"stream":true`, 1))
	if streamed != *o.Content || refStreamed != *r.Content {
		t.Errorf("streamed %q here, %q from llama-server; whole %q", streamed, refStreamed, *o.Content)
	}
}

// streamInfill is a streamed /infill's content, its events checked: stop
// false until the last, no [DONE].
func streamInfill(t *testing.T, url, body string) string {
	t.Helper()
	code, b := postBody(t, url, body)
	if code != 200 {
		t.Fatalf("%s: %d %s", url, code, b)
	}
	var content strings.Builder
	var events []map[string]any
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		var ev map[string]any
		if !ok || json.Unmarshal([]byte(data), &ev) != nil {
			t.Fatalf("%s: stream line %q", url, line)
		}
		events = append(events, ev)
		if s, ok := ev["content"].(string); ok {
			content.WriteString(s)
		}
	}
	if len(events) == 0 || events[len(events)-1]["stop"] != true {
		t.Errorf("%s: events %v", url, events)
	}
	return content.String()
}

// checkEmbedRefusals: the errors llama-server gives where it gives a 400
// or 501 are the same here (status and message); bad input llama-server
// answers with a 500 is a 400 naming the field; no slot is left busy.
func checkEmbedRefusals(t *testing.T, p pair) {
	t.Helper()
	for _, c := range []struct{ path, body string }{
		{"/v1/embeddings", `{}`},
		{"/v1/embeddings", `{"input":"a","encoding_format":"int8"}`},
		{"/v1/embeddings", `{"input":["a",""]}`},
		{"/rerank", `{"query":"q","documents":["d"]}`},
		{"/infill", `{"input_prefix":"a","input_suffix":"b","input_extra":{}}`},
		{"/infill", `{"input_prefix":"a","input_suffix":"b","input_extra":[{"filename":"x"}]}`},
	} {
		ours, ref := p.both(t, c.path, c.body)
		var o, r struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(ours, &o)
		_ = json.Unmarshal(ref, &r)
		if o.Error.Message != r.Error.Message || o.Error.Type != r.Error.Type || o.Error.Message == "" {
			t.Errorf("%s %s: %s\nllama-server: %s", c.path, c.body, ours, ref)
		}
	}
	for _, body := range []string{`{"input":[[1,999999999]]}`, `{"input":5}`, `{"input":"` + strings.Repeat("a ", 1100) + `"}`} {
		code, b := postBody(t, p.ours+"/v1/embeddings", body)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || code != 400 || !strings.HasPrefix(e.Error.Param, "input") { // input, or the path to the input at fault
			t.Errorf("%.40s: %d %s", body, code, b)
		}
	}
	resp, err := http.Get(p.ours + "/slots")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	if json.NewDecoder(resp.Body).Decode(&slots) != nil || len(slots) != 2 || slots[0].IsProcessing || slots[1].IsProcessing {
		t.Errorf("slots after the refusals: %+v", slots)
	}
}

// TestLlamaRerank: /v1/rerank on a Qwen3-Reranker-like model with
// --reranking gives llama-server's order and scores; /rerank with TEI's
// texts its list.
func TestLlamaRerank(t *testing.T) {
	_, reranker := qwen3Models(t)
	p := startPair(t, reranker, "--reranking")
	body := `{"query":"What is a fox?","documents":["A fox is a small canid.","The sky is blue.","Foxes hunt at night.","Bread needs flour."],"top_n":3}`
	ours, ref := p.both(t, "/v1/rerank", body)
	type jina struct {
		Results []struct {
			Index          int     `json:"index"`
			RelevanceScore float64 `json:"relevance_score"`
		} `json:"results"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	var o, r jina
	if json.Unmarshal(ours, &o) != nil || json.Unmarshal(ref, &r) != nil || len(o.Results) != 3 || len(r.Results) != 3 {
		t.Fatalf("/v1/rerank: %s\nllama-server: %s", ours, ref)
	}
	// Four prompts of 30-odd tokens are one batch here, of 131 tokens, where
	// ggml's CPU flash attention tiles its queries (64 or more) with Q in
	// f32; llama-server's two slots take them in batches under 64, row by
	// row with Q rounded to f16. The scores differ by that rounding; each
	// document alone, in batches of one shape, gives llama-server's.
	for i := range o.Results {
		if o.Results[i].Index != r.Results[i].Index || math.Abs(o.Results[i].RelevanceScore-r.Results[i].RelevanceScore) > batchTolerance {
			t.Errorf("result %d: %+v, llama-server %+v", i, o.Results[i], r.Results[i])
		}
	}
	for _, d := range []string{"A fox is a small canid.", "Bread needs flour."} {
		ours, ref := p.both(t, "/v1/rerank", `{"query":"What is a fox?","documents":["`+d+`"]}`)
		var o1, r1 jina
		if json.Unmarshal(ours, &o1) != nil || json.Unmarshal(ref, &r1) != nil || len(o1.Results) != 1 || len(r1.Results) != 1 ||
			math.Abs(o1.Results[0].RelevanceScore-r1.Results[0].RelevanceScore) > embeddingTolerance {
			t.Errorf("%q alone: %s\nllama-server: %s", d, ours, ref)
		}
	}
	if o.Usage != r.Usage {
		t.Errorf("usage %+v, llama-server %+v", o.Usage, r.Usage)
	}
	t.Logf("/v1/rerank: %s", ours)
	ours, ref = p.both(t, "/rerank", `{"query":"fox","texts":["a fox","no"],"return_text":true}`)
	var ot, rt []struct {
		Index int     `json:"index"`
		Score float64 `json:"score"`
		Text  string  `json:"text"`
	}
	if json.Unmarshal(ours, &ot) != nil || json.Unmarshal(ref, &rt) != nil || len(ot) != 2 || len(rt) != 2 {
		t.Fatalf("/rerank TEI: %s\nllama-server: %s", ours, ref)
	}
	for i := range ot {
		if ot[i].Index != rt[i].Index || ot[i].Text != rt[i].Text || math.Abs(ot[i].Score-rt[i].Score) > batchTolerance {
			t.Errorf("TEI result %d: %+v, llama-server %+v", i, ot[i], rt[i])
		}
	}
}

// TestLlamaEmbeddingsOff: without --embeddings the embedding routes, and
// /infill on a model without FIM tokens, answer llama-server's 501.
func TestLlamaEmbeddingsOff(t *testing.T) {
	_, model := llamaSetup(t)
	p := startPair(t, model)
	for _, c := range []struct{ path, body string }{
		{"/v1/embeddings", `{"input":"a"}`},
		{"/embedding", `{"content":"a"}`},
		{"/v1/rerank", `{"query":"q","documents":["d"]}`},
		{"/infill", `{"input_prefix":"a","input_suffix":"b"}`},
	} {
		ours, ref := p.both(t, c.path, c.body)
		if !bytes.Equal(normalizeError(t, ours), normalizeError(t, ref)) {
			t.Errorf("%s: %s\nllama-server: %s", c.path, ours, ref)
		}
	}
}

// normalizeError is an error reply's code, message and type, as JSON.
func normalizeError(t *testing.T, b []byte) []byte {
	t.Helper()
	var e struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Errorf("not an error reply: %s", b)
	}
	out, _ := json.Marshal(e)
	return out
}
