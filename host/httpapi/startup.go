package httpapi

import (
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"net/http"
	"sync/atomic"
)

// Startup stages reported by /health (§8: startup_stage 0..4). The HTTP
// listener comes up first, so a supervisor sees the engine progress through
// a slow model load instead of a refused connection.
const (
	StageStarting  = 0 // configuration read
	StageListening = 1 // listeners bound
	StageLoading   = 2 // backend plugin starting, model loading
	StageLoaded    = 3 // model loaded, servers starting
	StageReady     = 4 // serving
)

// Startup is the HTTP handler of an engine that is not serving yet: every
// path answers 503, /health with {"status":"starting","startup_stage":N,…},
// until Ready installs the engine's own handler.
type Startup struct {
	stage atomic.Int32
	ready atomic.Pointer[http.Handler]
}

// NewStartup returns a handler at StageStarting.
func NewStartup() *Startup { return &Startup{} }

// SetStage records the stage reached.
func (g *Startup) SetStage(stage int) { g.stage.Store(int32(stage)) }

// Stage returns the stage reached.
func (g *Startup) Stage() int { return int(g.stage.Load()) }

// Ready hands every later request to h.
func (g *Startup) Ready(h http.Handler) {
	g.ready.Store(&h)
	g.stage.Store(StageReady)
}

func (g *Startup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := g.ready.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	w.Header().Set("Retry-After", "1")
	if r.URL.Path == "/health" {
		run.WriteJSON(w, http.StatusServiceUnavailable, healthBody{Status: "starting", StartupStage: g.Stage()})
		return
	}
	run.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "engine is starting"})
}
