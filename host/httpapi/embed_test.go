package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// loadMockWith is the mock loaded with options.
func loadMockWith(t *testing.T, slots int, opts map[string]string) (iface.Backend, iface.BackendInfo) {
	t.Helper()
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: slots, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	return b, info
}

// embedServer serves the mock with embeddings and pooling (none: the
// mock's own).
func embedServer(t *testing.T, pooling string) (iface.Backend, *host.Server, http.Handler) {
	t.Helper()
	opts := map[string]string{mock.OptEmbeddings: "true"}
	if pooling != "" {
		opts[mock.OptPooling] = pooling
	}
	b, info := loadMockWith(t, 2, opts)
	s, h := serve(t, b, info, nil)
	return b, s, h
}

// recordingBackend keeps what Embed and Decode were asked.
type recordingBackend struct {
	iface.Backend
	mu      sync.Mutex
	embeds  []iface.EmbedRequest
	prompts [][]int32
}

func (r *recordingBackend) Embed(ctx context.Context, req iface.EmbedRequest) ([]iface.Embedding, error) {
	r.mu.Lock()
	r.embeds = append(r.embeds, req)
	r.mu.Unlock()
	return r.Backend.Embed(ctx, req)
}

func (r *recordingBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	if req.Prompt != nil {
		r.mu.Lock()
		r.prompts = append(r.prompts, req.Prompt.Tokens)
		r.mu.Unlock()
	}
	return r.Backend.Decode(ctx, req, emit)
}

func decodeBody(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("reply %s: %v", body, err)
	}
}

// errorOf is a reply's error object.
func errorOf(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var out struct {
		Error map[string]any `json:"error"`
	}
	decodeBody(t, body, &out)
	return out.Error
}

