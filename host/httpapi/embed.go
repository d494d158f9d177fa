package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"slices"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/httpapi/tokenin"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's /embedding, /embeddings and /v1/embeddings
// (handle_embeddings_impl): the inputs tokenized as llama-server tokenizes
// them (add_special and parse_special on), evaluated together by the
// backend's Embed apart from every slot, and answered in llama-server's
// native shape or OpenAI's. No slot is taken: the backend evaluates
// embeddings in a context of its own (plugins/cuda-llama/embed.go).

func (a *api) nativeEmbeddings(w http.ResponseWriter, r *http.Request) { a.embeddings(w, r, false) }
func (a *api) openAIEmbeddings(w http.ResponseWriter, r *http.Request) { a.embeddings(w, r, true) }

// notSupported is llama-server's 501 for a route its command line did not
// enable.
func notSupported(msg string) *apiError {
	return &apiError{Status: http.StatusNotImplemented, Type: "not_supported_error", Code: http.StatusNotImplemented, Msg: msg}
}

// embeddingsBody is the body's fields; raw where llama-server reads
// several shapes or tells absent from null.
type embeddingsBody struct {
	Input          json.RawMessage `json:"input"`
	Content        json.RawMessage `json:"content"`
	EncodingFormat json.RawMessage `json:"encoding_format"`
	EmbdNormalize  *int            `json:"embd_normalize"`
	Model          json.RawMessage `json:"model"`
}

// embeddingsRequest is a validated body.
type embeddingsRequest struct {
	field     string // "input" or "content", what the prompts came in
	prompts   any
	oai       bool // OpenAI's reply: /v1/embeddings with input
	base64    bool
	normalize *int
	model     string // the reply's: the request's, else the resident model's
}

func (a *api) embeddings(w http.ResponseWriter, r *http.Request, oai bool) {
	ctx := r.Context()
	raw, b, info, e := a.bodyAndBackend(w, r)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	if !slices.Contains(info.Capabilities, iface.CapEmbed) {
		run.WriteError(w, notSupported("This server does not support embeddings. Start it with `--embeddings`"))
		return
	}
	if oai && info.Pooling == iface.PoolingNone {
		run.WriteError(w, badRequest("Pooling type 'none' is not OAI compatible. Please use a different pooling type"))
		return
	}
	req, err := parseEmbeddings(raw, oai, info)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "reading the request", err))
		return
	}
	tt := textTokens{ctx: ctx, b: b}
	inputs, err := tokenin.InputPrompts(tt, req.prompts, req.field, true, true)
	if err != nil {
		run.WriteError(w, a.fieldErrorOf(ctx, "tokenizing the input", err, req.field))
		return
	}
	for _, in := range inputs {
		if len(in) == 0 { // a model that adds no BOS gives an empty text no tokens
			e := badRequest("Input content cannot be empty")
			e.Param = req.field
			run.WriteError(w, e)
			return
		}
	}
	embs, err := b.Embed(ctx, iface.EmbedRequest{Inputs: inputs, Normalize: req.normalize})
	if err != nil {
		if ctx.Err() == nil {
			run.WriteError(w, a.fieldErrorOf(ctx, "computing the embeddings", err, req.field))
		}
		return
	}
	n := 0
	for _, e := range embs {
		n += e.NTokens
	}
	tracing.Logger(ctx, a.log).Debug("embeddings", "inputs", len(embs), "tokens", n, "pooling", info.Pooling)
	if !req.oai {
		run.WriteJSON(w, http.StatusOK, nativeEmbeddings(embs))
		return
	}
	run.WriteJSON(w, http.StatusOK, openAIEmbeddingsReply(embs, req))
}

// bodyAndBackend reads a request's body and returns it with the backend
// that serves the model the body names: in router mode the model is loaded
// first, as for a completion.
func (a *api) bodyAndBackend(w http.ResponseWriter, r *http.Request) ([]byte, iface.Backend, iface.BackendInfo, *apiError) {
	ctx := r.Context()
	raw, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		return nil, nil, iface.BackendInfo{}, a.apiErrorOf(ctx, "reading the request", err)
	}
	var m struct {
		Model json.RawMessage `json:"model"`
	}
	_ = json.Unmarshal(raw, &m)
	var name string
	_ = json.Unmarshal(m.Model, &name)
	b, info, _, e := a.modelBackend(ctx, w, name)
	return raw, b, info, e
}

