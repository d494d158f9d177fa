package iface

import (
	"fmt"
	"math"
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
		NSlots:         int64(i.NSlots),
		NVocab:         int64(i.NVocab),
		NCtx:           int64(i.NCtx),
		Capabilities:   i.Capabilities,
		NCtxSlot:       int64(i.NCtxSlot),
		KvUnified:      i.KVUnified,
		Quants:         i.Quants,
		ActiveQuant:    i.ActiveQuant,
		ExpertMode:     i.ExpertMode,
		PeerDevice:     i.PeerDevice,
		PeerReachable:  i.PeerReachable,
		LayerSplit:     i.LayerSplit,
		SplitMode:      i.SplitMode,
		PromptDecode:   i.PromptDecode,
		MaxTokenBytes:  int64(i.MaxTokenBytes),
		StateLayout:    i.StateLayout,
		ChatTemplate:   i.ChatTemplate,
		BosToken:       i.BOSToken,
		EosToken:       i.EOSToken,
		PromptCache:    promptCacheToPB(i.PromptCache),
		Special:        specialToPB(i.Special),
		RerankTemplate: i.RerankTemplate,
		NBatch:         int64(i.NBatch),
		Pooling:        i.Pooling,
		Checkpoints:    checkpointsToPB(i.Checkpoints),
		Speculative:    specStatsToPB(i.Speculative),
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
		NSlots:         int(p.GetNSlots()),
		NVocab:         int(p.GetNVocab()),
		NCtx:           int(p.GetNCtx()),
		Capabilities:   p.GetCapabilities(),
		NCtxSlot:       int(p.GetNCtxSlot()),
		KVUnified:      p.GetKvUnified(),
		Quants:         p.GetQuants(),
		ActiveQuant:    p.GetActiveQuant(),
		ExpertMode:     p.GetExpertMode(),
		PeerDevice:     p.GetPeerDevice(),
		PeerReachable:  p.GetPeerReachable(),
		LayerSplit:     p.GetLayerSplit(),
		SplitMode:      p.GetSplitMode(),
		PromptDecode:   p.GetPromptDecode(),
		MaxTokenBytes:  int(p.GetMaxTokenBytes()),
		StateLayout:    p.GetStateLayout(),
		ChatTemplate:   p.GetChatTemplate(),
		BOSToken:       p.GetBosToken(),
		EOSToken:       p.GetEosToken(),
		PromptCache:    promptCacheFromPB(p.GetPromptCache()),
		Special:        specialFromPB(p.GetSpecial()),
		RerankTemplate: p.GetRerankTemplate(),
		NBatch:         int(p.GetNBatch()),
		Pooling:        p.GetPooling(),
		Checkpoints:    checkpointsFromPB(p.GetCheckpoints()),
		Speculative:    specStatsFromPB(p.GetSpeculative()),
	}
}

func specStatsToPB(s *SpeculativeStats) *backendv1.SpeculativeStats {
	if s == nil {
		return nil
	}
	return &backendv1.SpeculativeStats{Rule: s.Rule, Drafting: s.Drafting, PlainRate: s.PlainRate, DraftRate: s.DraftRate,
		Stops: s.Stops, Probes: s.Probes, PlainSteps: s.PlainSteps, DraftSteps: s.DraftSteps, PlainSeconds: s.PlainSeconds,
		DraftSeconds: s.DraftSeconds, CatchUpSeconds: s.CatchUpSeconds, SaveSeconds: s.SaveSeconds,
		VerifySeconds: s.VerifySeconds, ReplaySeconds: s.ReplaySeconds}
}

func specStatsFromPB(p *backendv1.SpeculativeStats) *SpeculativeStats {
	if p == nil {
		return nil
	}
	return &SpeculativeStats{Rule: p.GetRule(), Drafting: p.GetDrafting(), PlainRate: p.GetPlainRate(), DraftRate: p.GetDraftRate(),
		Stops: p.GetStops(), Probes: p.GetProbes(), PlainSteps: p.GetPlainSteps(), DraftSteps: p.GetDraftSteps(),
		PlainSeconds: p.GetPlainSeconds(), DraftSeconds: p.GetDraftSeconds(), CatchUpSeconds: p.GetCatchUpSeconds(),
		SaveSeconds: p.GetSaveSeconds(), VerifySeconds: p.GetVerifySeconds(), ReplaySeconds: p.GetReplaySeconds()}
}

