package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"github.com/hydra-engine/hydra-engine/host/httpapi/anthropic"
	"net/http"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// API keys as llama-server's --api-key: with keys configured every path
// needs "Authorization: Bearer KEY" but /health, which probes and load
// balancers call without credentials (it says only whether the engine
// serves), and /metrics with Options.PublicMetrics. Unlike llama-server
// the models list needs the key too: it names the model file.

// requireKey wraps next so that requests without one of keys are answered
// 401; with no keys it is next.
func requireKey(next http.Handler, keys []string, publicMetrics bool, log hclog.Logger) http.Handler {
	if len(keys) == 0 {
		return next
	}
	// Keys are compared as SHA-256 digests: fixed-size, so neither the
	// comparison's time nor a length check tells a client anything of a
	// key's length or content.
	digests := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		digests[i] = sha256.Sum256([]byte(k))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || (publicMetrics && r.URL.Path == "/metrics") {
			next.ServeHTTP(w, r)
			return
		}
		if token, ok := bearerToken(r); ok && keyMatches(digests, token) {
			next.ServeHTTP(w, r)
			return
		}
		log.Debug("request without a valid API key refused", "remote", r.RemoteAddr, "path", r.URL.Path)
		writeUnauthorized(w, r)
	})
}

// bearerToken is the credential of an "Authorization: Bearer TOKEN" header
// (the scheme is case-insensitive, RFC 9110 §11.1), or without one of
// Anthropic's "X-Api-Key: TOKEN", as llama-server takes it; ok is false
// without either.
func bearerToken(r *http.Request) (token string, ok bool) {
	if r.Header.Get("Authorization") == "" {
		token = strings.TrimSpace(r.Header.Get("X-Api-Key"))
		return token, token != ""
	}
	scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// keyMatches compares the token with every key, all of them whatever
// matched, so the time taken does not say which key (or how much of one) it
// resembles.
func keyMatches(digests [][sha256.Size]byte, token string) bool {
	d := sha256.Sum256([]byte(token))
	match := 0
	for i := range digests {
		match |= subtle.ConstantTimeCompare(digests[i][:], d[:])
	}
	return match == 1
}

// writeUnauthorized answers a missing or wrong key alike, with llama-server's
// body (Anthropic's on its Messages routes) and the challenge RFC 6750 asks
// of a 401.
func writeUnauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="hydra-engine"`)
	if r.URL.Path == "/v1/messages" || strings.HasPrefix(r.URL.Path, "/v1/messages/") {
		anthropic.WriteError(w, http.StatusUnauthorized, "Invalid API Key")
		return
	}
	run.WriteError(w, &apiError{Status: http.StatusUnauthorized, Msg: "Invalid API Key", Type: "authentication_error", Code: http.StatusUnauthorized})
}
