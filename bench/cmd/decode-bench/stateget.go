package main

// Decode beside a state transfer (issue 26): while a STATE_GET of slot 0
// streams about -state-get-bytes of KV state, do the other slots' streams
// keep at least 0.8 of the aggregate tokens/s they have without it? Ours
// only: no other system here speaks Hydra RPC.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// stateTarget is issue 26's bar for the aggregate with the transfers ÷ without.
const stateTarget = 0.8

// probeA and probeB are the two PREFILLs whose state sizes give the
// backend's bytes per token and its fixed part (a state has a header, so one
// PREFILL's state_size ÷ n_past would overstate the per-token size).
const probeA, probeB = 64, 192

// probeCtx is the probe engine's n_ctx: room for probeB and nothing else.
const probeCtx = 512

// aloneTransfers is how many STATE_GETs are timed with nothing decoding,
// before the rounds and again after them, so that both ends of the run count.
const aloneTransfers = 3

// streamMargin is the KV cells each stream gets beyond its prompt and its n
// tokens: a chat template's tokens, the rounding of "about -p tokens".
const streamMargin = 32

// stateGetRun is everything the measurement did and measured; times of
// transfers in a round are from that round's start.
type stateGetRun struct {
	Bytes     int64      `json:"target_state_bytes"` // -state-get-bytes
	Slots     int        `json:"slots"`              // the engine's --slots: slot 0 and one a stream
	Streams   int        `json:"streams"`
	N         int        `json:"n"` // tokens each stream generates
	Reps      int        `json:"reps"`
	NCtx      int        `json:"n_ctx"`
	PerStream int        `json:"cells_per_stream"` // KV cells n_ctx holds for each stream
	Model     stateModel `json:"state_model"`      // from the probe engine's two PREFILLs
	Tokens    int        `json:"tokens"`           // slot 0's sequence as sent
	NPast     int        `json:"n_past"`           // as the engine counted it
	StateSize int64      `json:"state_size"`       // the PREFILL reply's meta
	BlobBytes int64      `json:"state_get_bytes"`  // a STATE_GET's payload: wrapper and state
	PrefillMS float64    `json:"prefill_ms"`
	ChunkSize int64      `json:"state_chunk_size"` // INFO's: the pieces a STATE_GET streams in
	Settings  []string   `json:"settings"`
	// Put: the loop STATE_PUTs blob (one STATE_GET's bytes) into slot 0
	// instead of getting its state (-state-put).
	Put    bool `json:"state_put"`
	blob   []byte
	Alone  []transfer   `json:"alone"` // transfers with nothing decoding
	Rounds []stateRound `json:"rounds"`
	Sum    stateSummary `json:"summary"`
}

// transfer is one STATE_GET: when it was sent, when its last byte came, and
// its payload bytes.
type transfer struct {
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
	Bytes int64         `json:"bytes"`
}

func (t transfer) gbps() float64 {
	d := (t.End - t.Start).Seconds()
	if d <= 0 {
		return math.NaN()
	}
	return float64(t.Bytes) / d / 1e9
}

// stateRound is one round of streams, with or without the STATE_GET loop.
type stateRound struct {
	WithGet   bool          `json:"with_state_get"`
	Round     round         `json:"round"`
	Window    time.Duration `json:"window_ns"`       // the round's start to its last stream's end
	GetBytes  int64         `json:"state_get_bytes"` // received during the window
	Transfers []transfer    `json:"transfers,omitempty"`
	Agg       fnum          `json:"aggregate_tps"` // as the Throughput table: prefill included
	Stream    fnum          `json:"stream_tps"`    // median of the streams' decode rates
	TTFT50    fnum          `json:"ttft_p50_ms"`
	GetGBps   fnum          `json:"state_get_gbps"` // GetBytes ÷ Window
	Overlap   int           `json:"state_gets"`     // transfers that overlap the window
	Errors    int           `json:"errors"`
}

