package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's /rerank, /reranking, /v1/rerank and /v1/reranking
// (post_rerank, format_prompt_rerank, format_response_rerank): each
// document is put with the query into one prompt, as the model's rerank
// template or its separators say, the prompts are evaluated together by
// Embed with rank pooling, and a document's relevance is its first score.
// The body is Jina's (query, documents, top_n) or, with texts instead of
// documents, Text Embeddings Inference's, whose reply is the bare list and
// may carry each document (return_text).

type rerankBody struct {
	Query      json.RawMessage `json:"query"`
	Documents  json.RawMessage `json:"documents"`
	Texts      json.RawMessage `json:"texts"`
	TopN       *int            `json:"top_n"`
	ReturnText *bool           `json:"return_text"`
	Model      json.RawMessage `json:"model"`
}

// rankResult is one document's place in the reply; Score is
// relevance_score in Jina's shape, score in TEI's.
type rankResult struct {
	Index          int      `json:"index"`
	RelevanceScore *float64 `json:"relevance_score,omitempty"`
	Score          *float64 `json:"score,omitempty"`
	Text           *string  `json:"text,omitempty"`
}

// rerankReply is Jina's, its fields in llama-server's order.
type rerankReply struct {
	Model   string          `json:"model"`
	Object  string          `json:"object"`
	Usage   embeddingsUsage `json:"usage"`
	Results []rankResult    `json:"results"`
}

// noScore is llama-server's score for a document whose prompt gave none.
const noScore = -1e6

func (a *api) rerank(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	raw, b, info, e := a.bodyAndBackend(w, r)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	if !slices.Contains(info.Capabilities, iface.CapRerank) || info.Special == nil {
		run.WriteError(w, notSupported("This server does not support reranking. Start it with `--reranking`"))
		return
	}
	var body rerankBody
	if err := run.DecodeJSON(raw, &body); err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "reading the request", err))
		return
	}
	tei := body.Texts != nil // the key present, as llama-server's body.contains("texts")
	query, docs, topN, e := parseRerank(body)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	prompts, err := rerankPrompts(textTokens{ctx: ctx, b: b}, info, query, docs)
	if err != nil {
		run.WriteError(w, a.fieldErrorOf(ctx, "tokenizing the documents", err, "documents"))
		return
	}
	none := -1 // a score is the classifier's, never normalised
	embs, err := b.Embed(ctx, iface.EmbedRequest{Inputs: prompts, Normalize: &none})
	if err != nil {
		if ctx.Err() == nil {
			run.WriteError(w, a.fieldErrorOf(ctx, "ranking the documents", err, "documents"))
		}
		return
	}
	results, nTokens := rankResults(embs, docs, tei, tei && body.ReturnText != nil && *body.ReturnText, topN)
	tracing.Logger(ctx, a.log).Debug("rerank", "documents", len(docs), "tokens", nTokens)
	if tei {
		run.WriteJSON(w, http.StatusOK, results)
		return
	}
	model := info.Model.Alias
	var name string
	if json.Unmarshal(body.Model, &name) == nil && name != "" {
		model = name
	}
	run.WriteJSON(w, http.StatusOK, rerankReply{Model: model, Object: "list", Results: results,
		Usage: embeddingsUsage{PromptTokens: nTokens, TotalTokens: nTokens}})
}

// parseRerank reads the query, the documents (documents, else texts) and
// top_n (default: every document).
func parseRerank(body rerankBody) (string, []string, int, *apiError) {
	withParam := func(e *apiError, p string) *apiError { e.Param = p; return e }
	if body.Query == nil {
		return "", nil, 0, withParam(badRequest(`"query" must be provided`), "query")
	}
	var query string
	if json.Unmarshal(body.Query, &query) != nil || string(body.Query) == "null" {
		return "", nil, 0, withParam(badRequest(`"query" must be a string`), "query")
	}
	field, list := "documents", body.Documents
	if isAbsent(list) {
		field, list = "texts", body.Texts
	}
	var docs []string
	if !isAbsent(list) && json.Unmarshal(list, &docs) != nil {
		docs = nil
	}
	if len(docs) == 0 {
		return "", nil, 0, withParam(badRequest(`"documents" must be a non-empty string array`), field)
	}
	topN := len(docs)
	if body.TopN != nil {
		if *body.TopN < 0 {
			return "", nil, 0, withParam(badRequest("top_n must be 0 or more, got %d", *body.TopN), "top_n")
		}
		topN = *body.TopN
	}
	return query, docs, topN, nil
}

func isAbsent(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// rerankPrompts is format_prompt_rerank of each document.
func rerankPrompts(tt textTokens, info iface.BackendInfo, query string, docs []string) ([][]int32, error) {
	out := make([][]int32, len(docs))
	if tmpl := info.RerankTemplate; tmpl != "" {
		for i, d := range docs {
			// Replaced in turn, as llama-server's string_replace_all: a
			// {document} inside the query is replaced too.
			p := strings.ReplaceAll(strings.ReplaceAll(tmpl, "{query}", query), "{document}", d)
			var err error
			if out[i], err = tt.Tokenize(p, false, true); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	q, err := tt.Tokenize(query, false, false)
	if err != nil {
		return nil, err
	}
	sp := info.Special
	eos := sp.EOS
	if eos == iface.NoToken { // llama-server's fallback for vocabularies without one
		eos = sp.SEP
	}
	for i, d := range docs {
		dt, err := tt.Tokenize(d, false, false)
		if err != nil {
			return nil, err
		}
		var p []int32
		if sp.AddBOS {
			p = append(p, sp.BOS)
		}
		p = append(p, q...)
		if sp.AddEOS {
			p = append(p, eos)
		}
		if sp.AddSEP {
			p = append(p, sp.SEP)
		}
		p = append(p, dt...)
		if sp.AddEOS {
			p = append(p, eos)
		}
		out[i] = p
	}
	return out, nil
}

// rankResults is format_response_rerank: the documents by their score,
// highest first (ties in document order), the first topN of them, and the
// prompts' tokens.
func rankResults(embs []iface.Embedding, docs []string, tei, returnText bool, topN int) ([]rankResult, int) {
	results := make([]rankResult, len(embs))
	n := 0
	for i, e := range embs {
		score := float64(noScore)
		if len(e.Vectors) > 0 && len(e.Vectors[0]) > 0 {
			score = float64(e.Vectors[0][0])
		}
		s := score
		results[i] = rankResult{Index: i}
		if tei {
			results[i].Score = &s
		} else {
			results[i].RelevanceScore = &s
		}
		if returnText {
			results[i].Text = &docs[i]
		}
		n += e.NTokens
	}
	slices.SortStableFunc(results, func(x, y rankResult) int {
		sx, sy := x.score(), y.score()
		switch {
		case sx > sy:
			return -1
		case sx < sy:
			return 1
		}
		return 0
	})
	return results[:min(topN, len(results))], n
}

func (r rankResult) score() float64 {
	if r.Score != nil {
		return *r.Score
	}
	return *r.RelevanceScore
}