func checkpointsToPB(c *CheckpointStats) *backendv1.CheckpointStats {
	if c == nil {
		return nil
	}
	p := &backendv1.CheckpointStats{MaxPerSlot: int64(c.MaxPerSlot), MinStep: int64(c.MinStep), BudgetBytes: c.BudgetBytes,
		Held: c.Held, Bytes: c.Bytes, Taken: c.Taken, Restored: c.Restored, Dropped: c.Dropped, TokensSaved: c.TokensSaved,
		OverBudget: c.OverBudget}
	for _, s := range c.Slots {
		p.SlotHeld = append(p.SlotHeld, int64(s.Held))
		p.SlotBytes = append(p.SlotBytes, s.Bytes)
	}
	return p
}

func checkpointsFromPB(p *backendv1.CheckpointStats) *CheckpointStats {
	if p == nil {
		return nil
	}
	c := &CheckpointStats{MaxPerSlot: int(p.GetMaxPerSlot()), MinStep: int(p.GetMinStep()), BudgetBytes: p.GetBudgetBytes(),
		Held: p.GetHeld(), Bytes: p.GetBytes(), Taken: p.GetTaken(), Restored: p.GetRestored(), Dropped: p.GetDropped(),
		TokensSaved: p.GetTokensSaved(), OverBudget: p.GetOverBudget()}
	held, bytes := p.GetSlotHeld(), p.GetSlotBytes()
	for i := range held {
		var b int64
		if i < len(bytes) {
			b = bytes[i]
		}
		c.Slots = append(c.Slots, SlotCheckpoints{Held: int(held[i]), Bytes: b})
	}
	return c
}

func promptCacheToPB(c *PromptCacheStats) *backendv1.PromptCacheStats {
	if c == nil {
		return nil
	}
	return &backendv1.PromptCacheStats{BudgetBytes: c.BudgetBytes, Bytes: c.Bytes, Entries: c.Entries, Tokens: c.Tokens,
		Hits: c.Hits, Misses: c.Misses, Saves: c.Saves, SaveBytes: c.SaveBytes, SaveSeconds: c.SaveSeconds,
		Restores: c.Restores, RestoreBytes: c.RestoreBytes, RestoreSeconds: c.RestoreSeconds,
		Evictions: c.Evictions, Skipped: c.Skipped, SaveFailures: c.SaveFailures, RestoreFailures: c.RestoreFailures}
}

func promptCacheFromPB(p *backendv1.PromptCacheStats) *PromptCacheStats {
	if p == nil {
		return nil
	}
	return &PromptCacheStats{BudgetBytes: p.GetBudgetBytes(), Bytes: p.GetBytes(), Entries: p.GetEntries(), Tokens: p.GetTokens(),
		Hits: p.GetHits(), Misses: p.GetMisses(), Saves: p.GetSaves(), SaveBytes: p.GetSaveBytes(), SaveSeconds: p.GetSaveSeconds(),
		Restores: p.GetRestores(), RestoreBytes: p.GetRestoreBytes(), RestoreSeconds: p.GetRestoreSeconds(),
		Evictions: p.GetEvictions(), Skipped: p.GetSkipped(), SaveFailures: p.GetSaveFailures(), RestoreFailures: p.GetRestoreFailures()}
}

func specialToPB(s *SpecialTokens) *backendv1.SpecialTokens {
	if s == nil {
		return nil
	}
	return &backendv1.SpecialTokens{Bos: s.BOS, Eos: s.EOS, Sep: s.SEP, FimPre: s.FIMPre, FimSuf: s.FIMSuf, FimMid: s.FIMMid,
		FimPad: s.FIMPad, FimRep: s.FIMRep, FimSep: s.FIMSep, AddBos: s.AddBOS, AddEos: s.AddEOS, AddSep: s.AddSEP}
}

func specialFromPB(p *backendv1.SpecialTokens) *SpecialTokens {
	if p == nil {
		return nil
	}
	return &SpecialTokens{BOS: p.GetBos(), EOS: p.GetEos(), SEP: p.GetSep(), FIMPre: p.GetFimPre(), FIMSuf: p.GetFimSuf(),
		FIMMid: p.GetFimMid(), FIMPad: p.GetFimPad(), FIMRep: p.GetFimRep(), FIMSep: p.GetFimSep(),
		AddBOS: p.GetAddBos(), AddEOS: p.GetAddEos(), AddSEP: p.GetAddSep()}
}

