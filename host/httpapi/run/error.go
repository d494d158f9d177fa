package run

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Error is a request's failure as OpenAI words it,
// {"error":{"message","type","code","param"}}, with the HTTP status it is
// answered with; the types are llama-server's, which the coordinator was
// written against. Other dialects word the same failure their own way.
type Error struct {
	Status int    `json:"-"`
	Msg    string `json:"message"`
	Type   string `json:"type"`
	Code   any    `json:"code"`
	Param  any    `json:"param"`
}

func (e *Error) Error() string { return e.Msg }

// BadRequest is a 400 whose param is the field its message starts with.
func BadRequest(format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	return &Error{Status: http.StatusBadRequest, Msg: msg, Type: "invalid_request_error", Param: ParamOf(msg)}
}

// bodyFields are the fields a request's messages name first; the error's
// param is the field its message starts with (OpenAI's param: the field at
// fault, as the path into it the message gives: "tools[0].type"), none for
// a fault of the body as a whole.
var bodyFields = []string{"n_predict", "max_completion_tokens", "max_tokens", "n_keep", "n_probs", "top_logprobs", "logprobs",
	"logit_bias", "id_slot", "prompt", "stop", "n", "temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
	"repeat_last_n", "presence_penalty", "frequency_penalty", "messages", "grammar", "json_schema", "tool_choice",
	"chat_template_kwargs", "response_format", "reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget_message",
	"reasoning_effort", "tools", "parallel_tool_calls", "input", "instructions", "max_output_tokens", "reasoning", "text",
	"speculative.n_max", "speculative.n_min", "speculative.p_min"}

// ParamOf is the field an error message names first, nil for none.
func ParamOf(msg string) any {
	msg = strings.TrimPrefix(msg, iface.ErrBadRequest.Error()+": ") // a backend's refusal, as errors.Is reads it
	msg = strings.TrimPrefix(msg, "field ")                         // a value of the wrong JSON type (DecodeJSON)
	for _, f := range bodyFields {
		rest, ok := strings.CutPrefix(msg, f)
		switch {
		case !ok:
		case rest == "" || rest[0] == ' ' || rest[0] == ':':
			return f
		case rest[0] == '[' || rest[0] == '.':
			if i := strings.IndexAny(msg, " :"); i > 0 {
				return msg[:i]
			}
			return msg
		}
	}
	return nil
}

// WriteJSON writes v as the whole JSON reply.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding the reply failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// WriteError writes e as the whole reply in OpenAI's shape.
func WriteError(w http.ResponseWriter, e *Error) {
	RetryAfter(w, e)
	WriteJSON(w, e.Status, map[string]*Error{"error": e})
}

// RetryAfter asks the client of a 503 to come back in a second: the slot,
// the KV cache or the payload budget it waits for frees as requests end.
func RetryAfter(w http.ResponseWriter, e *Error) {
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
}

// CheckFields refuses a JSON object's keys that are not in known, naming
// the first (sorted) at path ("": the request body itself).
func CheckFields(raw json.RawMessage, path string, known []string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		if path == "" {
			return BadRequest("request body must be a JSON object")
		}
		return BadRequest("%s must be a JSON object", strings.TrimPrefix(path, "."))
	}
	var extra []string
	for k := range obj {
		if !slices.Contains(known, k) {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	sort.Strings(extra)
	field := strings.TrimPrefix(path+"."+extra[0], ".")
	e := BadRequest("%s is not supported by this engine", field)
	e.Param = field
	return e
}
