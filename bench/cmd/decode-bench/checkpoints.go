package main

// The context checkpoint measurement (-checkpoint-tokens N,…): one slot
// holds prompt A of N tokens and 4 generated; the next prompt parts from
// that sequence. Ours and llama-server, from the same model file, one after
// the other, answer the same prompts on their native /completion (prompts
// as token ids), whose timings say how many prompt tokens each evaluated
// (prompt_n) and kept (cache_n). On a hybrid model (the nodes' qwen35moe)
// or a sliding window, that count is what context checkpoints decide.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"
)

// ckptMore is the new tokens the cases add after A or its cut.
const ckptMore = 64

// ckptCut is how far before A's end the cut case parts.
const ckptCut = 200

// ckptRun is the measurement at every N.
type ckptRun struct {
	Reps  int        `json:"reps"`
	Sizes []ckptSize `json:"sizes"`
	Cases []string   `json:"cases"`
}

// ckptSize is one N's prompts on each system.
type ckptSize struct {
	Tokens  int          `json:"prompt_tokens"`
	NCtx    int          `json:"n_ctx"`
	Systems []ckptSystem `json:"systems"` // ours, then llama-server
}

// oneServer is a server a one-slot measurement ran: its name, command
// lines and what failed.
type oneServer struct {
	Name     string   `json:"name"`
	Settings []string `json:"settings"`
	Err      string   `json:"error,omitempty"`
}

func (s oneServer) server() oneServer { return s }

// serversOf indexes a measurement's systems by name and lists their
// servers.
func serversOf[S interface{ server() oneServer }](systems []S) (map[string]S, []oneServer) {
	byName := map[string]S{}
	var servers []oneServer
	for _, s := range systems {
		byName[s.server().Name] = s
		servers = append(servers, s.server())
	}
	return byName, servers
}

// writeSettings lists the servers' command lines under a table.
func writeSettings(p func(string, ...any), servers []oneServer) {
	for _, s := range servers {
		for _, st := range s.Settings {
			p("- %s: `%s`", s.Name, st)
		}
	}
	p("")
}

// ckptSystem is one server's answers.
type ckptSystem struct {
	oneServer
	Cases map[string][]ckptSample `json:"cases"` // by case, one a rep
}

// ckptSample is one request's figures.
type ckptSample struct {
	PromptN  int     `json:"prompt_n"` // prompt tokens evaluated
	CacheN   int     `json:"cache_n"`  // prompt tokens kept from the slot
	PromptMS float64 `json:"prompt_ms"`
	WallMS   float64 `json:"wall_ms"` // the request, sent to answered (one token generated)
}

// ckptCases are the prompts that follow A: A and 64 new tokens; A again;
// A cut 200 tokens before its end and 64 new ones.
func ckptCases(a, more []int32) []struct {
	name   string
	prompt []int32
} {
	return []struct {
		name   string
		prompt []int32
	}{
		{"A + 64 new tokens", slices.Concat(a, more)},
		{"A again", a},
		{fmt.Sprintf("A cut %d before its end + 64 new", ckptCut), slices.Concat(a[:len(a)-ckptCut], more)},
	}
}

func measureCheckpoints(ctx context.Context, o options, rep *report) *ckptRun {
	r := &ckptRun{Reps: o.ckptReps}
	tk := tokenizer{bin: o.llamaBatched, model: o.model, dir: o.work}
	for _, n := range o.ckptTokens {
		ps, err := tk.prompts(ctx, []int{9001, 9002}, n)
		if err != nil {
			rep.fail(fmt.Sprintf("checkpoints %d", n), err, "")
			continue
		}
		a, more := ps[0].Tokens, ps[1].Tokens[1:1+ckptMore] // BOS once, at A's start
		size := ckptSize{Tokens: len(a), NCtx: (len(a) + ckptMore + 256 + 255) / 256 * 256}
		cases := ckptCases(a, more)
		r.Cases = nil
		for _, c := range cases {
			r.Cases = append(r.Cases, c.name)
		}
		for _, sys := range []string{"ours", "llama-server"} {
			if !o.has(sys) && len(o.systems) > 0 {
				continue
			}
			logf("checkpoints: %s, a slot holds %d tokens and 4 generated; the next prompt parts from it", sys, len(a))
			s := runCkptSystem(ctx, o, sys, size.NCtx, a, cases)
			if s.Err != "" {
				rep.fail(fmt.Sprintf("checkpoints %d %s", n, sys), fmt.Errorf("%s", s.Err), "")
			}
			size.Systems = append(size.Systems, s)
		}
		r.Sizes = append(r.Sizes, size)
	}
	return r
}

// runCkptSystem starts one server of one slot, then, each rep and case,
// sends A (4 tokens generated) and the case (1 token), and stops it.
func runCkptSystem(ctx context.Context, o options, sys string, nCtx int, a []int32, cases []struct {
	name   string
	prompt []int32
}) ckptSystem {
	out := ckptSystem{Cases: map[string][]ckptSample{}}
	out.oneServer = withOneSlot(ctx, o, sys, nCtx, "ours-checkpoints.log", func(base string, hc *http.Client) error {
		for rep := range o.ckptReps {
			for _, c := range cases {
				if _, err := completeNative(ctx, hc, base, a, 4); err != nil {
					return fmt.Errorf("rep %d, A: %w", rep, err)
				}
				s, err := completeNative(ctx, hc, base, c.prompt, 1)
				if err != nil {
					return fmt.Errorf("rep %d, %s: %w", rep, c.name, err)
				}
				out.Cases[c.name] = append(out.Cases[c.name], s)
				logf("  %s: evaluated %d, kept %d, prompt %.1f ms, request %.1f ms", c.name, s.PromptN, s.CacheN, s.PromptMS, s.WallMS)
			}
		}
		return nil
	})
	return out
}

