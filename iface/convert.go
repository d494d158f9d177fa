package iface

import (
	"time"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// Conversions between the contract's Go types and their gRPC messages.

func backendInfoToPB(i BackendInfo) *backendv1.BackendInfo {
	return &backendv1.BackendInfo{
		Name:    i.Name,
		Version: i.Version,
		Model: &backendv1.ModelIdentity{
			Alias: i.Model.Alias,
			Hash:  i.Model.Hash,
			Path:  i.Model.Path,
		},
		NSlots:        int64(i.NSlots),
		NVocab:        int64(i.NVocab),
		NCtx:          int64(i.NCtx),
		Capabilities:  i.Capabilities,
		NCtxSlot:      int64(i.NCtxSlot),
		KvUnified:     i.KVUnified,
		Quants:        i.Quants,
		ActiveQuant:   i.ActiveQuant,
		ExpertMode:    i.ExpertMode,
		PeerDevice:    i.PeerDevice,
		PeerReachable: i.PeerReachable,
		LayerSplit:    i.LayerSplit,
		SplitMode:     i.SplitMode,
		PromptDecode:  i.PromptDecode,
		MaxTokenBytes: int64(i.MaxTokenBytes),
		StateLayout:   i.StateLayout,
	}
}

func backendInfoFromPB(p *backendv1.BackendInfo) BackendInfo {
	m := p.GetModel()
	return BackendInfo{
		Name:    p.GetName(),
		Version: p.GetVersion(),
		Model: ModelIdentity{
			Alias: m.GetAlias(),
			Hash:  m.GetHash(),
			Path:  m.GetPath(),
		},
		NSlots:        int(p.GetNSlots()),
		NVocab:        int(p.GetNVocab()),
		NCtx:          int(p.GetNCtx()),
		Capabilities:  p.GetCapabilities(),
		NCtxSlot:      int(p.GetNCtxSlot()),
		KVUnified:     p.GetKvUnified(),
		Quants:        p.GetQuants(),
		ActiveQuant:   p.GetActiveQuant(),
		ExpertMode:    p.GetExpertMode(),
		PeerDevice:    p.GetPeerDevice(),
		PeerReachable: p.GetPeerReachable(),
		LayerSplit:    p.GetLayerSplit(),
		SplitMode:     p.GetSplitMode(),
		PromptDecode:  p.GetPromptDecode(),
		MaxTokenBytes: int(p.GetMaxTokenBytes()),
		StateLayout:   p.GetStateLayout(),
	}
}

func swapResultToPB(r SwapResult) *backendv1.SwapQuantResponse {
	return &backendv1.SwapQuantResponse{Swapped: int64(r.Swapped), Bytes: r.Bytes, DurationNs: int64(r.Duration), KvPreserved: r.KVPreserved}
}

func swapResultFromPB(p *backendv1.SwapQuantResponse) SwapResult {
	return SwapResult{Swapped: int(p.GetSwapped()), Bytes: p.GetBytes(), Duration: time.Duration(p.GetDurationNs()), KVPreserved: p.GetKvPreserved()}
}

func slotInfoToPB(s SlotInfo) *backendv1.SlotInfo {
	return &backendv1.SlotInfo{
		Slot:      int64(s.Slot),
		NPast:     int64(s.NPast),
		Tokens:    s.Tokens,
		StateSize: s.StateSize,
	}
}

func slotInfoFromPB(p *backendv1.SlotInfo) SlotInfo {
	return SlotInfo{
		Slot:      int(p.GetSlot()),
		NPast:     int(p.GetNPast()),
		Tokens:    p.GetTokens(),
		StateSize: p.GetStateSize(),
	}
}

func samplerToPB(p SamplerParams) *backendv1.SamplerParams {
	return &backendv1.SamplerParams{
		Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP, Seed: p.Seed,
		RepeatPenalty: p.RepeatPenalty, RepeatLastN: p.RepeatLastN,
		PresencePenalty: p.PresencePenalty, FrequencyPenalty: p.FrequencyPenalty,
		IgnoreEos: p.IgnoreEOS, LogitBias: p.LogitBias,
	}
}

func samplerFromPB(p *backendv1.SamplerParams) SamplerParams {
	return SamplerParams{
		Temperature: p.GetTemperature(), TopK: p.GetTopK(), TopP: p.GetTopP(), MinP: p.GetMinP(), Seed: p.GetSeed(),
		RepeatPenalty: p.GetRepeatPenalty(), RepeatLastN: p.GetRepeatLastN(),
		PresencePenalty: p.GetPresencePenalty(), FrequencyPenalty: p.GetFrequencyPenalty(),
		IgnoreEOS: p.GetIgnoreEos(), LogitBias: p.GetLogitBias(),
	}
}

func tokenToPB(t Token) *backendv1.Token {
	pb := &backendv1.Token{Id: t.ID, Text: []byte(t.Text), Logprob: t.Logprob}
	for _, c := range t.Top {
		pb.Top = append(pb.Top, &backendv1.TokenProb{Id: c.ID, Text: []byte(c.Text), Logprob: c.Logprob})
	}
	return pb
}

func tokenFromPB(pb *backendv1.Token) Token {
	t := Token{ID: pb.GetId(), Text: string(pb.GetText()), Logprob: pb.GetLogprob()}
	for _, c := range pb.GetTop() {
		t.Top = append(t.Top, TokenProb{ID: c.GetId(), Text: string(c.GetText()), Logprob: c.GetLogprob()})
	}
	return t
}

func prefillToPB(req PrefillRequest) *backendv1.PrefillRequest {
	var msgs []*backendv1.Message
	if len(req.Messages) > 0 {
		msgs = make([]*backendv1.Message, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = messageToPB(m)
		}
	}
	return &backendv1.PrefillRequest{Slot: int64(req.Slot), Messages: msgs, Tokens: req.Tokens, Text: req.Text, Model: req.Model,
		Tools: req.Tools, TemplateKwargs: req.TemplateKwargs}
}

func prefillFromPB(req *backendv1.PrefillRequest) PrefillRequest {
	var msgs []Message
	if pm := req.GetMessages(); len(pm) > 0 {
		msgs = make([]Message, len(pm))
		for i, m := range pm {
			msgs[i] = messageFromPB(m)
		}
	}
	return PrefillRequest{Slot: int(req.GetSlot()), Messages: msgs, Tokens: req.GetTokens(), Text: req.GetText(), Model: req.GetModel(),
		Tools: req.GetTools(), TemplateKwargs: req.GetTemplateKwargs()}
}

func messageToPB(m Message) *backendv1.Message {
	pb := &backendv1.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.ReasoningContent, ToolCallId: m.ToolCallID, Name: m.Name}
	for _, c := range m.ToolCalls {
		pb.ToolCalls = append(pb.ToolCalls, &backendv1.ToolCall{Id: c.ID, Name: c.Name, Arguments: c.Arguments})
	}
	return pb
}

