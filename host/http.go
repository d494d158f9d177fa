package host

import (
	"encoding/json"
	"net/http"
)

// HTTPHandler serves the engine's HTTP side: /health and /version.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		_, info := s.Backend()
		writeHTTPJSON(w, http.StatusOK, map[string]any{"status": "ok", "has_model": info.Model.Alias != "",
			"model_name": info.Model.Alias, "rpc_active": true})
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeHTTPJSON(w, http.StatusOK, map[string]any{"version": s.cfg.Version, "engine": "hydra-engine"})
	})
	return mux
}

func writeHTTPJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