// completeNative sends prompt to llama-server's /completion (ours serves
// it too) for n greedy tokens and reads its timings.
func completeNative(ctx context.Context, hc *http.Client, base string, prompt []int32, n int) (ckptSample, error) {
	s, _, err := postTimings(ctx, hc, base+"/completion", map[string]any{"prompt": prompt, "n_predict": n, "temperature": 0,
		"seed": seed, "cache_prompt": true, "id_slot": 0})
	return s, err
}

// postTimings posts body as JSON to url and reads the reply's timings
// (llama-server's: prompt_n evaluated, cache_n kept) and, where it has
// one, its usage's prompt_tokens; the request's time is sent to answered.
// A reply without prompt_n is refused, not counted as 0.
func postTimings(ctx context.Context, hc *http.Client, url string, body any) (ckptSample, int, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		return ckptSample{}, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return ckptSample{}, 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	wall := time.Since(start)
	if err != nil {
		return ckptSample{}, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return ckptSample{}, 0, fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, raw)
	}
	var r struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Timings struct {
			PromptN  *int    `json:"prompt_n"`
			CacheN   int     `json:"cache_n"`
			PromptMS float64 `json:"prompt_ms"`
		} `json:"timings"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Timings.PromptN == nil {
		return ckptSample{}, 0, fmt.Errorf("no timings.prompt_n in %.300s (%v)", raw, err)
	}
	return ckptSample{PromptN: *r.Timings.PromptN, CacheN: r.Timings.CacheN, PromptMS: r.Timings.PromptMS,
		WallMS: float64(wall.Microseconds()) / 1000}, r.Usage.PromptTokens, nil
}

// startOneSlot starts ours (with its prompt cache, as llama-server's
// default) or llama-server with one slot of nCtx cells, ours logging to log.
func startOneSlot(ctx context.Context, o options, sys string, nCtx int, log string) (server, error) {
	if sys == "ours" {
		return startOurs(ctx, o, oursRaw, engineLayout{slots: 1, nCtx: nCtx, log: log, opts: []string{"cache_ram=8192"}})
	}
	lo := o
	lo.slots, lo.ctx = 1, nCtx
	return startLlamaServer(ctx, lo, oursRaw)
}

// withOneSlot starts ours or llama-server with one slot of nCtx cells
// (startOneSlot), runs measure against it, and stops it: the server's
// record, with what failed and the server's log tail.
func withOneSlot(ctx context.Context, o options, sys string, nCtx int, log string, measure func(base string, hc *http.Client) error) oneServer {
	out := oneServer{Name: sys}
	srv, err := startOneSlot(ctx, o, sys, nCtx, log)
	if err != nil {
		out.Err = err.Error()
		return out
	}
	out.Settings = srv.settings()
	err = measure(srv.endpoint().base, srv.endpoint().http)
	logs := srv.logTail()
	if serr := srv.stop(); serr != nil && err == nil && ctx.Err() == nil {
		err = fmt.Errorf("stopping: %w", serr)
	}
	if err != nil {
		out.Err = fmt.Sprintf("%v\n--- log tail ---\n%s", err, logs)
	}
	return out
}

// writeCheckpoints is the page's section on context checkpoints: each
// case's prompt tokens evaluated and times, ours beside llama-server.
func (r *report) writeCheckpoints(p func(string, ...any)) {
	c := r.Checkpoints
	if c == nil {
		return
	}
	p("## A prompt that parts from the slot's sequence: context checkpoints")
	p("")
	p("One slot (`--slots 1`, llama-server `-np 1`), the same model file. Each rep and case: prompt A of N tokens, 4 generated; then the case's prompt, 1 generated. "+
		"Prompts as token ids to the native `/completion`; its `timings`: `prompt_n` (prompt tokens evaluated), `prompt_ms`; request: sent to answered. Medians over %d reps.", c.Reps)
	p("")
	for _, sz := range c.Sizes {
		p("N = %d (`n_ctx` %d):", sz.Tokens, sz.NCtx)
		p("")
		p("| case | llama-server evaluates | ours evaluates | llama-server prompt ms | ours prompt ms | llama-server request ms | ours request ms | ours ÷ llama-server (request) |")
		p("|---|---|---|---|---|---|---|---|")
		sys, servers := serversOf(sz.Systems)
		for _, name := range c.Cases {
			o, l := ckptMedian(sys["ours"].Cases[name]), ckptMedian(sys["llama-server"].Cases[name])
			p("| %s | %s | %s | %s | %s | %s | %s | %s |", name, l.n, o.n, fcell(l.prompt, 1), fcell(o.prompt, 1), fcell(l.wall, 1), fcell(o.wall, 1), fratio(o.wall, l.wall))
		}
		p("")
		writeSettings(p, servers)
	}
}

// ckptStat is a case's medians on one system; n is the evaluated counts
// seen ("4", or "4, 5" where reps differ).
type ckptStat struct {
	n            string
	prompt, wall fnum
}

func ckptMedian(ss []ckptSample) ckptStat {
	if len(ss) == 0 {
		return ckptStat{n: "—", prompt: fnum(math.NaN()), wall: fnum(math.NaN())}
	}
	var ns []int
	var pm, wm []float64
	for _, s := range ss {
		if !slices.Contains(ns, s.PromptN) {
			ns = append(ns, s.PromptN)
		}
		pm, wm = append(pm, s.PromptMS), append(wm, s.WallMS)
	}
	n := ""
	for i, v := range ns {
		if i > 0 {
			n += ", "
		}
		n += fmt.Sprint(v)
	}
	return ckptStat{n: n, prompt: fnum(median(pm)), wall: fnum(median(wm))}
}