// stateSummary compares the kinds of rounds. Aggregates are means over
// rounds (the alternation cancels a steady drift in a mean, not in a
// median); rates and TTFTs medians over the streams of all rounds of a kind.
type stateSummary struct {
	AggWithout      fnum `json:"aggregate_tps_without"`
	AggWith         fnum `json:"aggregate_tps_with"`
	Ratio           fnum `json:"ratio"`
	Met             bool `json:"target_met"`
	StreamWithout   fnum `json:"stream_tps_without"`
	StreamWith      fnum `json:"stream_tps_with"`
	TTFTWithout     fnum `json:"ttft_p50_ms_without"`
	TTFTWith        fnum `json:"ttft_p50_ms_with"`
	GBpsRounds      fnum `json:"state_get_gbps_rounds"` // all with-rounds' bytes ÷ their windows
	TransfersRounds int  `json:"state_gets_rounds"`
	GBpsAlone       fnum `json:"state_get_gbps_alone"` // median of the lone transfers
	AloneN          int  `json:"state_gets_alone"`
}

// fnum is a float64 that goes into JSON as null where it is not a number
// (a median of nothing): encoding/json refuses NaN, and one missing figure
// must not cost the whole raw file.
type fnum float64

func (f fnum) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(f))
}

// measureStateGet learns the backend's state size per token on an engine of
// its own, then starts the measurement's engine with room for slot 0's
// sequence and the streams, and runs the rounds; a failure is recorded in the
// report with the engine's log.
func measureStateGet(ctx context.Context, o options, pl plan, rep *report) *stateGetRun {
	r := &stateGetRun{Bytes: o.stateBytes, Slots: o.stateC, Streams: o.stateC - 1, N: o.stateN, Reps: o.stateReps, Put: o.statePut}
	logf("state-get: slot 0 with about %.3f GB of state, %d streams beside its %ss", float64(o.stateBytes)/1e9, r.Streams, r.op())
	ap := oursAPI(o)
	m, logs, err := probeState(ctx, o, ap, pl.warm.Tokens)
	if err != nil {
		rep.fail("state-get", fmt.Errorf("probing the state size: %w", err), logs)
		return r
	}
	r.Model, r.Tokens = m, m.tokensFor(o.stateBytes)
	r.PerStream = longest(pl.state) + r.N + streamMargin
	r.NCtx = stateNCtx(r.Tokens, r.Streams, r.PerStream)
	logf("  %.0f bytes a token and %d besides: %d tokens in slot 0; n_ctx %d", m.PerToken, m.Fixed, r.Tokens, r.NCtx)
	srv, err := startOurs(ctx, o, ap, engineLayout{slots: r.Slots, nCtx: r.NCtx, log: "ours-state.log"})
	if err != nil {
		rep.fail("state-get", err, "")
		return r
	}
	r.Settings = srv.settings()
	err = r.run(ctx, srv, pl)
	logs = srv.logTail()
	if serr := srv.stop(); serr != nil && err == nil && ctx.Err() == nil {
		err = fmt.Errorf("stopping: %w", serr)
	}
	r.summarise()
	if err != nil {
		rep.fail("state-get", err, logs)
		return r
	}
	s := r.Sum
	logf("  aggregate without %.1f tok/s, with %.1f: %.2f (target ≥ %.2f); %s %.2f GB/s in the rounds (%d), %.2f alone",
		s.AggWithout, s.AggWith, s.Ratio, stateTarget, r.op(), s.GBpsRounds, s.TransfersRounds, s.GBpsAlone)
	return r
}

// op names the loop's transfers.
func (r *stateGetRun) op() string {
	if r.Put {
		return "STATE_PUT"
	}
	return "STATE_GET"
}

// transfer is one of the loop's transfers, timed from base, its bytes
// counted into cnt (nil: not counted) as they go.
func (r *stateGetRun) transfer(ctx context.Context, c *transport.Client, cnt *counter, base time.Time) (transfer, error) {
	if r.Put {
		return statePut(ctx, c, r.blob, cnt, r.NPast, base)
	}
	var w io.Writer = io.Discard
	if cnt != nil {
		w = cnt
	}
	return stateGet(ctx, c, w, r.NPast, base)
}

