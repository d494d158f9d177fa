package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

func TestFitStateAndTokensFor(t *testing.T) {
	// 8 layers × K and V × 256 dims × 2 bytes: the CPU run's model.
	const per, fixed = 8192, 100
	m, err := fitState(probeA, fixed+probeA*per, probeB, fixed+probeB*per)
	if err != nil {
		t.Fatal(err)
	}
	if m.PerToken != per || m.Fixed != fixed {
		t.Fatalf("%+v, want %d a token and %d fixed", m, per, fixed)
	}
	// (50e6 − 100) / 8192 = 6103.5: the fewest tokens that reach 50 MB.
	if n := m.tokensFor(50_000_000); n != 6104 {
		t.Errorf("tokensFor(50 MB) = %d, want 6104", n)
	}
	if n := m.tokensFor(fixed + 3*per); n != 3 {
		t.Errorf("an exact multiple: %d tokens, want 3", n)
	}
	if n := m.tokensFor(10); n != 1 {
		t.Errorf("less than the fixed part: %d tokens, want 1", n)
	}
	if _, err := fitState(64, 1000, 192, 1000); err == nil {
		t.Error("a state that does not grow was accepted")
	}
	if _, err := fitState(192, 1000, 64, 2000); err == nil {
		t.Error("points out of order were accepted")
	}
}

func TestStateNCtx(t *testing.T) {
	// Slot 0's 6,104 tokens and 3 streams of 672 cells: 8,120, rounded up.
	if got := stateNCtx(6104, 3, 672); got != 8192 {
		t.Errorf("n_ctx %d, want 8192", got)
	}
	if got := stateNCtx(256, 0, 0); got != 256 {
		t.Errorf("n_ctx %d, want 256: a multiple stays", got)
	}
}

func TestStateOrderAlternates(t *testing.T) {
	if got := stateOrder(2); !slices.Equal(got, []bool{false, true, true, false}) {
		t.Errorf("2 pairs: %v, want without, with, with, without", got)
	}
	got := stateOrder(3)
	if !slices.Equal(got, []bool{false, true, true, false, false, true}) {
		t.Errorf("3 pairs: %v", got)
	}
	with := 0
	for _, w := range got {
		if w {
			with++
		}
	}
	if with != 3 {
		t.Errorf("%d rounds with the loop of 6, want 3", with)
	}
}

func TestFillTokens(t *testing.T) {
	if got := fillTokens([]int32{1, 10, 11, 12}, 8); !slices.Equal(got, []int32{1, 10, 11, 12, 10, 11, 12, 10}) {
		t.Errorf("got %v: BOS once, then the rest of base over and over", got)
	}
	if got := fillTokens([]int32{1}, 3); !slices.Equal(got, []int32{1, 1, 1}) {
		t.Errorf("got %v", got)
	}
}

func TestTokenPayload(t *testing.T) {
	got := tokenPayload([]int32{1, 0x01020304})
	if want := []byte{1, 0, 0, 0, 4, 3, 2, 1}; !bytes.Equal(got, want) {
		t.Errorf("% x, want % x", got, want)
	}
}

