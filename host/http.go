package host

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hydra-engine/hydra-engine/iface"
)

// httpAPI is the engine's HTTP side (protocol §8): health, slots, the
// OpenAI-compatible completions and /metrics. Completions take their slot
// from the same table as the Hydra RPC ops, so the two never run on one slot
// at once.
type httpAPI struct {
	s       *Server
	metrics *metrics

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
}

// HTTPHandler serves the engine's HTTP side. Call it once per server: it
// builds the Prometheus registry behind /metrics and hooks it to Stats.
func (s *Server) HTTPHandler() http.Handler {
	a := &httpAPI{s: s, tasks: map[int]slotTask{}}
	a.metrics = newMetrics(s)
	s.stats.SetObserver(a.metrics)

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
	handle("POST /v1/chat/completions", a.chatCompletions)
	handle("POST /chat/completions", a.chatCompletions)
	handle("POST /v1/completions", a.textCompletions)
	handle("POST /completions", a.textCompletions)
	mux.Handle("GET /metrics", a.metrics.handler())
	return mux
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
// turns the probe to 503 rather than hiding behind a live host.
func (a *httpAPI) health(w http.ResponseWriter, r *http.Request) {
	b, info := a.s.Backend()
	body := healthBody{Status: "ok", StartupStage: StageReady, HasModel: info.Model.Alias != "" || info.Model.Hash != "",
		ModelName: info.Model.Alias, RPCActive: a.s.rpcActive()}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if _, err := b.Info(ctx); err != nil {
		body.Status, body.Error, body.HasModel = "unavailable", err.Error(), false
		w.Header().Set("Retry-After", "1")
		writeHTTPJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeHTTPJSON(w, http.StatusOK, body)
}

// rpcActive reports whether the server accepts Hydra RPC connections.
func (s *Server) rpcActive() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return !s.isStopping() && len(s.listeners) > 0
}

func (a *httpAPI) version(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	writeHTTPJSON(w, http.StatusOK, struct {
		Version        string `json:"version"`
		Engine         string `json:"engine"`
		Backend        string `json:"backend"`
		BackendVersion string `json:"backend_version"`
	}{a.s.cfg.Version, "hydra-engine", info.Name, info.Version})
}

func (a *httpAPI) models(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	type modelMeta struct {
		iface.ModelIdentity
		Backend string `json:"backend"`
		NCtx    int    `json:"n_ctx"`
		NVocab  int    `json:"n_vocab"`
	}
	type model struct {
		ID      string    `json:"id"`
		Object  string    `json:"object"`
		Created int64     `json:"created"`
		OwnedBy string    `json:"owned_by"`
		Meta    modelMeta `json:"meta"`
	}
	writeHTTPJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: info.Model.Alias, Object: "model", OwnedBy: "hydra-engine",
		Meta: modelMeta{ModelIdentity: info.Model, Backend: info.Name, NCtx: info.NCtx, NVocab: info.NVocab}}}})
}

// writeHTTPJSON writes v as the whole JSON reply.
func writeHTTPJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding the reply failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// writeHTTPError writes the flat {"error":msg} of the llama-engine
// endpoints (/slots…); the OpenAI ones use writeAPIError.
func writeHTTPError(w http.ResponseWriter, code int, msg string) {
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeHTTPJSON(w, code, map[string]string{"error": msg})
}

// httpStatusOf maps a slot or backend error to an HTTP status.
func httpStatusOf(err error) int {
	switch {
	case errors.Is(err, iface.ErrNoSlot), errors.Is(err, iface.ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, iface.ErrBusy):
		return http.StatusServiceUnavailable
	case errors.Is(err, iface.ErrNotImplemented):
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}