// probeState starts an engine of one slot, PREFILLs probeA and then probeB
// tokens into slot 0 and fits the line through their state sizes.
func probeState(ctx context.Context, o options, ap api, base []int32) (stateModel, string, error) {
	srv, err := startOurs(ctx, o, ap, engineLayout{slots: 1, nCtx: probeCtx, log: "ours-probe.log"})
	if err != nil {
		return stateModel{}, "", err
	}
	m, err := func() (stateModel, error) {
		c, err := transport.DialClient(ctx, srv.e.Unix)
		if err != nil {
			return stateModel{}, err
		}
		defer c.Close()
		toks := fillTokens(base, probeB)
		a, _, err := rpcStream(ctx, c, transport.OpPrefill, "0", tokenPayload(toks[:probeA]), io.Discard)
		if err != nil {
			return stateModel{}, err
		}
		b, _, err := rpcStream(ctx, c, transport.OpPrefill, "0", tokenPayload(toks), io.Discard)
		if err != nil {
			return stateModel{}, err
		}
		return fitState(a.NPast, a.StateSize, b.NPast, b.StateSize)
	}()
	logs := srv.logTail()
	if serr := srv.stop(); serr != nil && err == nil {
		err = fmt.Errorf("stopping the probe engine: %w", serr)
	}
	return m, logs, err
}

// stateModel is a backend's state size for a sequence of n tokens, Fixed +
// PerToken × n: llama.cpp writes a header, then every layer's K and V rows
// and each cell's position and sequences, all linear in n.
type stateModel struct {
	Fixed    int64   `json:"fixed_bytes"`
	PerToken float64 `json:"bytes_per_token"`
}

// fitState is the line through two (n_past, state_size) points.
func fitState(n1 int, s1 int64, n2 int, s2 int64) (stateModel, error) {
	if n2 <= n1 || s2 <= s1 {
		return stateModel{}, fmt.Errorf("state sizes %d at %d tokens and %d at %d do not grow with the tokens", s1, n1, s2, n2)
	}
	per := float64(s2-s1) / float64(n2-n1)
	return stateModel{Fixed: s1 - int64(math.Round(per*float64(n1))), PerToken: per}, nil
}

// tokensFor is the fewest tokens whose state holds at least bytes.
func (m stateModel) tokensFor(bytes int64) int {
	return max(int(math.Ceil(float64(bytes-m.Fixed)/m.PerToken)), 1)
}

// stateNCtx is the engine's n_ctx: slot 0's tokens and each stream's cells,
// all in one cache the slots share (kv_unified), rounded up to 256.
func stateNCtx(seq, streams, perStream int) int {
	return (seq + streams*perStream + 255) / 256 * 256
}

// oursAPI is how the streams ask our engine for completions (-api).
func oursAPI(o options) api {
	ap := oursRaw
	if o.apiKind == "chat" {
		ap = openAIChat
	}
	if o.banBytes {
		ap = withByteBias(ap)
	}
	return ap
}

func longest(ps []prompt) int {
	n := 0
	for _, p := range ps {
		n = max(n, len(p.Tokens))
	}
	return n
}

// run fills slot 0 over the engine's Unix socket (as a coordinator on the
// same host would reach it), warms the engine, and times lone STATE_GETs
// around the alternating rounds.
func (r *stateGetRun) run(ctx context.Context, srv *ours, pl plan) error {
	c, err := transport.DialClient(ctx, srv.e.Unix)
	if err != nil {
		return err
	}
	defer c.Close()
	m, _, err := rpcStream(ctx, c, transport.OpPrefill, "0", tokenPayload(fillTokens(pl.warm.Tokens, r.Tokens)), io.Discard)
	if err != nil {
		return fmt.Errorf("PREFILL of slot 0: %w", err)
	}
	r.NPast, r.StateSize, r.PrefillMS = m.NPast, m.StateSize, m.PrefillMS
	logf("  slot 0: n_past %d, state_size %d (%.3f GB), prefill %.0f ms", m.NPast, m.StateSize, float64(m.StateSize)/1e9, m.PrefillMS)
	if r.ChunkSize, err = chunkSize(ctx, c, r.NCtx); err != nil {
		return err
	}
	ep := srv.endpoint()
	// Untimed: the first completion and the first STATE_GET warm their paths.
	if s := ep.do(ctx, time.Now(), call{p: pl.stateWarm, n: r.N, slot: -1}, nil); s.Err != "" {
		return fmt.Errorf("warm-up completion: %s", s.Err)
	}
	// A STATE_PUT loop puts back the warm-up's bytes; a STATE_GET loop
	// keeps none of them.
	var blob bytes.Buffer
	var keep io.Writer = io.Discard
	if r.Put {
		keep = &blob
	}
	if _, err := stateGet(ctx, c, keep, r.NPast, time.Now()); err != nil {
		return fmt.Errorf("warm-up STATE_GET: %w", err)
	}
	if r.Put {
		r.blob = blob.Bytes()
		if _, err := r.transfer(ctx, c, nil, time.Now()); err != nil {
			return fmt.Errorf("warm-up STATE_PUT: %w", err)
		}
	}
	if err := r.timeAlone(ctx, c); err != nil {
		return err
	}
	for i, with := range stateOrder(r.Reps) {
		sr, err := r.round(ctx, ep, c, pl.state[i], with)
		r.Rounds = append(r.Rounds, sr)
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		gets := ""
		if with {
			gets = fmt.Sprintf(", %d %ss at %.2f GB/s", sr.Overlap, r.op(), sr.GetGBps)
		}
		logf("  round %d, %s loop %-3s: aggregate %7.1f tok/s, per stream %6.1f%s", i+1, r.op(), onOff(with), sr.Agg, sr.Stream, gets)
	}
	return r.timeAlone(ctx, c)
}

