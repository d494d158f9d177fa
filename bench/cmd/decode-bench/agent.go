package main

// The agent measurement (-agent-tokens N,…): one slot; a coding agent's
// conversation on /v1/chat/completions, as the nodes serve it: a system
// prompt of about N tokens (the repository's context), then turns that call
// a tool and read its result, and every third turn an answer and a new user
// message (Qwen3.x templates then drop the earlier turns' reasoning, so the
// prompt parts from the slot's sequence before its end). Ours and
// llama-server, from the same model file (which must carry a chat template:
// gguf-gen -tokenizer), one after the other, answer the same requests; the
// replies' timings say how many prompt tokens each evaluated, and the
// request's time is the time to first token (one token generated).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// agentTools is the tool the conversation calls.
const agentTools = `[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.",` +
	`"parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`

// agentResultWords is the length of a tool result, in words.
const agentResultWords = 200

// agentRun is the measurement at every N.
type agentRun struct {
	Reps  int         `json:"reps"`
	Turns int         `json:"turns"`
	Sizes []agentSize `json:"sizes"`
}

// agentSize is one N's conversation on each system.
type agentSize struct {
	Tokens  int           `json:"system_tokens"` // about, the system prompt's
	NCtx    int           `json:"n_ctx"`
	Systems []agentSystem `json:"systems"` // ours, then llama-server
}

// agentSystem is one server's answers: by turn, one sample a rep.
type agentSystem struct {
	oneServer
	Turns [][]agentReply `json:"turns"`
}

// agentReply is one request's figures.
type agentReply struct {
	ckptSample
	PromptTokens int `json:"prompt_tokens"` // the whole prompt (usage)
}

