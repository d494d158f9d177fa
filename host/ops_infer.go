package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// ChatMessage is an OpenAI chat message, as PREFILL and the HTTP chat
// completions take it; content is a string, an array of parts, or null.
type ChatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
	ToolCalls        []ChatToolCall  `json:"tool_calls"`
}

// ChatToolCall is an assistant message's function call, OpenAI's shape.
type ChatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"` // OpenAI's JSON text in a string; an object is taken too
	} `json:"function"`
}

// arguments is the call's arguments as JSON text.
func (c ChatToolCall) arguments() (string, error) {
	a := bytes.TrimSpace(c.Function.Arguments)
	switch {
	case len(a) == 0 || string(a) == "null":
		return "{}", nil
	case a[0] == '"':
		var s string
		err := json.Unmarshal(a, &s)
		return s, err
	case a[0] == '{':
		return string(a), nil
	}
	return "", errors.New("function.arguments must be a JSON string or object")
}

func (m ChatMessage) text() (string, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	if c[0] == '"' {
		var s string
		err := json.Unmarshal(c, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", errors.New("content must be a string, an array of parts or null")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q is not supported", p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// ToMessages checks chat messages and converts them for the backend.
func ToMessages(in []ChatMessage) ([]iface.Message, error) {
	out := make([]iface.Message, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d] has no role", i)
		}
		t, err := m.text()
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i] = iface.Message{Role: m.Role, Content: t, ReasoningContent: m.ReasoningContent, Name: m.Name, ToolCallID: m.ToolCallID}
		for k, c := range m.ToolCalls {
			args, err := c.arguments()
			if err != nil {
				return nil, fmt.Errorf("messages[%d].tool_calls[%d]: %w", i, k, err)
			}
			out[i].ToolCalls = append(out[i].ToolCalls, iface.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args})
		}
	}
	return out, nil
}

// parseTokens reads little-endian u32 token ids.
func parseTokens(p []byte) ([]int32, error) {
	if len(p)%4 != 0 {
		return nil, fmt.Errorf("raw token payload of %d bytes is not a multiple of 4", len(p))
	}
	toks := make([]int32, len(p)/4)
	for i := range toks {
		v := binary.LittleEndian.Uint32(p[4*i:])
		if v > math.MaxInt32 {
			return nil, fmt.Errorf("token %d: id %d out of range", i, v)
		}
		toks[i] = int32(v)
	}
	return toks, nil
}