// chunkSize asks INFO for the engine's state_chunk_size, and says so when
// the engine's n_ctx is not the one it was started with (the backend may
// round it).
func chunkSize(ctx context.Context, c *transport.Client, nCtx int) (int64, error) {
	resp, _, err := c.Call(ctx, transport.OpInfo, "0", nil)
	if err != nil {
		return 0, err
	}
	if err := resp.Err(); err != nil {
		return 0, err
	}
	var info struct {
		NCtx      int   `json:"n_ctx"`
		ChunkSize int64 `json:"state_chunk_size"`
	}
	if err := json.Unmarshal(resp.Meta, &info); err != nil {
		return 0, fmt.Errorf("INFO meta: %w", err)
	}
	if info.NCtx != nCtx {
		logf("  note: INFO says n_ctx %d, the engine was started with n_ctx=%d", info.NCtx, nCtx)
	}
	return info.ChunkSize, nil
}

// timeAlone times aloneTransfers of the loop's transfers with nothing
// decoding.
func (r *stateGetRun) timeAlone(ctx context.Context, c *transport.Client) error {
	for range aloneTransfers {
		t, err := r.transfer(ctx, c, nil, time.Now())
		if err != nil {
			return fmt.Errorf("%s alone: %w", r.op(), err)
		}
		r.Alone, r.BlobBytes = append(r.Alone, t), t.Bytes
	}
	return nil
}

// stateOrder is the rounds' kinds, reps pairs of them: without, with; then
// with, without; and so on, so that a drift in the machine's speed over the
// run falls on both kinds alike.
func stateOrder(reps int) []bool {
	out := make([]bool, 0, 2*reps)
	for i := range reps {
		with := i%2 == 1
		out = append(out, with, !with)
	}
	return out
}

// fillTokens is n tokens for slot 0: base's first (BOS), then the rest of
// base over and over, so that the sequence is text of the model's
// vocabulary.
func fillTokens(base []int32, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		switch {
		case i == 0 || len(base) == 1:
			out[i] = base[0]
		default:
			out[i] = base[1+(i-1)%(len(base)-1)]
		}
	}
	return out
}