func messageFromPB(pb *backendv1.Message) Message {
	m := Message{Role: pb.GetRole(), Content: pb.GetContent(), ReasoningContent: pb.GetReasoningContent(),
		ToolCallID: pb.GetToolCallId(), Name: pb.GetName()}
	for _, c := range pb.GetToolCalls() {
		m.ToolCalls = append(m.ToolCalls, ToolCall{ID: c.GetId(), Name: c.GetName(), Arguments: c.GetArguments()})
	}
	return m
}

func promptToPB(req *PrefillRequest) *backendv1.PrefillRequest {
	if req == nil {
		return nil
	}
	return prefillToPB(*req)
}

func promptFromPB(req *backendv1.PrefillRequest) *PrefillRequest {
	if req == nil {
		return nil
	}
	p := prefillFromPB(req)
	return &p
}

func promptResultToPB(r *PromptResult) *backendv1.PromptResult {
	if r == nil {
		return nil
	}
	return &backendv1.PromptResult{NTokens: int64(r.NTokens), NReused: int64(r.Reused),
		ModelFallback: r.ModelFallback, PrefillNs: int64(r.Prefill)}
}

func promptResultFromPB(r *backendv1.PromptResult) *PromptResult {
	if r == nil {
		return nil
	}
	return &PromptResult{NTokens: int(r.GetNTokens()), Reused: int(r.GetNReused()),
		ModelFallback: r.GetModelFallback(), Prefill: time.Duration(r.GetPrefillNs())}
}
