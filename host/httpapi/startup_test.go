package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestStartup(t *testing.T) {
	g := NewStartup()
	g.SetStage(StageLoading)
	for _, path := range []string{"/health", "/v1/models"} {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s while starting: %d %v", path, rec.Code, rec.Header())
		}
		if path == "/health" && !strings.Contains(rec.Body.String(), `"status":"starting","startup_stage":2`) {
			t.Errorf("health while starting: %s", rec.Body)
		}
	}
	g.Ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
	if rec.Code != http.StatusTeapot || g.Stage() != StageReady {
		t.Errorf("after Ready: %d, stage %d", rec.Code, g.Stage())
	}
}
