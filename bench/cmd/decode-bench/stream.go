package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// event is one message of a streamed completion, in the terms both servers'
// replies share.
type event struct {
	Text   string // generated text this message carries
	Final  bool   // the message that ends the completion (finish_reason, done)
	Tokens int    // the server's own count of generated tokens; -1 where the message has none
	Prompt int    // the server's count of prompt tokens; -1 where the message has none
	Slot   int    // the slot that served it (ours: id_slot); -1 where unknown
	// Speculative decoding's draft tokens verified and accepted (timings
	// draft_n, draft_n_accepted: ours and llama-server's); 0 without.
	DraftN, DraftAccepted int
}

func newEvent() event { return event{Tokens: -1, Prompt: -1, Slot: -1} }

// maxLine bounds one streamed message; a longer one is a broken stream.
const maxLine = 4 << 20

// openAIChunk is the part of an OpenAI-style streamed chunk the benchmark
// reads: text completions carry choices[].text, chat completions
// choices[].delta.content; the usage chunk (stream_options.include_usage)
// has no choices.
type openAIChunk struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	IDSlot  *int `json:"id_slot"`
	Timings *struct {
		DraftN         int `json:"draft_n"`
		DraftNAccepted int `json:"draft_n_accepted"`
	} `json:"timings"`
	Error json.RawMessage `json:"error"`
}

// parseSSE reads an OpenAI-style server-sent event stream ("data: {…}"
// lines, "data: [DONE]" at the end), calling emit for every chunk. The
// stream must end with [DONE]: a stream cut short is an error, so that a
// crashed server is not measured as a short completion.
func parseSSE(r io.Reader, emit func(event) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, other fields
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			return nil
		}
		ev, err := openAIEvent(data)
		if err != nil {
			return err
		}
		if err := emit(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the event stream ended without [DONE]")
}

func openAIEvent(data []byte) (event, error) {
	var c openAIChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return event{}, fmt.Errorf("bad chunk %.200q: %w", data, err)
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		return event{}, fmt.Errorf("server error in the stream: %s", errorText(c.Error))
	}
	ev := newEvent()
	for _, ch := range c.Choices {
		switch {
		case ch.Text != nil:
			ev.Text += *ch.Text
		case ch.Delta != nil && ch.Delta.Content != nil:
			ev.Text += *ch.Delta.Content
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			ev.Final = true
		}
	}
	if c.Usage != nil {
		ev.Tokens, ev.Prompt = c.Usage.CompletionTokens, c.Usage.PromptTokens
	}
	if c.IDSlot != nil {
		ev.Slot = *c.IDSlot
	}
	if c.Timings != nil {
		ev.DraftN, ev.DraftAccepted = c.Timings.DraftN, c.Timings.DraftNAccepted
	}
	return ev, nil
}

// errorText is an error field's message: {"message": …} (OpenAI) or a
// plain string (Ollama's native API).
func errorText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Message != "" {
		return o.Message
	}
	return string(raw)
}

// ollamaLine is one line of Ollama's native streaming reply (/api/generate:
// newline-delimited JSON), the last with done and the counts.
type ollamaLine struct {
	Response        string          `json:"response"`
	Done            bool            `json:"done"`
	DoneReason      string          `json:"done_reason"`
	EvalCount       int             `json:"eval_count"`
	PromptEvalCount int             `json:"prompt_eval_count"`
	Error           json.RawMessage `json:"error"`
}

// ollamaRepeatCut is how many identical tokens in a row (their text without
// blanks) make Ollama end a generation: its server stops reading the runner
// after 31 and closes the stream without a done line (llm/server.go,
// "token repeat limit reached").
const ollamaRepeatCut = 31

// parseNDJSON reads Ollama's /api/generate stream, calling emit for every
// line. The stream must end with a done line, or be cut by Ollama's repeat
// guard (ollamaRepeatCut), when the tokens are counted as the lines.
func parseNDJSON(r io.Reader, emit func(event) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	last, repeats := "", 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l ollamaLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("bad line %.200q: %w", line, err)
		}
		if len(l.Error) > 0 && string(l.Error) != "null" {
			return fmt.Errorf("server error in the stream: %s", errorText(l.Error))
		}
		if t := strings.TrimSpace(l.Response); t == last && repeats > 0 {
			repeats++
		} else {
			last, repeats = t, 1
		}
		ev := newEvent()
		ev.Text = l.Response
		if l.Done {
			ev.Final, ev.Tokens, ev.Prompt = true, l.EvalCount, l.PromptEvalCount
		}
		if err := emit(ev); err != nil {
			return err
		}
		if l.Done {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if repeats >= ollamaRepeatCut {
		return nil
	}
	return errors.New("the stream ended without a done line")
}