func norm2(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

type oaiEmbeddings struct {
	Data []struct {
		Embedding      json.RawMessage `json:"embedding"`
		Index          int             `json:"index"`
		Object         string          `json:"object"`
		EncodingFormat string          `json:"encoding_format"`
	} `json:"data"`
	Model  string `json:"model"`
	Object string `json:"object"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (o oaiEmbeddings) vector(t *testing.T, i int) []float64 {
	t.Helper()
	var v []float64
	if err := json.Unmarshal(o.Data[i].Embedding, &v); err != nil {
		t.Fatalf("data[%d].embedding %s: %v", i, o.Data[i].Embedding, err)
	}
	return v
}

// TestEmbeddingsOff: without --embeddings every embedding route answers
// llama-server's 501, and /rerank too without --reranking.
func TestEmbeddingsOff(t *testing.T) {
	_, h := newTestServer(t, 1)
	for _, path := range []string{"/embedding", "/embeddings", "/v1/embeddings"} {
		rec := post(h, path, `{"input":"hi"}`)
		e := errorOf(t, rec.Body.Bytes())
		if rec.Code != 501 || e["message"] != "This server does not support embeddings. Start it with `--embeddings`" ||
			e["type"] != "not_supported_error" || e["code"] != 501.0 {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	_, _, eh := embedServer(t, iface.PoolingMean)
	for _, hh := range []http.Handler{h, eh} {
		for _, path := range []string{"/rerank", "/reranking", "/v1/rerank", "/v1/reranking"} {
			rec := post(hh, path, `{"query":"q","documents":["d"]}`)
			if e := errorOf(t, rec.Body.Bytes()); rec.Code != 501 || e["message"] != "This server does not support reranking. Start it with `--reranking`" {
				t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
			}
		}
	}
}

// TestOpenAIEmbeddings: /v1/embeddings over the mock: every input shape
// llama-server reads, each input in a batch as it is alone, unit norm,
// base64, usage, the model named echoed; the slots untouched.
func TestOpenAIEmbeddings(t *testing.T) {
	b, s, h := embedServer(t, "")
	// A completion leaves a sequence in a slot; embeddings must not touch it.
	if rec := post(h, "/v1/completions", `{"prompt":"keep me","max_tokens":2}`); rec.Code != 200 {
		t.Fatalf("completion: %d %s", rec.Code, rec.Body)
	}
	before := s.Slots()
	embed := func(body string) oaiEmbeddings {
		t.Helper()
		rec := post(h, "/v1/embeddings", body)
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
		var out oaiEmbeddings
		decodeBody(t, rec.Body.Bytes(), &out)
		return out
	}
	one := embed(`{"input":"hello"}`)
	if len(one.Data) != 1 || one.Object != "list" || one.Data[0].Object != "embedding" || one.Model != "mock" ||
		one.Usage.PromptTokens != 5 || one.Usage.TotalTokens != 5 {
		t.Errorf("one input: %+v", one)
	}
	v := one.vector(t, 0)
	if len(v) != mock.EmbdDim || math.Abs(norm2(v)-1) > 1e-6 {
		t.Errorf("embedding of %d values, norm %v", len(v), norm2(v))
	}
	direct, err := b.Embed(context.Background(), iface.EmbedRequest{Inputs: [][]int32{mock.Tokenize("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	for j := range v {
		if float32(v[j]) != direct[0].Vectors[0][j] {
			t.Fatalf("value %d: %v over HTTP, %v from the backend", j, v[j], direct[0].Vectors[0][j])
		}
	}
	// The same text in every shape: alone, in a batch, as ids, mixed, as an
	// object.
	batch := embed(`{"input":["x","hello",[104,101,108,108,111],[104,"ello"],{"prompt_string":"hello"}],"model":"text-embedding-3-small"}`)
	if len(batch.Data) != 5 || batch.Model != "text-embedding-3-small" || batch.Usage.PromptTokens != 1+4*5 {
		t.Errorf("batch: %d embeddings, model %q, usage %+v", len(batch.Data), batch.Model, batch.Usage)
	}
	for i := 1; i < 5; i++ {
		if batch.Data[i].Index != i || !reflect.DeepEqual(batch.vector(t, i), v) {
			t.Errorf("batch input %d (index %d) differs from the input alone", i, batch.Data[i].Index)
		}
	}
	if reflect.DeepEqual(batch.vector(t, 0), v) {
		t.Errorf("\"x\" and \"hello\" have one embedding")
	}
	ids := embed(`{"input":[104,101,108,108,111]}`) // an array of ids is one input
	if len(ids.Data) != 1 || !reflect.DeepEqual(ids.vector(t, 0), v) {
		t.Errorf("token ids: %+v", ids)
	}
	b64 := embed(`{"input":"hello","encoding_format":"base64"}`)
	var enc string
	if json.Unmarshal(b64.Data[0].Embedding, &enc) != nil || b64.Data[0].EncodingFormat != "base64" {
		t.Fatalf("base64: %s", b64.Data[0].Embedding)
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil || len(raw) != 4*mock.EmbdDim {
		t.Fatalf("base64 %q: %d bytes, %v", enc, len(raw), err)
	}
	for j := range v {
		if math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])) != float32(v[j]) {
			t.Fatalf("base64 value %d differs from the float reply", j)
		}
	}
	// embd_normalize -1 leaves the mean as it is: normalised, it is v.
	rawVec := embed(`{"input":"hello","embd_normalize":-1}`).vector(t, 0)
	if math.Abs(norm2(rawVec)-1) < 1e-3 {
		t.Errorf("embd_normalize -1 gave a unit vector")
	}
	f32 := make([]float32, len(rawVec))
	for j, x := range rawVec {
		f32[j] = float32(x)
	}
	for j, x := range mock.Normalize(f32, 2) {
		if math.Abs(float64(x)-v[j]) > 1e-6 {
			t.Fatalf("the raw vector normalised differs from the default reply at %d", j)
		}
	}
	if after := s.Slots(); !reflect.DeepEqual(after, before) {
		t.Errorf("slots after embeddings: %+v, before %+v", after, before)
	}
}

// TestNativeEmbeddings: /embedding and /embeddings answer llama-server's
// array, as does /v1/embeddings given content; pooling none gives a vector
// a token and is refused by the OpenAI route.
func TestNativeEmbeddings(t *testing.T) {
	_, _, h := embedServer(t, "")
	type native []struct {
		Embedding [][]float64 `json:"embedding"`
		Index     int         `json:"index"`
	}
	for _, c := range []struct{ path, body string }{
		{"/embedding", `{"content":"hello"}`}, {"/embeddings", `{"input":["hello"]}`}, {"/v1/embeddings", `{"content":"hello"}`},
	} {
		rec := post(h, c.path, c.body)
		var out native
		decodeBody(t, rec.Body.Bytes(), &out)
		if rec.Code != 200 || len(out) != 1 || out[0].Index != 0 || len(out[0].Embedding) != 1 || len(out[0].Embedding[0]) != mock.EmbdDim ||
			math.Abs(norm2(out[0].Embedding[0])-1) > 1e-6 {
			t.Errorf("%s %s: %d %s", c.path, c.body, rec.Code, rec.Body)
		}
	}
	_, _, hn := embedServer(t, iface.PoolingNone)
	rec := post(hn, "/embeddings", `{"content":["hi","abc"]}`)
	var out native
	decodeBody(t, rec.Body.Bytes(), &out)
	if rec.Code != 200 || len(out) != 2 || len(out[0].Embedding) != 2 || len(out[1].Embedding) != 3 || out[1].Index != 1 {
		t.Errorf("pooling none: %d %s", rec.Code, rec.Body)
	}
	rec = post(hn, "/v1/embeddings", `{"input":"hi"}`)
	if e := errorOf(t, rec.Body.Bytes()); rec.Code != 400 || e["message"] != "Pooling type 'none' is not OAI compatible. Please use a different pooling type" {
		t.Errorf("OpenAI route, pooling none: %d %s", rec.Code, rec.Body)
	}
}

// TestEmbeddingsBadInput: every bad body is a 400 naming the field, and
// no slot is left busy.
func TestEmbeddingsBadInput(t *testing.T) {
	_, s, h := embedServer(t, "")
	for _, c := range []struct{ body, param, msg string }{
		{`{}`, "", `"input" or "content" must be provided`},
		{`{"input":""}`, "input", "Input content cannot be empty"},
		{`{"input":["a",""]}`, "input", "Input content cannot be empty"},
		{`{"input":[]}`, "input", "input must not be empty"},
		{`{"input":5}`, "input", "input must be a string"},
		{`{"input":["a",["b","c"]]}`, "input[1]", "input[1] must be a string"},
		{`{"input":[[1,99999]]}`, "input[0]", "outside the vocabulary"},
		{`{"input":[1.5]}`, "input[0]", "input[0] must be a string"},
		{`{"input":[-1]}`, "input[0]", "-1 is not a token id"},
		{`{"input":[{"prompt_string":"a","multimodal_data":["x"]}]}`, "input[0].multimodal_data", "input[0].multimodal_data"},
		{`{"input":"a","encoding_format":"int8"}`, "encoding_format", "Can be either float or base64"},
		{`{"input":"a","embd_normalize":"2"}`, "embd_normalize", "field embd_normalize"},
		{`[1,2]`, "", "request body must be a JSON object"},
		{`{"input":"` + strings.Repeat("a", 40000) + `"}`, "input[0]", "input[0] has 40000 tokens"},
	} {
		rec := post(h, "/v1/embeddings", c.body)
		e := errorOf(t, rec.Body.Bytes())
		param, _ := e["param"].(string)
		msg, _ := e["message"].(string)
		if rec.Code != 400 || param != c.param || !strings.Contains(msg, c.msg) {
			t.Errorf("%.60s: %d %s, want param %q and %q", c.body, rec.Code, rec.Body, c.param, c.msg)
		}
	}
	for i, v := range s.Slots() {
		if v.Processing || v.Transferring {
			t.Errorf("slot %d busy after the bad requests: %+v", i, v)
		}
	}
}
