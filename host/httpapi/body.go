package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// A request's body, read within the engine's limits, and its failures in
// the client's words.

// apiError is a request's failure, in OpenAI's shape unless a dialect
// words it its own way.
type apiError = run.Error

func badRequest(format string, args ...any) *apiError { return run.BadRequest(format, args...) }

// apiErrorOf maps an error of the step named (a slot or backend error, or
// an apiError already) to its OpenAI form, in client words (clientMessage).
func (a *api) apiErrorOf(ctx context.Context, step string, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	e := &apiError{Status: statusOf(err), Msg: a.clientMessage(ctx, step, err)}
	switch e.Status {
	case http.StatusBadRequest:
		e.Type, e.Param = "invalid_request_error", run.ParamOf(e.Msg)
	case http.StatusServiceUnavailable:
		e.Type, e.Code = "unavailable_error", "slot_busy"
		if errors.Is(err, ErrShuttingDown) {
			e.Code = "shutting_down"
		}
	case http.StatusNotImplemented:
		e.Type = "not_supported_error"
	default:
		e.Type = "server_error"
	}
	return e
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit uint64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(min(limit, math.MaxInt64))))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Msg: fmt.Sprintf("request body exceeds the %d-byte limit", mbe.Limit)}
		}
		return nil, badRequest("reading the request body: %v", err)
	}
	return b, nil
}

// readAdmittedBody reads a request body of at most s's MaxJSONBytes (and
// payload budget) once the budget admitted it (host.AdmitPayload): its
// Content-Length, or the whole limit when the length is not announced. The
// budget is given back when the request ends. A body larger than the limit
// is refused before it is read (413); a budget that stays short answers 503.
func readAdmittedBody(w http.ResponseWriter, r *http.Request, s *host.Server) ([]byte, error) {
	limit := min(s.Config().MaxJSONBytes, s.PayloadBudgetSize())
	n := limit
	if r.ContentLength >= 0 {
		if uint64(r.ContentLength) > limit {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Msg: fmt.Sprintf("request body of %d bytes exceeds the %d-byte limit", r.ContentLength, limit)}
		}
		n = uint64(r.ContentLength)
	}
	release, err := s.AdmitPayload(r.Context(), n)
	switch {
	case errors.Is(err, host.ErrBudgetBusy):
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "unavailable_error", Code: "payload_budget", Msg: err.Error()}
	case err != nil:
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Msg: fmt.Sprintf("request body of %d bytes: %v", n, err)}
	}
	context.AfterFunc(r.Context(), release)
	if r.ContentLength < 0 {
		return readBody(w, r, n)
	}
	// Announced: read into one buffer of that size, so the body costs what
	// the budget admitted and not io.ReadAll's doublings.
	b := make([]byte, n)
	if _, err := io.ReadFull(r.Body, b); err != nil {
		return nil, badRequest("reading the request body: %v", err)
	}
	return b, nil
}