// agentConversation is the messages of each turn's request: turn t's are
// turn t−1's and what the agent and the tool or the user added.
func agentConversation(seed, systemWords, turns int) [][]map[string]any {
	msgs := []map[string]any{
		{"role": "system", "content": "You are a coding agent. Read files with read_file and answer briefly. The repository:\n" +
			promptText(seed, systemWords)},
		{"role": "user", "content": "Why does the build fail on the CI machine but not here?"},
	}
	var out [][]map[string]any
	for t := range turns {
		out = append(out, append([]map[string]any(nil), msgs...))
		n := t + 1
		if t%3 == 2 {
			msgs = append(msgs,
				map[string]any{"role": "assistant", "reasoning_content": "The files say enough to answer.", "content": fmt.Sprintf("Answer %d: %s", n, promptText(seed+100+n, 30))},
				map[string]any{"role": "user", "content": fmt.Sprintf("Thanks. Now question %d: what about the tests?", n)})
			continue
		}
		id := fmt.Sprintf("call_%d", n)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": "", "reasoning_content": fmt.Sprintf("I should read file %d next.", n),
				"tool_calls": []map[string]any{{"id": id, "type": "function",
					"function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": "src/f%d.go"}`, n)}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": promptText(seed+200+n, agentResultWords)})
	}
	return out
}

func measureAgent(ctx context.Context, o options, rep *report) *agentRun {
	r := &agentRun{Reps: o.agentReps, Turns: o.agentTurns}
	tk := tokenizer{bin: o.llamaBatched, model: o.model, dir: o.work}
	cal, err := tk.prompts(ctx, []int{9101}, 400)
	if err != nil {
		rep.fail("agent", err, "")
		return r
	}
	perWord := float64(len(cal[0].Tokens)-1) / float64(len(strings.Fields(cal[0].Text)))
	for _, n := range o.agentTokens {
		words := max(int(float64(n)/perWord), 1)
		// Room for the turns: each adds a result, a call, an answer.
		grow := int(float64(o.agentTurns*(agentResultWords+80)) * perWord)
		size := agentSize{Tokens: n, NCtx: (n + grow + 1024 + 255) / 256 * 256}
		for _, sys := range []string{"ours", "llama-server"} {
			logf("agent: %s, a conversation of %d turns from a system prompt of about %d tokens", sys, o.agentTurns, n)
			s := runAgentSystem(ctx, o, sys, size.NCtx, words)
			if s.Err != "" {
				rep.fail(fmt.Sprintf("agent %d %s", n, sys), fmt.Errorf("%s", s.Err), "")
			}
			size.Systems = append(size.Systems, s)
		}
		r.Sizes = append(r.Sizes, size)
	}
	return r
}

// runAgentSystem starts one server of one slot and plays the conversation
// once a rep, each rep a new one (another repository), then stops it.
func runAgentSystem(ctx context.Context, o options, sys string, nCtx, systemWords int) agentSystem {
	out := agentSystem{Turns: make([][]agentReply, o.agentTurns)}
	out.oneServer = withOneSlot(ctx, o, sys, nCtx, "ours-agent.log", func(base string, hc *http.Client) error {
		for rep := range o.agentReps {
			for t, msgs := range agentConversation(7000+rep, systemWords, o.agentTurns) {
				s, err := chatTurn(ctx, hc, base, msgs)
				if err != nil {
					return fmt.Errorf("rep %d, turn %d: %w", rep, t, err)
				}
				out.Turns[t] = append(out.Turns[t], s)
				logf("  turn %d: %d prompt tokens, evaluated %d, kept %d, prompt %.1f ms, request %.1f ms", t, s.PromptTokens, s.PromptN, s.CacheN, s.PromptMS, s.WallMS)
			}
		}
		return nil
	})
	return out
}

// chatTurn sends one turn's messages for one greedy token and reads the
// reply's usage and timings.
func chatTurn(ctx context.Context, hc *http.Client, base string, msgs []map[string]any) (agentReply, error) {
	s, n, err := postTimings(ctx, hc, base+"/v1/chat/completions", map[string]any{"model": "model", "messages": msgs,
		"tools": json.RawMessage(agentTools), "max_tokens": 1, "temperature": 0, "seed": seed})
	return agentReply{ckptSample: s, PromptTokens: n}, err
}

// writeAgent is the page's section on the agent's conversation: each
// turn's prompt tokens evaluated and time to first token, ours beside
// llama-server.
func (r *report) writeAgent(p func(string, ...any)) {
	a := r.Agent
	if a == nil {
		return
	}
	p("## An agent's conversation: context checkpoints turn by turn")
	p("")
	p("One slot (`--slots 1`, llama-server `-np 1`), the same model file and chat template; `/v1/chat/completions` with a tool, one token generated a turn. "+
		"Turns 1–2, 4–5, …: a tool call and its result (%d words); turns 3, 6, …: an answer and a new user message. Each rep a new conversation. "+
		"`timings.prompt_n`: prompt tokens evaluated; request: sent to answered (the time to first token). Medians over %d reps.", agentResultWords, a.Reps)
	p("")
	for _, sz := range a.Sizes {
		p("System prompt of about %d tokens (`n_ctx` %d):", sz.Tokens, sz.NCtx)
		p("")
		p("| turn | prompt tokens | llama-server evaluates | ours evaluates | llama-server request ms | ours request ms | ours ÷ llama-server |")
		p("|---|---|---|---|---|---|---|")
		sys, servers := serversOf(sz.Systems)
		for t := range a.Turns {
			o, l := agentMedian(sys["ours"], t), agentMedian(sys["llama-server"], t)
			p("| %d | %s | %s | %s | %s | %s | %s |", t+1, l.tokens, l.n, o.n, fcell(l.wall, 1), fcell(o.wall, 1), fratio(o.wall, l.wall))
		}
		p("")
		writeSettings(p, servers)
	}
}

// agentStat is a turn's medians on one system, and its prompt's sizes.
type agentStat struct {
	ckptStat
	tokens string
}

func agentMedian(s agentSystem, t int) agentStat {
	if t >= len(s.Turns) {
		return agentStat{ckptStat: ckptMedian(nil), tokens: "—"}
	}
	var ss []ckptSample
	var sizes []int
	for _, x := range s.Turns[t] {
		ss = append(ss, x.ckptSample)
		if !slices.Contains(sizes, x.PromptTokens) {
			sizes = append(sizes, x.PromptTokens)
		}
	}
	st := agentStat{ckptStat: ckptMedian(ss), tokens: "—"}
	if len(sizes) > 0 {
		st.tokens = joinInts(sizes)
	}
	return st
}