func TestParseStateFlags(t *testing.T) {
	o, err := parseFlags([]string{"-model", "m", "-n", "64", "-state-get-bytes", "50000000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.stateBytes != 50_000_000 || o.stateN != 64 || o.stateC != 8 || o.stateReps != 2 {
		t.Errorf("%+v: -state-get-n defaults to -n", o)
	}
	for _, bad := range [][]string{
		{"-model", "m", "-state-get-bytes", "-1"},
		{"-model", "m", "-state-get-bytes", "1000", "-systems", "ollama"},
		{"-model", "m", "-state-get-bytes", "1000", "-state-get-c", "1"},
		{"-model", "m", "-state-get-bytes", "1000", "-state-get-reps", "0"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"-model", "m", "-systems", "ollama", "-state-get-c", "1"}, io.Discard); err != nil {
		t.Errorf("the state flags are checked only when it is on: %v", err)
	}
}

// stateRoundOf is a round of streams of tokens each, the first token at
// first and the last at last.
func stateRoundOf(with bool, streams, tokens int, first, last time.Duration) stateRound {
	rd := round{C: streams}
	for range streams {
		rd.Samples = append(rd.Samples, sampleOf(0, first, last, tokens, "x"))
	}
	return stateRound{WithGet: with, Round: rd, Window: last}
}

func TestStateSummary(t *testing.T) {
	s := time.Second
	r := &stateGetRun{Reps: 2}
	// Without: 2 streams × 100 tokens over 1 s and over 2 s: 200 and 100 tok/s.
	// With: 150 and 130 tok/s (2 s windows): mean 140, ratio 140/150.
	a := stateRoundOf(false, 2, 100, s/10, s)
	b := stateRoundOf(true, 2, 150, s/10, 2*s)
	b.GetBytes = 8e9 // 4 GB/s over 2 s
	b.Transfers = []transfer{{Start: -s / 10, End: s, Bytes: 4e9}, {Start: s, End: 2*s + s/10, Bytes: 4e9}, {Start: 3 * s, End: 4 * s}}
	c := stateRoundOf(true, 2, 130, s/10, 2*s)
	c.GetBytes = 4e9 // 2 GB/s
	d := stateRoundOf(false, 2, 100, s/10, 2*s)
	r.Rounds = []stateRound{a, b, c, d}
	for i := range r.Rounds {
		r.Rounds[i].summarise()
	}
	if r.Rounds[1].Overlap != 2 || float64(r.Rounds[1].GetGBps) != 4 {
		t.Errorf("round 2: %d transfers at %v GB/s, want the 2 that overlap it at 4", r.Rounds[1].Overlap, r.Rounds[1].GetGBps)
	}
	if !math.IsNaN(float64(r.Rounds[0].GetGBps)) {
		t.Errorf("a round without the loop has no GB/s: %v", r.Rounds[0].GetGBps)
	}
	r.Alone = []transfer{{End: s, Bytes: 5e9}, {End: s, Bytes: 6e9}, {End: s, Bytes: 7e9}}
	r.summarise()
	u := r.Sum
	if u.AggWithout != 150 || u.AggWith != 140 {
		t.Errorf("aggregates %v and %v, want means 150 and 140", u.AggWithout, u.AggWith)
	}
	if math.Abs(float64(u.Ratio)-140.0/150) > 1e-12 || !u.Met {
		t.Errorf("ratio %v met %v, want 0.93 and met", u.Ratio, u.Met)
	}
	if float64(u.GBpsRounds) != 3 || u.TransfersRounds != 2 {
		t.Errorf("rounds %v GB/s over %d transfers, want 12 GB in 4 s = 3 and 2", u.GBpsRounds, u.TransfersRounds)
	}
	if u.GBpsAlone != 6 || u.AloneN != 3 {
		t.Errorf("alone %v GB/s over %d, want the median 6 of 3", u.GBpsAlone, u.AloneN)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("the raw figures do not marshal (NaN must be null): %v", err)
	}
}

func TestWriteStateGet(t *testing.T) {
	r := testReport(t)
	s := &stateGetRun{Bytes: 50_000_000, Slots: 4, Streams: 3, N: 64, Reps: 1, NCtx: 8192, PerStream: 672,
		Model: stateModel{Fixed: 100, PerToken: 8192}, Tokens: 6104, NPast: 6104, StateSize: 50_003_968, BlobBytes: 50_028_394,
		PrefillMS: 2500, Settings: []string{"hydra-engine --slots 4"}}
	a := stateRoundOf(false, 3, 64, 0, time.Second)
	b := stateRoundOf(true, 3, 48, 0, time.Second)
	b.GetBytes = 1.5e9
	b.Transfers = []transfer{{Start: 0, End: time.Second}}
	s.Rounds = []stateRound{a, b}
	for i := range s.Rounds {
		s.Rounds[i].summarise()
	}
	s.Alone = []transfer{{End: time.Second, Bytes: 2e9}}
	s.summarise()
	r.StateGet = s
	r.Plan.state = []prompt{{Tokens: make([]int32, 510)}, {Tokens: make([]int32, 515)}}
	var buf bytes.Buffer
	r.markdown(&buf)
	md := buf.String()
	for _, want := range []string{
		"## Decode beside a state transfer",
		"`--slots 4`, `n_ctx=8192`",
		"Slot 0 holds 6104 tokens",
		"8192 bytes a token and 100 bytes besides",
		"a fresh prompt of 510–515 tokens",
		"| aggregate tok/s | 192.0 | 144.0 | **0.75** (target ≥ 0.80: not met) |",
		"| STATE_GET GB/s | 2.000 alone (1 transfers, nothing decoding) | 1.500 (1 transfers in the rounds) | 0.750 |",
		"| 1 | off | 192.0 |",
		"| 2 | on | 144.0 |",
		"| 1 | 1.500 | 0 |",
		"- engine: `hydra-engine --slots 4`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("page lacks %q\n%s", want, md)
		}
	}
	if i, j := strings.Index(md, "## Decode beside"), strings.Index(md, "## How it was measured"); i < 0 || j < i {
		t.Error("the section must come before the method")
	}
	r.StateGet = &stateGetRun{Bytes: 1, Slots: 2, Streams: 1}
	buf.Reset()
	r.markdown(&buf)
	if !strings.Contains(buf.String(), "Not measured: it failed") {
		t.Error("a failed measurement must say so")
	}
}