func embedRequestToPB(req EmbedRequest) *backendv1.EmbedRequest {
	pb := &backendv1.EmbedRequest{Inputs: make([]*backendv1.TokenList, len(req.Inputs))}
	for i, in := range req.Inputs {
		pb.Inputs[i] = &backendv1.TokenList{Tokens: in}
	}
	if req.Normalize != nil {
		n := int32(min(max(*req.Normalize, math.MinInt32), math.MaxInt32))
		pb.Normalize = &n
	}
	return pb
}

func embedRequestFromPB(pb *backendv1.EmbedRequest) EmbedRequest {
	req := EmbedRequest{Inputs: make([][]int32, len(pb.GetInputs()))}
	for i, in := range pb.GetInputs() {
		req.Inputs[i] = in.GetTokens()
	}
	if pb.Normalize != nil {
		n := int(pb.GetNormalize())
		req.Normalize = &n
	}
	return req
}

// embeddingToPB flattens the vectors, which must be of one length.
func embeddingToPB(e Embedding) (*backendv1.Embedding, error) {
	pb := &backendv1.Embedding{Rows: int64(len(e.Vectors)), NTokens: int64(e.NTokens)}
	for i, v := range e.Vectors {
		if len(v) != len(e.Vectors[0]) {
			return nil, fmt.Errorf("embedding row %d has %d values, row 0 %d", i, len(v), len(e.Vectors[0]))
		}
		pb.Values = append(pb.Values, v...)
	}
	return pb, nil
}

func embeddingFromPB(pb *backendv1.Embedding) (Embedding, error) {
	rows, vals := pb.GetRows(), pb.GetValues()
	if rows < 0 || (rows == 0 && len(vals) > 0) || (rows > 0 && int64(len(vals))%rows != 0) {
		return Embedding{}, fmt.Errorf("backend plugin: an embedding of %d values in %d rows", len(vals), rows)
	}
	e := Embedding{NTokens: int(pb.GetNTokens()), Vectors: make([][]float32, rows)}
	if rows > 0 {
		dim := int64(len(vals)) / rows
		for r := range e.Vectors {
			e.Vectors[r] = vals[int64(r)*dim : int64(r+1)*dim : int64(r+1)*dim]
		}
	}
	return e, nil
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
	pb.Deltas = deltasToPB(t.Deltas)
	return pb
}

func deltasToPB(ds []ChatDelta) []*backendv1.ChatDelta {
	var pb []*backendv1.ChatDelta
	for _, d := range ds {
		pb = append(pb, &backendv1.ChatDelta{Content: d.Content, Reasoning: d.Reasoning,
			ToolCall: int32(min(max(d.ToolCall+1, 0), math.MaxInt32)), ToolId: d.ToolID, ToolName: d.ToolName, ToolArguments: d.ToolArgs})
	}
	return pb
}

func deltasFromPB(pb []*backendv1.ChatDelta) []ChatDelta {
	var ds []ChatDelta
	for _, d := range pb {
		ds = append(ds, ChatDelta{Content: d.GetContent(), Reasoning: d.GetReasoning(),
			ToolCall: int(max(d.GetToolCall(), 0)) - 1, ToolID: d.GetToolId(), ToolName: d.GetToolName(), ToolArgs: d.GetToolArguments()})
	}
	return ds
}

func tokenFromPB(pb *backendv1.Token) Token {
	t := Token{ID: pb.GetId(), Text: string(pb.GetText()), Logprob: pb.GetLogprob()}
	for _, c := range pb.GetTop() {
		t.Top = append(t.Top, TokenProb{ID: c.GetId(), Text: string(c.GetText()), Logprob: c.GetLogprob()})
	}
	for _, d := range pb.GetDeltas() {
		t.Deltas = append(t.Deltas, ChatDelta{Content: d.GetContent(), Reasoning: d.GetReasoning(),
			ToolCall: int(max(d.GetToolCall(), 0)) - 1, ToolID: d.GetToolId(), ToolName: d.GetToolName(), ToolArgs: d.GetToolArguments()})
	}
	return t
}

