// Package httpapi is the engine's HTTP side (protocol §8): /health,
// /version, the models list, /slots, the OpenAI-compatible chat and text
// completions with server-sent events, and Prometheus /metrics; plus Startup,
// the handler that answers while the engine is still loading.
//
// It serves a host.Server through the small surface host exports for front
// ends: the backend, the tunables' defaults, Stats, and slots taken from the
// same table as the Hydra RPC ops (a busy slot is BUSY over RPC and 503
// here).
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// api is the HTTP side of one server.
type api struct {
	s       *host.Server
	log     hclog.Logger
	metrics *metrics

	queue          *slotQueue // completions waiting for a slot
	similarity     float64    // Options.SlotPromptSimilarity
	splitReasoning bool       // Options.SplitReasoning
	budget         *int32     // Options.ReasoningBudget
	budgetMessage  string     // Options.ReasoningBudgetMessage
	spmInfill      bool       // Options.SPMInfill

	mu    sync.Mutex
	tasks map[int]slotTask // the last HTTP completion of each slot, for /slots
	next  int64            // id of the next task
}

// slotTask describes the last HTTP completion run on a slot.
type slotTask struct {
	id        int64
	nPrompt   int
	nDecoded  int
	nRemain   int // tokens still allowed when it ended; -1 unbounded
	processed time.Time
	tokens    []int32    // the sequence it left in the slot
	params    slotParams // its sampling parameters
}

// Options configure the HTTP side.
type Options struct {
	// APIKeys, when there are any, are required as "Authorization: Bearer
	// KEY" on every path but /health (and /metrics with PublicMetrics).
	APIKeys []string
	// PublicMetrics serves /metrics without a key.
	PublicMetrics bool
	// SlotPromptSimilarity is how much of a slot's prompt a completion's
	// prompt must share to be given that slot, 0 to 1 (llama-server's
	// --slot-prompt-similarity; 0: off).
	SlotPromptSimilarity float64
	// SplitReasoning streams a chat reply's <think>…</think> block as
	// reasoning_content, apart from content, as llama-server's
	// --reasoning-format deepseek.
	SplitReasoning bool
	// ReasoningBudget is the reasoning budget of a chat reply whose request
	// gives none, in tokens (llama-server's --reasoning-budget; nil: none,
	// as its -1), and ReasoningBudgetMessage what is forced before the end
	// tag when a budget runs out (--reasoning-budget-message).
	ReasoningBudget        *int32
	ReasoningBudgetMessage string
	// SPMInfill puts an infill prompt's suffix before its prefix
	// (llama-server's --spm-infill), for models trained that way.
	SPMInfill bool
}

// The markers of a reasoning block.
const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// Handler serves s's HTTP side, behind opts.APIKeys when there are any
// (auth.go). Call it once per server: it builds the Prometheus registry
// behind /metrics and installs it as s's Stats observer.
func Handler(s *host.Server, opts Options) http.Handler {
	_, info := s.Backend()
	a := &api{s: s, log: s.Config().Logger.Named("http"), tasks: map[int]slotTask{},
		queue: newSlotQueue(s, info.NSlots), similarity: opts.SlotPromptSimilarity, splitReasoning: opts.SplitReasoning,
		budget: opts.ReasoningBudget, budgetMessage: opts.ReasoningBudgetMessage, spmInfill: opts.SPMInfill}
	a.metrics = newMetrics(s)
	a.metrics.queueLen = a.queue.waiting
	s.Stats().SetObserver(a.metrics)

	mux := http.NewServeMux()
	handle := func(pattern string, h http.HandlerFunc) {
		c := a.metrics.httpRequests.MustCurryWith(prometheus.Labels{"handler": pattern})
		mux.Handle(pattern, promhttp.InstrumentHandlerCounter(c, h))
	}
	handle("GET /health", a.health)
	handle("GET /version", a.version)
	handle("GET /slots", a.listSlots)
	handle("GET /slots/{id}/state/meta", a.stateMeta)
	handle("POST /slots/{id}", a.slotAction)
	handle("GET /v1/models", a.models)
	handle("GET /models", a.models)
	handle("POST /models/load", a.loadModel)
	handle("POST /models/unload", a.unloadModel)
	handle("POST /v1/chat/completions", a.chatCompletions)
	handle("POST /chat/completions", a.chatCompletions)
	handle("POST /v1/chat/completions/input_tokens", a.chatInputTokens)
	handle("POST /chat/completions/input_tokens", a.chatInputTokens)
	handle("POST /v1/responses", a.responses)
	handle("POST /responses", a.responses)
	handle("POST /v1/responses/input_tokens", a.responsesInputTokens)
	handle("POST /responses/input_tokens", a.responsesInputTokens)
	handle("POST /v1/messages", a.messages)
	handle("POST /v1/messages/count_tokens", a.countMessageTokens)
	handle("POST /completion", a.nativeCompletion)
	handle("POST /v1/completions", a.textCompletions)
	handle("POST /completions", a.textCompletions)
	handle("POST /tokenize", a.tokenize)
	handle("POST /detokenize", a.detokenize)
	handle("POST /apply-template", a.applyTemplate)
	handle("GET /props", a.props)
	handle("POST /props", a.setProps)
	handle("POST /embedding", a.nativeEmbeddings)
	handle("POST /embeddings", a.nativeEmbeddings)
	handle("POST /v1/embeddings", a.openAIEmbeddings)
	for _, p := range []string{"/rerank", "/reranking", "/v1/rerank", "/v1/reranking"} {
		handle("POST "+p, a.rerank)
	}
	handle("POST /infill", a.infill)
	mux.Handle("GET /metrics", a.metrics.handler())
	handle("GET /", notFound) // not every method: one no route takes stays the mux's 405
	handle("POST /", notFound)
	h := requireKey(mux, opts.APIKeys, opts.PublicMetrics, a.log)
	if tp := s.Config().TracerProvider; tp != nil {
		h = traceRequests(h, tp.Tracer(tracing.Scope))
	}
	return h
}

