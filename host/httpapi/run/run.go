// Package run is what a completion's run and the HTTP dialects that answer
// it share: the neutral events of the run, which it emits to the dialect's
// Sink, the request error every dialect words in its own shape, and the
// reading of request JSON. It imports no dialect, and no dialect imports
// another: each turns these events into its own wire bytes.
package run

import "github.com/hydra-engine/hydra-engine/iface"

// Sink takes a completion's events and writes them as its dialect's reply.
// A streamed reply gets Begin, then Tokens and Deltas, then End or Fail; a
// whole one Tokens, then End or Fail.
type Sink interface {
	// Begin starts a streamed reply: its header goes out now, or with its
	// first event where lazy (the decode evaluates the prompt first and may
	// still refuse it with a status of its own).
	Begin(h Head, lazy bool) error
	// Token is a generated token, before the deltas its text makes; a
	// dialect that reports tokens or their probabilities keeps it.
	Token(t iface.Token)
	// Delta streams a piece of the reply.
	Delta(d Delta) error
	// End ends the reply: the whole of it, or the stream's last events.
	End(e End) error
	// Fail ends the reply with e: as the reply where none of it went out,
	// else as the stream's last event.
	Fail(e *Error)
	// Started reports whether any of the reply went out.
	Started() bool
}

// Head is what every event of a reply shares: the completion and the
// prompt it ran on, as known when the event goes out.
type Head struct {
	ID          string // random hex, which each dialect prefixes its own way
	Created     int64  // Unix seconds
	Model       string // the model's alias
	Fingerprint string // the backend and model that answered
	Slot        int
	Switched    bool // the request switched the engine to its model
	NPrompt     int  // the prompt's tokens
	Reused      int  // of which kept from the slot's previous sequence
}

// Delta is what a token (or the end of the text) added to the reply:
// reasoning, content and a tool call's piece, streamed in that order. Both
// texts may be empty where a stop string or a marker holds text back.
type Delta struct {
	Reasoning, Content string
	Tool               *ToolPiece
}

// Empty reports whether the delta adds nothing to the reply.
func (d Delta) Empty() bool { return d.Reasoning == "" && d.Content == "" && d.Tool == nil }

// Each hands the delta's parts to a dialect's writers in the order a reply
// streams them, reasoning, content, then the tool call's piece, skipping
// those it lacks and stopping at the first error.
func (d Delta) Each(reasoning, content func(string) error, tool func(ToolPiece) error) error {
	if d.Reasoning != "" {
		if err := reasoning(d.Reasoning); err != nil {
			return err
		}
	}
	if d.Content != "" {
		if err := content(d.Content); err != nil {
			return err
		}
	}
	if d.Tool != nil {
		return tool(*d.Tool)
	}
	return nil
}

// ToolPiece is a streamed piece of tool call Index: its id and name with
// the first piece, then its arguments in pieces.
type ToolPiece struct {
	Index          int
	ID, Name, Args string
}

// StopNTokensLimit is the backends' stop reason for a full slot or KV cache.
const StopNTokensLimit = "n_tokens_limit"

// End is the end of a completion.
type End struct {
	Head
	Text, Reasoning string           // the whole reply
	ToolCalls       []iface.ToolCall // a parsed reply's calls
	// Finish is why the reply ended, in OpenAI's words: "stop", "length" or
	// "tool_calls".
	Finish string
	// Stop is the backend's stop reason ("eos", "length", "n_tokens_limit",
	// iface.StopString), and StopWord the stop string that ended the reply
	// where one did and it is known.
	Stop, StopWord string
	Generated      int // tokens generated
	NPast          int // tokens in the slot once the decode ended
	Timings        *Timings
	// PromptText is the prompt's text as the backend detokenizes it, false
	// where it cannot; only a dialect that echoes the prompt asks it.
	PromptText func() (string, bool)
}