func isJSONObject(p []byte) bool {
	t := bytes.TrimLeft(p, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// ParsePrefill reads a PREFILL payload: an OpenAI chat-completions object (JSON, read as
// ChatBody: the prompt a chat completion of that body renders) or raw u32
// token ids (the E1 form). A payload that starts like JSON but is not, and
// whose length fits token ids, is read as tokens: a first token id whose low
// byte is '{' is legal.
func ParsePrefill(p []byte, slot int, info iface.BackendInfo) (iface.PrefillRequest, error) {
	req := iface.PrefillRequest{Slot: slot}
	if len(p) == 0 {
		return req, errors.New("PREFILL payload is empty")
	}
	if isJSONObject(p) {
		if err := CheckMessageCountJSON(p, info); err != nil {
			return req, err
		}
		var body ChatBody
		jerr := json.Unmarshal(p, &body)
		if jerr == nil {
			if len(body.Messages) == 0 {
				return req, errors.New("PREFILL request has no messages")
			}
			// The HTTP chat completion's prompt for the same body: its
			// tools, tool choice and template variables too.
			return body.Prefill(slot, info)
		}
		if len(p)%4 != 0 {
			return req, fmt.Errorf("PREFILL payload is neither JSON (%v) nor u32 token ids", jerr)
		}
	}
	toks, err := parseTokens(p)
	if err != nil {
		return req, err
	}
	req.Tokens = toks
	return req, nil
}

// handlePrefill evaluates a prompt into the slot and replies with its blob and
// logits, as the C++ engine did.
func (s *Server) handlePrefill(req *request, rp *replier) error {
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	_, info := s.Backend()
	preq, err := ParsePrefill(payload, slot, info)
	if err == nil {
		err = CheckPromptSize(preq, info)
	}
	var opts blobOptions
	if err == nil && preq.Messages != nil {
		opts, err = parseBlobOptions(payload)
	}
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	switched, err := s.SwitchModel(req.ctx, preq.Model)
	if err != nil {
		return rp.failErr(err)
	}
	lease, err := s.slots.acquire(slot, slotProcessing)
	if err != nil {
		return rp.failErr(err)
	}
	var after *iface.SlotInfo
	defer func() { lease.release(after) }()
	b, info, err := s.backendFor(lease)
	if err != nil {
		return rp.failErr(err)
	}
	tracing.SetModel(req.ctx, info.Model.Alias)
	start := time.Now()
	if preq, err = s.roomForPrompt(req.ctx, b, preq); err != nil {
		return rp.failErr(err)
	}
	res, err := b.Prefill(req.ctx, preq)
	if err != nil {
		tracing.Prefill{Slot: slot}.Record(req.ctx, start, time.Now(), err)
		if si, serr := b.Slot(req.ctx, slot); serr == nil {
			after = &si
		}
		return rp.failErr(err)
	}
	elapsed := time.Since(start)
	tracing.Prefill{Slot: slot, PromptTokens: len(res.Slot.Tokens), Reused: res.Reused}.Record(req.ctx, start, start.Add(elapsed), nil)
	after = &res.Slot
	s.stats.CountPromptReuse(res.Reused)
	lease.update(res.Slot)
	logits := iface.AppendLogits(make([]byte, 0, 4*len(res.Logits)), res.Logits)
	nTok := len(preq.Tokens)
	if preq.Messages != nil {
		nTok = len(res.Slot.Tokens)
	}
	s.stats.tokens(PhasePrefill, nTok, elapsed)
	m := transport.NewMeta().Add("n_past", res.Slot.NPast).Add("state_size", res.Slot.StateSize).
		Add("logits_size", len(logits)).Add("tokens_processed", nTok).
		Add("prefill_ms", float64(elapsed.Microseconds())/1000).AddFields(info.Model).
		Add("model_fallback", res.ModelFallback)
	if switched {
		m.Add("model_switched", true).Add("slots_cleared", true)
	}
	x, err := s.blobExtras(opts, info)
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	s.withCheckpoint(req.ctx, b, slot, opts, &x)
	return s.streamBlob(req.ctx, rp, b, res.Slot, m, x, logits, func() { lease.release(after) })
}

// roomForPrompt makes room in a KV cache the slots share for the prompt of
// req, whose tokens it asks the backend for (MakeRoom), and returns the
// request with those tokens, so that the backend tokenizes once. A backend
// that cannot tokenize gets req as it came.
func (s *Server) roomForPrompt(ctx context.Context, b iface.Backend, req iface.PrefillRequest) (iface.PrefillRequest, error) {
	if _, info := s.Backend(); info.SplitKV() {
		return req, nil
	}
	p, err := b.Tokenize(ctx, req)
	switch {
	case errors.Is(err, iface.ErrNotImplemented):
		return req, nil
	case err != nil:
		return req, err
	}
	s.MakeRoom(ctx, req.Slot, len(p.Tokens)+1, false)
	return iface.PrefillRequest{Slot: req.Slot, Tokens: p.Tokens, Model: req.Model, FromChat: len(req.Messages) > 0 || req.FromChat}, nil
}

// decodeRequest is a parsed DECODE.
type decodeRequest struct {
	nPredict int
	prefill  *iface.PrefillRequest // prompt to evaluate from scratch first
	sampler  iface.SamplerParams
	output   *iface.Output // response_format, json_schema or grammar
}

// parseDecode accepts {"n_predict":N,"messages":[…]|null, sampler overrides}
// or the E1 binary form [i32 n_predict][u32 tokens…].
func parseDecode(p []byte, slot int, sampler iface.SamplerParams, info iface.BackendInfo) (decodeRequest, error) {
	d := decodeRequest{sampler: sampler}
	nCtx := info.SlotCtx()
	if isJSONObject(p) {
		var body struct {
			NPredict *int64 `json:"n_predict"`
			ChatBody
			SamplerFields
			Seed *uint64 `json:"seed"`
		}
		if err := json.Unmarshal(p, &body); err != nil {
			return d, fmt.Errorf("DECODE payload is not valid JSON: %w", err)
		}
		if body.NPredict == nil {
			return d, errors.New("DECODE request needs n_predict")
		}
		if *body.NPredict < 0 || *body.NPredict > math.MaxInt32 {
			return d, fmt.Errorf("n_predict must be in [0, %d], got %d", math.MaxInt32, *body.NPredict)
		}
		d.nPredict = int(*body.NPredict)
		if body.Messages != nil {
			if len(body.Messages) == 0 {
				return d, errors.New("DECODE messages is empty")
			}
			pre, err := body.Prefill(slot, info) // PREFILL's prompt for the same body
			if err != nil {
				return d, err
			}
			pre.Model = ""
			if pre.ToolChoice == "required" {
				return d, errors.New("DECODE replies with tokens, not parsed tool calls: a required tool_choice is answered by /v1/chat/completions")
			}
			d.prefill = &pre
		}
		var err error
		if d.output, err = body.OutputFields.Output(); err != nil {
			return d, err
		}
		if err := body.SamplerFields.Validate(nCtx); err != nil {
			return d, err
		}
		body.SamplerFields.Apply(&d.sampler)
		if body.Seed != nil {
			d.sampler.Seed = *body.Seed
		}
		return d, nil
	}
	if len(p) < 4 {
		return d, fmt.Errorf("DECODE payload of %d bytes is neither JSON nor [i32 n_predict][u32 tokens]", len(p))
	}
	n := int32(binary.LittleEndian.Uint32(p))
	if n < 0 {
		return d, fmt.Errorf("n_predict must be >= 0, got %d", n)
	}
	d.nPredict = int(n)
	if len(p) > 4 {
		toks, err := parseTokens(p[4:])
		if err != nil {
			return d, err
		}
		d.prefill = &iface.PrefillRequest{Slot: slot, Tokens: toks}
	}
	return d, nil
}

// handleDecode generates tokens and replies fully framed: meta
// {"tokens_generated","n_past","stop_reason","text"} and 9-byte frames
// [u32 token_id][f32 logprob][u8 flags, 0x01 = final].
func (s *Server) handleDecode(req *request, rp *replier) error {
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	_, info := s.Backend()
	dreq, err := parseDecode(payload, slot, s.tun.Sampler(), info)
	if err == nil && dreq.prefill != nil {
		err = CheckPromptSize(*dreq.prefill, info)
	}
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	lease, err := s.slots.acquire(slot, slotProcessing)
	if err != nil {
		return rp.failErr(err)
	}
	lease.keepSource = dreq.prefill == nil // continuing the sequence, wherever it came from
	var after *iface.SlotInfo
	defer func() { lease.release(after) }()
	b, info, err := s.backendFor(lease)
	if err != nil {
		return rp.failErr(err)
	}
	defer func() {
		if si, err := b.Slot(req.ctx, slot); err == nil {
			after = &si
		}
	}()
	tracing.SetModel(req.ctx, info.Model.Alias)
	dr := iface.DecodeRequest{Slot: slot, NPredict: dreq.nPredict, Sampler: dreq.sampler, Logprobs: true, Output: dreq.output}
	if dreq.prefill != nil {
		p, err := s.roomForPrompt(req.ctx, b, *dreq.prefill)
		if err != nil {
			return rp.failErr(err)
		}
		dreq.prefill = &p
	}
	span := tracing.Decode{Slot: slot, PromptTokens: -1}
	switch {
	case dreq.prefill != nil && info.PromptDecode:
		dr.Prompt = dreq.prefill // one call: a batching backend samples the first token in the prompt's last step
	case dreq.prefill != nil:
		pstart := time.Now()
		pres, err := b.Prefill(req.ctx, *dreq.prefill)
		pend := time.Now()
		tracing.Prefill{Slot: slot, PromptTokens: len(pres.Slot.Tokens), Reused: pres.Reused}.Record(req.ctx, pstart, pend, err)
		if err != nil {
			return rp.failErr(err)
		}
		s.stats.tokens(PhasePrefill, len(pres.Slot.Tokens), pend.Sub(pstart))
		span.PromptTokens, span.Reused = len(pres.Slot.Tokens), pres.Reused
	}
	var frames []byte
	var text strings.Builder
	dstart := time.Now()
	// Every frame carries its token's log-probability (§ DECODE frames).
	res, err := b.Decode(req.ctx, dr, func(t iface.Token) error {
		if span.FirstToken.IsZero() {
			span.FirstToken = time.Now()
		}
		frames = transport.AppendDecodeFrame(frames, transport.DecodeFrame{TokenID: uint32(t.ID), Logprob: t.Logprob})
		text.WriteString(t.Text)
		return nil
	})
	if p := res.Prompt; p != nil {
		s.stats.tokens(PhasePrefill, p.NTokens, p.Prefill)
		tracing.Prefill{Slot: slot, PromptTokens: p.NTokens, Reused: p.Reused}.Record(req.ctx, dstart, dstart.Add(p.Prefill), nil)
		dstart = dstart.Add(p.Prefill)
		span.PromptTokens, span.Reused = p.NTokens, p.Reused
	}
	dend := time.Now()
	span.Generated, span.StopReason = res.TokensGenerated, res.StopReason
	if span.PromptTokens < 0 { // the sequence the slot held
		span.PromptTokens = max(res.NPast-res.TokensGenerated, 0)
	}
	span.Record(req.ctx, dstart, dend, err)
	if err != nil {
		return rp.failErr(err)
	}
	s.stats.tokens(PhaseDecode, res.TokensGenerated, dend.Sub(dstart))
	s.stats.CountDrafts(res.DraftTokens, res.DraftAccepted)
	if len(frames) > 0 {
		frames[len(frames)-1] |= 0x01 // the last frame is the final one
	}
	m := transport.NewMeta().Add("tokens_generated", res.TokensGenerated).Add("n_past", res.NPast).
		Add("stop_reason", res.StopReason).Add("text", text.String())
	return rp.replyMeta(transport.StatusOK, m, frames)
}