// round runs the streams once; with the loop, it starts the round once the
// loop's first bytes have come, so that the transfers span the whole round.
func (r *stateGetRun) round(ctx context.Context, ep *endpoint, c *transport.Client, p prompt, with bool) (stateRound, error) {
	sr := stateRound{WithGet: with}
	var lp *getLoop
	if with {
		lp = startGetLoop(ctx, func(cnt *counter, base time.Time) (transfer, error) { return r.transfer(ctx, c, cnt, base) })
		if err := lp.started(); err != nil {
			return sr, fmt.Errorf("%s loop: %w", r.op(), err)
		}
	}
	b0, t0 := lp.received(), time.Now()
	sr.Round = runRound(ctx, ep, r.Streams, call{p: p, n: r.N, slot: -1})
	sr.Window = time.Since(t0)
	if lp != nil {
		sr.GetBytes = lp.received() - b0
		err := lp.finish()
		sr.Transfers = lp.transfers(t0)
		if err != nil {
			sr.summarise()
			return sr, fmt.Errorf("%s loop: %w", r.op(), err)
		}
	}
	sr.summarise()
	if sr.Errors > 0 {
		return sr, fmt.Errorf("%d of %d streams failed, first: %s", sr.Errors, r.Streams, firstErr([]round{sr.Round}))
	}
	return sr, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// summarise computes the round's figures from its samples and transfers.
func (sr *stateRound) summarise() {
	var rates []float64
	for _, s := range sr.Round.Samples {
		if s.Err != "" {
			sr.Errors++
			continue
		}
		rates = append(rates, s.decodeRate())
	}
	sr.Agg, sr.Stream = fnum(sr.Round.aggregate()), fnum(median(rates))
	sr.TTFT50 = fnum(median(ttftsOK(sr.Round.Samples)))
	sr.GetGBps = fnum(math.NaN())
	if sr.WithGet && sr.Window > 0 {
		sr.GetGBps = fnum(float64(sr.GetBytes) / sr.Window.Seconds() / 1e9)
	}
	sr.Overlap = 0
	for _, t := range sr.Transfers {
		if t.End > 0 && t.Start < sr.Window {
			sr.Overlap++
		}
	}
}

// summarise compares the rounds without and with the loop.
func (r *stateGetRun) summarise() {
	var aggs [2][]float64
	var rates, ttfts [2][]float64
	var getBytes int64
	var window time.Duration
	s := stateSummary{}
	for _, sr := range r.Rounds {
		k := 0
		if sr.WithGet {
			k = 1
			getBytes += sr.GetBytes
			window += sr.Window
			s.TransfersRounds += sr.Overlap
		}
		aggs[k] = append(aggs[k], float64(sr.Agg))
		for _, x := range sr.Round.Samples {
			if x.Err == "" {
				rates[k] = append(rates[k], x.decodeRate())
			}
		}
		ttfts[k] = append(ttfts[k], ttftsOK(sr.Round.Samples)...)
	}
	s.AggWithout, s.AggWith = fnum(mean(aggs[0])), fnum(mean(aggs[1]))
	s.Ratio = fnum(float64(s.AggWith) / float64(s.AggWithout))
	s.Met = float64(s.Ratio) >= stateTarget
	s.StreamWithout, s.StreamWith = fnum(median(rates[0])), fnum(median(rates[1]))
	s.TTFTWithout, s.TTFTWith = fnum(median(ttfts[0])), fnum(median(ttfts[1]))
	s.GBpsRounds = fnum(math.NaN())
	if window > 0 {
		s.GBpsRounds = fnum(float64(getBytes) / window.Seconds() / 1e9)
	}
	var alone []float64
	for _, t := range r.Alone {
		alone = append(alone, t.gbps())
	}
	s.GBpsAlone, s.AloneN = fnum(median(alone)), len(alone)
	r.Sum = s
}

// mean is NaN for no values.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// tokenPayload is a PREFILL's raw form: little-endian u32 token ids.
func tokenPayload(toks []int32) []byte {
	b := make([]byte, 0, 4*len(toks))
	for _, t := range toks {
		u := uint32(t)
		b = append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return b
}

// rpcMeta is the part of a PREFILL's or STATE_GET's reply meta the
// measurement reads.
type rpcMeta struct {
	NPast     int     `json:"n_past"`
	StateSize int64   `json:"state_size"`
	PrefillMS float64 `json:"prefill_ms"`
}

// rpcStream sends one request and copies its reply's payload to w as it
// arrives: a state of 1.2 GB is never held in memory.
func rpcStream(ctx context.Context, c *transport.Client, op transport.Op, key string, payload []byte, w io.Writer) (rpcMeta, int64, error) {
	resp, err := c.Do(ctx, transport.Request{Op: op, Key: key, Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		return rpcMeta{}, 0, err
	}
	if err := resp.Err(); err != nil {
		_ = resp.Close()
		return rpcMeta{}, 0, err
	}
	var m rpcMeta
	if err := json.Unmarshal(resp.Meta, &m); err != nil {
		_ = resp.Close()
		return rpcMeta{}, 0, fmt.Errorf("%s reply meta %.200q: %w", op, resp.Meta, err)
	}
	n, err := io.Copy(w, resp.Body) // Body's WriteTo: 1 MiB reads off the socket
	if err == nil && uint64(n) != resp.PayloadLen {
		err = fmt.Errorf("%s: %d of %d payload bytes", op, n, resp.PayloadLen)
	}
	return m, n, err
}

// stateGet is one STATE_GET of slot 0 into w, timed from base; the reply
// must show the sequence slot 0 was filled with (no completion took it).
func stateGet(ctx context.Context, c *transport.Client, w io.Writer, nPast int, base time.Time) (transfer, error) {
	start := time.Since(base)
	m, n, err := rpcStream(ctx, c, transport.OpStateGet, "0", nil, w)
	t := transfer{Start: start, End: time.Since(base), Bytes: n}
	if err == nil && m.NPast != nPast {
		err = fmt.Errorf("slot 0 holds n_past %d, not the %d it was filled with", m.NPast, nPast)
	}
	return t, err
}

// statePut is one STATE_PUT of blob into slot 0, timed from base, the
// bytes counted into cnt (nil: not counted) as the client sends them; the
// reply must show the sequence the blob holds.
func statePut(ctx context.Context, c *transport.Client, blob []byte, cnt *counter, nPast int, base time.Time) (transfer, error) {
	start := time.Since(base)
	var body io.Reader = bytes.NewReader(blob)
	if cnt != nil {
		body = io.TeeReader(body, cnt)
	}
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStatePut, Key: "0", Payload: body, PayloadLen: uint64(len(blob))})
	if err == nil {
		err = resp.Close()
		if rerr := resp.Err(); rerr != nil {
			err = rerr
		}
	}
	t := transfer{Start: start, End: time.Since(base), Bytes: int64(len(blob))}
	if err != nil {
		return t, err
	}
	var m rpcMeta
	if err := json.Unmarshal(resp.Meta, &m); err != nil {
		return t, fmt.Errorf("STATE_PUT reply meta %.200q: %w", resp.Meta, err)
	}
	if m.NPast != nPast {
		return t, fmt.Errorf("slot 0 holds n_past %d after the STATE_PUT, not the %d its state has", m.NPast, nPast)
	}
	return t, nil
}

// getLoop runs the state measurement's transfers one after another over
// one connection until finished, counting their bytes as they go (a
// STATE_GET's as they arrive, a STATE_PUT's as they are sent). It ends a
// transfer before it stops: one cut short would break the connection and
// leave the engine a failed transfer to clean up.
type getLoop struct {
	cnt  *counter
	base time.Time
	stop atomic.Bool
	done chan struct{}
	xs   []transfer // the loop's; read after done
	err  error      // likewise
}

func startGetLoop(ctx context.Context, xfer func(cnt *counter, base time.Time) (transfer, error)) *getLoop {
	l := &getLoop{cnt: &counter{first: make(chan struct{})}, base: time.Now(), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for !l.stop.Load() && ctx.Err() == nil {
			t, err := xfer(l.cnt, l.base)
			l.xs = append(l.xs, t)
			if err != nil {
				l.err = err
				return
			}
		}
	}()
	return l
}

// started waits for the loop's first bytes, or its end.
func (l *getLoop) started() error {
	select {
	case <-l.cnt.first:
		return nil
	case <-l.done:
		if l.err != nil {
			return l.err
		}
		return fmt.Errorf("ended before its first bytes")
	}
}

// received is the bytes so far; 0 for no loop.
func (l *getLoop) received() int64 {
	if l == nil {
		return 0
	}
	return l.cnt.n.Load()
}

// finish lets the transfer under way end and stops the loop.
func (l *getLoop) finish() error {
	l.stop.Store(true)
	<-l.done
	return l.err
}

// transfers are the loop's transfers, timed from t0.
func (l *getLoop) transfers(t0 time.Time) []transfer {
	shift := t0.Sub(l.base)
	out := make([]transfer, len(l.xs))
	for i, t := range l.xs {
		out[i] = transfer{Start: t.Start - shift, End: t.End - shift, Bytes: t.Bytes}
	}
	return out
}

// counter discards what is written to it, counting the bytes, and closes
// first at the first of them.
type counter struct {
	n     atomic.Int64
	first chan struct{}
	once  sync.Once
}

func (c *counter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	c.once.Do(func() { close(c.first) })
	return len(p), nil
}