func outputToPB(o *Output) *backendv1.Output {
	if o == nil {
		return nil
	}
	pb := &backendv1.Output{Chat: promptToPB(o.Chat), JsonSchema: o.JSONSchema, Grammar: o.Grammar, Stops: o.Stops}
	if b := o.ReasoningBudget; b != nil {
		pb.ReasoningBudget = &backendv1.ReasoningBudget{Tokens: b.Tokens, Message: b.Message}
	}
	return pb
}

func outputFromPB(o *backendv1.Output) *Output {
	if o == nil {
		return nil
	}
	out := &Output{Chat: promptFromPB(o.GetChat()), JSONSchema: o.GetJsonSchema(), Grammar: o.GetGrammar(), Stops: o.GetStops()}
	if b := o.GetReasoningBudget(); b != nil {
		out.ReasoningBudget = &ReasoningBudget{Tokens: b.GetTokens(), Message: b.GetMessage()}
	}
	return out
}

func replyToPB(r *ChatReply) *backendv1.ChatReply {
	if r == nil {
		return nil
	}
	pb := &backendv1.ChatReply{Content: r.Content, Reasoning: r.Reasoning}
	for _, c := range r.ToolCalls {
		pb.ToolCalls = append(pb.ToolCalls, &backendv1.ToolCall{Id: c.ID, Name: c.Name, Arguments: c.Arguments})
	}
	return pb
}

func replyFromPB(pb *backendv1.ChatReply) *ChatReply {
	if pb == nil {
		return nil
	}
	r := &ChatReply{Content: pb.GetContent(), Reasoning: pb.GetReasoning()}
	for _, c := range pb.GetToolCalls() {
		r.ToolCalls = append(r.ToolCalls, ToolCall{ID: c.GetId(), Name: c.GetName(), Arguments: c.GetArguments()})
	}
	return r
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
		Tools: req.Tools, TemplateKwargs: req.TemplateKwargs, ToolChoice: req.ToolChoice, ToolChoiceName: req.ToolChoiceName,
		ParallelToolCalls: req.ParallelToolCalls, Tokenize: tokenizeOptionsToPB(req.Tokenize),
		PromptCache: req.PromptCache, SaveSequence: req.SaveSequence, FromChat: req.FromChat}
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
		Tools: req.GetTools(), TemplateKwargs: req.GetTemplateKwargs(), ToolChoice: req.GetToolChoice(),
		ToolChoiceName: req.GetToolChoiceName(), ParallelToolCalls: req.ParallelToolCalls, Tokenize: tokenizeOptionsFromPB(req.GetTokenize()),
		PromptCache: req.GetPromptCache(), SaveSequence: req.GetSaveSequence(), FromChat: req.GetFromChat()}
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

func tokenizeOptionsToPB(o *TokenizeOptions) *backendv1.TokenizeOptions {
	if o == nil {
		return nil
	}
	return &backendv1.TokenizeOptions{AddSpecial: o.AddSpecial, ParseSpecial: o.ParseSpecial, WithPieces: o.WithPieces}
}

func tokenizeOptionsFromPB(o *backendv1.TokenizeOptions) *TokenizeOptions {
	if o == nil {
		return nil
	}
	return &TokenizeOptions{AddSpecial: o.GetAddSpecial(), ParseSpecial: o.GetParseSpecial(), WithPieces: o.GetWithPieces()}
}

func piecesToPB(ps []string) [][]byte {
	var out [][]byte
	for _, p := range ps {
		out = append(out, []byte(p))
	}
	return out
}

func piecesFromPB(ps [][]byte) []string {
	var out []string
	for _, p := range ps {
		out = append(out, string(p))
	}
	return out
}

func checkpointToPB(c *Checkpoint) *backendv1.Checkpoint {
	if c == nil {
		return nil
	}
	return &backendv1.Checkpoint{PosMin: c.PosMin, PosMax: c.PosMax, NTokens: c.NTokens, Target: c.Target, Draft: c.Draft}
}

func checkpointFromPB(p *backendv1.Checkpoint) *Checkpoint {
	if p == nil {
		return nil
	}
	return &Checkpoint{PosMin: p.GetPosMin(), PosMax: p.GetPosMax(), NTokens: p.GetNTokens(), Target: p.GetTarget(), Draft: p.GetDraft()}
}
