package request

import (
	"fmt"
	"math"
	"net/http"
	"slices"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's reasoning budget for chat completions: the request's
// reasoning_budget_tokens (or thinking_budget_tokens, which Anthropic's
// thinking.budget_tokens becomes) and reasoning_budget_message over the
// engine's --reasoning-budget and --reasoning-budget-message. The backend
// bounds the reasoning in its sampler (iface.ReasoningBudget); a text
// completion has no chat format to take the thinking tags from, and, as in
// llama-server, no budget.

// ReasoningBudgetFields are the body's fields (exported: an embedded
// struct's fields name themselves in run.DecodeJSON's errors only then).
type ReasoningBudgetFields struct {
	ReasoningBudgetTokens  *int64  `json:"reasoning_budget_tokens"`
	ThinkingBudgetTokens   *int64  `json:"thinking_budget_tokens"`
	ReasoningBudgetMessage *string `json:"reasoning_budget_message"`
}

// reasoningBudgetRequest is what the fields ask: tokens -1 takes the
// engine's budget, message nil its message.
type reasoningBudgetRequest struct {
	tokens  int64
	message *string
}

// parse reads the fields: reasoning_budget_tokens first, as llama-server,
// then thinking_budget_tokens; -1 or neither is the engine's budget.
func (f ReasoningBudgetFields) parse() (reasoningBudgetRequest, error) {
	r := reasoningBudgetRequest{tokens: -1, message: f.ReasoningBudgetMessage}
	for _, v := range []struct {
		name string
		n    *int64
	}{{"reasoning_budget_tokens", f.ReasoningBudgetTokens}, {"thinking_budget_tokens", f.ThinkingBudgetTokens}} {
		if v.n == nil {
			continue
		}
		if *v.n < -1 || *v.n > math.MaxInt32 {
			return r, badRequest("%s must be -1 (the engine's budget) or a count of tokens in [0, %d], got %d", v.name, math.MaxInt32, *v.n)
		}
		r.tokens = *v.n
		break
	}
	return r, nil
}

// SetReasoningBudget gives a chat reply its budget, the request's or the
// engine's (tokens nil: unbounded): the reply is then the backend's to
// parse, as a budget needs the chat's format. A budget the reply's token
// limit reaches first bounds nothing and is left out. A backend that cannot
// bound the reasoning refuses the budget (501) rather than let it run
// unbounded.
func (c *Completion) SetReasoningBudget(tokens *int32, message string, info iface.BackendInfo) error {
	n := c.budget.tokens
	if n < 0 && tokens != nil {
		n = int64(*tokens)
	}
	if !c.Chat || n < 0 || (c.NPredict >= 0 && n >= int64(c.NPredict)) {
		return nil
	}
	if c.budget.message != nil {
		message = *c.budget.message
	}
	if !slices.Contains(info.Capabilities, iface.CapReasoningBudget) || !slices.Contains(info.Capabilities, iface.CapOutput) {
		return &run.Error{Status: http.StatusNotImplemented, Type: "not_supported_error",
			Msg: fmt.Sprintf("the %s backend cannot bound a reply's reasoning (reasoning_budget_tokens, thinking_budget_tokens, "+
				"Anthropic's thinking.budget_tokens, the engine's reasoning_budget): leave the budget out, or -1", info.Name)}
	}
	if c.Output == nil {
		chat := c.Prefill
		c.Output = &iface.Output{Chat: &chat, Stops: c.Stops}
		c.Parsed = true
	}
	c.Output.ReasoningBudget = &iface.ReasoningBudget{Tokens: int32(n), Message: message}
	return nil
}