// notFound answers a path no route serves (GET / included: no web UI
// here) in llama-server's JSON shape, not the mux's plain text, so that an
// OpenAI client raises a NotFoundError it can read.
func notFound(w http.ResponseWriter, r *http.Request) {
	run.WriteJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"code": http.StatusNotFound,
		"message": fmt.Sprintf("%s %s: no such route", r.Method, r.URL.Path), "type": "not_found_error"}})
}

// healthBody is /health's reply (§8, the later form).
type healthBody struct {
	Status       string `json:"status"`
	StartupStage int    `json:"startup_stage"`
	HasModel     bool   `json:"has_model"`
	ModelName    string `json:"model_name"`
	RPCActive    bool   `json:"rpc_active"`
	Error        string `json:"error,omitempty"`
}

// health asks the backend for its Info, so a dead or restarting plugin
// turns the probe to 503 rather than hiding behind a live host. The reason
// goes to the log, not to the prober: it names the plugin's socket.
func (a *api) health(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	body := healthBody{Status: "ok", StartupStage: StageReady, HasModel: info.Model.Alias != "" || info.Model.Hash != "",
		ModelName: info.Model.Alias, RPCActive: a.s.RPCActive()}
	if _, loaded := a.s.ResidentModel(); !loaded {
		// No model by request (POST /models/unload): the engine is well, as
		// llama-server's router is with none loaded, and loads one when asked.
		body.HasModel, body.ModelName = false, ""
		run.WriteJSON(w, http.StatusOK, body)
		return
	}
	if err := a.s.BackendAnswers(r.Context()); err != nil {
		a.log.Debug("health: the backend does not answer", "error", err)
		body.Status, body.Error, body.HasModel = "unavailable", "the backend is not answering", false
		w.Header().Set("Retry-After", "1")
		run.WriteJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	run.WriteJSON(w, http.StatusOK, body)
}

func (a *api) version(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	run.WriteJSON(w, http.StatusOK, struct {
		Version        string `json:"version"`
		Engine         string `json:"engine"`
		Backend        string `json:"backend"`
		BackendVersion string `json:"backend_version"`
	}{a.s.Config().Version, "hydra-engine", info.Name, info.Version})
}

func (a *api) models(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	type modelMeta struct {
		iface.ModelIdentity
		Backend string `json:"backend"`
		NCtx    int    `json:"n_ctx"`
		NVocab  int    `json:"n_vocab"`
	}
	type status struct {
		Value string `json:"value"` // llama-server's router: "loaded" or "unloaded"
	}
	type model struct {
		ID      string    `json:"id"`
		Object  string    `json:"object"`
		Created int64     `json:"created"`
		OwnedBy string    `json:"owned_by"`
		Status  status    `json:"status"`
		Meta    modelMeta `json:"meta"`
	}
	var list []model
	aliases, loaded := a.s.ModelAliases()
	if loaded { // the resident model first
		list = append(list, model{ID: info.Model.Alias, Object: "model", OwnedBy: "hydra-engine", Status: status{"loaded"},
			Meta: modelMeta{ModelIdentity: info.Model, Backend: info.Name, NCtx: info.NCtx, NVocab: info.NVocab}})
		aliases = aliases[1:]
	}
	for _, alias := range aliases { // the presets a request may switch to
		list = append(list, model{ID: alias, Object: "model", OwnedBy: "hydra-engine", Status: status{"unloaded"},
			Meta: modelMeta{ModelIdentity: iface.ModelIdentity{Alias: alias}, Backend: info.Name}})
	}
	run.WriteJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", list})
}

// writeError writes the flat {"error":msg} of the llama-engine endpoints
// (/slots…); the OpenAI ones use writeAPIError.
func writeError(w http.ResponseWriter, code int, msg string) {
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	run.WriteJSON(w, code, map[string]string{"error": msg})
}

// statusOf maps a slot or backend error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, iface.ErrNoSlot), errors.Is(err, iface.ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, iface.ErrBusy), errors.Is(err, ErrShuttingDown):
		return http.StatusServiceUnavailable
	case errors.Is(err, iface.ErrNotImplemented):
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// clientMessage is what a client is told of a failed step: the error's own
// text when it is about the request (a bad slot, a busy one, an unsupported
// feature, a request the backend refused), else only which step failed. An
// internal failure's text can name the plugin's socket or files; it goes to
// the log instead.
func (a *api) clientMessage(ctx context.Context, step string, err error) string {
	if statusOf(err) != http.StatusInternalServerError {
		return err.Error()
	}
	tracing.Logger(ctx, a.log).Error("HTTP request failed", "step", step, "error", err)
	return step + " failed: internal error in the engine or its backend (the engine log has the details)"
}