// modelBackend is the backend that serves the model a request names (""
// the resident one): an unknown one refused, in router mode another loaded
// first (switched; the reply's header says so), the request's trace told
// which.
func (a *api) modelBackend(ctx context.Context, w http.ResponseWriter, name string) (b iface.Backend, info iface.BackendInfo, switched bool, e *apiError) {
	if err := a.checkModel(name); err != nil {
		return nil, info, false, err
	}
	switched, err := a.s.SwitchModel(ctx, name)
	if err != nil {
		return nil, info, false, a.apiErrorOf(ctx, "switching models", err)
	}
	if switched {
		w.Header().Set("X-Hydra-Model-Switched", "true")
	}
	b, info = a.s.Backend() // after a switch, the new model's
	tracing.SetModel(ctx, info.Model.Alias)
	return b, info, switched, nil
}

// fieldErrorOf is apiErrorOf with field as the param of a 400 that names
// none (a backend's refusal of an input).
func (a *api) fieldErrorOf(ctx context.Context, step string, err error, field string) *apiError {
	e := a.apiErrorOf(ctx, step, err)
	if e.Status == http.StatusBadRequest && e.Param == nil {
		e.Param = field
	}
	return e
}

// parseEmbeddings reads the body as llama-server does: input (or content,
// which makes the reply llama-server's own even on /v1/embeddings),
// encoding_format float or base64, embd_normalize.
func parseEmbeddings(raw []byte, oai bool, info iface.BackendInfo) (embeddingsRequest, error) {
	var body embeddingsBody
	if err := run.DecodeJSON(raw, &body); err != nil {
		return embeddingsRequest{}, err
	}
	req := embeddingsRequest{oai: oai, normalize: body.EmbdNormalize, model: info.Model.Alias}
	var err error
	switch {
	case len(body.Input) > 0:
		req.field = "input"
		req.prompts, err = tokenin.JSONValue(body.Input)
	case len(body.Content) > 0:
		req.field, req.oai = "content", false // not OpenAI's field: llama-server answers in its own shape
		req.prompts, err = tokenin.JSONValue(body.Content)
	default:
		return req, badRequest(`"input" or "content" must be provided`)
	}
	if err != nil {
		return req, badRequest("%s is not valid JSON", req.field)
	}
	if len(body.EncodingFormat) > 0 {
		var f string
		if json.Unmarshal(body.EncodingFormat, &f) != nil || (f != "float" && f != "base64") {
			e := badRequest("The format to return the embeddings in. Can be either float or base64")
			e.Param = "encoding_format"
			return req, e
		}
		req.base64 = f == "base64"
	}
	var name string
	if json.Unmarshal(body.Model, &name) == nil && name != "" { // llama-server echoes a model named
		req.model = name
	}
	return req, nil
}

// nativeEmbedding is one input's in llama-server's own reply: its vectors
// (one when pooled, one a token with pooling none). The replies' fields are
// in llama-server's order.
type nativeEmbedding struct {
	Index     int         `json:"index"`
	Embedding [][]float32 `json:"embedding"`
}

func nativeEmbeddings(embs []iface.Embedding) []nativeEmbedding {
	out := make([]nativeEmbedding, len(embs))
	for i, e := range embs {
		out[i] = nativeEmbedding{Embedding: e.Vectors, Index: i}
	}
	return out
}

// openAIEmbedding is one input's in OpenAI's reply: the pooled vector, as
// numbers or as base64 of its little-endian float32s.
type openAIEmbedding struct {
	Embedding      any    `json:"embedding"`
	Index          int    `json:"index"`
	Object         string `json:"object"`
	EncodingFormat string `json:"encoding_format,omitempty"`
}

type embeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// The fields in llama-server's order.
type openAIEmbeddingsBody struct {
	Model  string            `json:"model"`
	Object string            `json:"object"`
	Usage  embeddingsUsage   `json:"usage"`
	Data   []openAIEmbedding `json:"data"`
}

// openAIEmbeddingsReply is format_embeddings_response_oaicompat.
func openAIEmbeddingsReply(embs []iface.Embedding, req embeddingsRequest) openAIEmbeddingsBody {
	out := openAIEmbeddingsBody{Data: make([]openAIEmbedding, len(embs)), Model: req.model, Object: "list"}
	for i, e := range embs {
		var v []float32
		if len(e.Vectors) > 0 {
			v = e.Vectors[0]
		}
		d := openAIEmbedding{Embedding: nonNilFloats(v), Index: i, Object: "embedding"}
		if req.base64 {
			d.Embedding, d.EncodingFormat = float32Base64(v), "base64"
		}
		out.Data[i] = d
		out.Usage.PromptTokens += e.NTokens
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	return out
}

func nonNilFloats(v []float32) []float32 {
	if v == nil {
		return []float32{}
	}
	return v
}

// float32Base64 is v's little-endian float32 bytes in standard base64, as
// OpenAI's encoding_format base64 and llama-server write them.
func float32Base64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