// fakeEngine answers Hydra RPC on conn as the engine would for slot 0: a
// STATE_GET with meta n_past and payload bytes, a PREFILL of raw tokens with
// n_past = their count and state_size = 10 a token.
func fakeEngine(t *testing.T, conn net.Conn, nPast, payload int) {
	t.Helper()
	go func() {
		defer conn.Close()
		chunk := make([]byte, 64<<10)
		for {
			h, err := transport.ReadRequestHeader(conn)
			if err != nil {
				return
			}
			if _, _, err := transport.ReadKeyTrace(conn, h); err != nil {
				return
			}
			body := make([]byte, h.PayloadLen)
			if _, err := io.ReadFull(conn, body); err != nil {
				return
			}
			n, size := nPast, payload
			if h.Op == transport.OpStatePut { // restored: no payload back
				size = 0
			}
			if h.Op == transport.OpPrefill {
				n = len(body) / 4
				if n > 0 && !bytes.Equal(body[:4], []byte{1, 0, 0, 0}) {
					n = -1 // not the tokens sent
				}
				size = 10 * n
			}
			meta := fmt.Appendf(nil, `{"n_past":%d,"state_size":%d}`, n, size)
			if transport.WriteResponseHeader(conn, transport.StatusOK, meta, uint64(size)) != nil {
				return
			}
			for left := size; left > 0; left -= min(left, len(chunk)) {
				if _, err := conn.Write(chunk[:min(left, len(chunk))]); err != nil {
					return
				}
			}
		}
	}()
}

func TestGetLoopAndPrefill(t *testing.T) {
	srv, cli := net.Pipe()
	fakeEngine(t, srv, 7, 1<<20)
	c := transport.NewClient(cli)
	defer c.Close()
	ctx := context.Background()
	m, n, err := rpcStream(ctx, c, transport.OpPrefill, "0", tokenPayload([]int32{1, 2, 3}), io.Discard)
	if err != nil || m.NPast != 3 || m.StateSize != 30 || n != 30 {
		t.Fatalf("prefill: %+v, %d bytes, %v", m, n, err)
	}
	l := startGetLoop(ctx, func(cnt *counter, base time.Time) (transfer, error) { return stateGet(ctx, c, cnt, 7, base) })
	if err := l.started(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	got := l.received()
	if err := l.finish(); err != nil {
		t.Fatal(err)
	}
	xs := l.transfers(l.base)
	if len(xs) == 0 || got == 0 || l.received() != int64(len(xs))<<20 {
		t.Fatalf("%d transfers, %d bytes at the check, %d in all", len(xs), got, l.received())
	}
	for _, x := range xs {
		if x.Bytes != 1<<20 || x.End < x.Start {
			t.Errorf("transfer %+v", x)
		}
	}
	// The client is in step after the loop: the next request works.
	if _, err := stateGet(ctx, c, io.Discard, 7, time.Now()); err != nil {
		t.Errorf("a STATE_GET after the loop: %v", err)
	}
}

func TestGetLoopStopsOnAnotherSequence(t *testing.T) {
	srv, cli := net.Pipe()
	fakeEngine(t, srv, 9, 100)
	c := transport.NewClient(cli)
	defer c.Close()
	l := startGetLoop(context.Background(), func(cnt *counter, base time.Time) (transfer, error) {
		return stateGet(context.Background(), c, cnt, 7, base)
	})
	// The first bytes may come before the loop ends on the reply's n_past.
	err := l.started()
	if err == nil {
		err = l.finish()
	}
	if err == nil || !strings.Contains(err.Error(), "n_past 9, not the 7") {
		t.Errorf("got %v, want slot 0's sequence reported changed", err)
	}
}

// TestPutLoop: the STATE_PUT loop sends the blob over and over, counting
// its bytes as they go, and stops between transfers; a reply naming
// another sequence ends it with an error.
func TestPutLoop(t *testing.T) {
	srv, cli := net.Pipe()
	fakeEngine(t, srv, 7, 1<<20)
	c := transport.NewClient(cli)
	defer c.Close()
	ctx := context.Background()
	blob := make([]byte, 3<<20)
	r := &stateGetRun{Put: true, blob: blob, NPast: 7}
	l := startGetLoop(ctx, func(cnt *counter, base time.Time) (transfer, error) { return r.transfer(ctx, c, cnt, base) })
	if err := l.started(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := l.finish(); err != nil {
		t.Fatal(err)
	}
	xs := l.transfers(l.base)
	if len(xs) == 0 || l.received() != int64(len(xs))*int64(len(blob)) {
		t.Fatalf("%d transfers, %d bytes counted", len(xs), l.received())
	}
	for _, x := range xs {
		if x.Bytes != int64(len(blob)) || x.End < x.Start {
			t.Errorf("transfer %+v", x)
		}
	}
	if r.op() != "STATE_PUT" {
		t.Errorf("op %q", r.op())
	}
	// The client is in step after the loop; a slot holding another
	// sequence is an error.
	r.NPast = 8
	if _, err := r.transfer(ctx, c, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "n_past 7") {
		t.Errorf("a STATE_PUT answered with another n_past: %v", err)
	}
}
