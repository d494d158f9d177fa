package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's router endpoints that load and unload a model by name
// (tools/server/server-models.cpp): POST /models/load and /models/unload
// with {"model": NAME}, answered {"success": true} or an error in its
// shape, {"error": {"code": STATUS, "message": …, "type": …}}. One model is
// resident here at a time, so loading one replaces the resident one, and
// unloading leaves none until a load or a request naming one.

// maxModelBody bounds a load or unload request's body: it holds one name.
const maxModelBody = 64 << 10

// modelRequest is the body of POST /models/load and /models/unload.
type modelRequest struct {
	Model string `json:"model"`
}

func (a *api) loadModel(w http.ResponseWriter, r *http.Request) {
	a.modelOp(w, r, "loading the model", http.StatusNotFound, a.s.LoadModel)
}

func (a *api) unloadModel(w http.ResponseWriter, r *http.Request) {
	a.modelOp(w, r, "unloading the model", http.StatusBadRequest, a.s.UnloadModel)
}

// modelOp reads the model's name and runs op on it. notFound is the status
// of a name the engine does not know: 404 for a load, 400 for an unload,
// as llama-server answers them.
func (a *api) modelOp(w http.ResponseWriter, r *http.Request, step string, notFound int, op func(context.Context, string) error) {
	body, err := readBody(w, r, maxModelBody)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), step, err))
		return
	}
	var req modelRequest
	if err := run.DecodeJSON(body, &req); err != nil {
		run.WriteError(w, modelError(http.StatusBadRequest, err.Error()))
		return
	}
	if req.Model == "" {
		run.WriteError(w, modelError(http.StatusBadRequest, "model name is missing from the request"))
		return
	}
	// A load takes as long as the model does and is not undone when the
	// client stops waiting (the previous model would be loaded back); only
	// the shutdown's cut ends it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	stop := context.AfterFunc(r.Context(), func() {
		if errors.Is(context.Cause(r.Context()), ErrShuttingDown) {
			cancel()
		}
	})
	defer stop()
	switch err := op(ctx, req.Model); {
	case err == nil:
		a.log.Info(step+": done", "model", req.Model)
		run.WriteJSON(w, http.StatusOK, map[string]bool{"success": true})
	case errors.Is(err, host.ErrNoRouter):
		run.WriteError(w, modelError(http.StatusNotFound, err.Error()))
	case errors.Is(err, host.ErrModelNotFound):
		run.WriteError(w, modelError(notFound, err.Error()))
	case errors.Is(err, host.ErrModelRunning), errors.Is(err, host.ErrModelNotRunning):
		run.WriteError(w, modelError(http.StatusBadRequest, err.Error()))
	case errors.Is(err, iface.ErrBusy):
		run.WriteError(w, modelError(http.StatusServiceUnavailable, err.Error()))
	default: // the load itself failed: a refused option is the operator's to read, an internal failure is in the log
		err = shutdownCut(r.Context(), err)
		run.WriteError(w, modelError(statusOf(err), a.clientMessage(r.Context(), step, err)))
	}
}

// modelError is an error of the router endpoints in llama-server's shape:
// the HTTP status as the code, and its error type.
func modelError(status int, msg string) *apiError {
	e := &apiError{Status: status, Code: status, Msg: msg, Type: "server_error"}
	switch status {
	case http.StatusBadRequest:
		e.Type = "invalid_request_error"
	case http.StatusNotFound:
		e.Type = "not_found_error"
	case http.StatusServiceUnavailable:
		e.Type = "unavailable_error"
	}
	return e
}
