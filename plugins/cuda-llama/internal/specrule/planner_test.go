package specrule

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// device is a fake GPU: a step of b tokens, drafting of depth d, and the
// rollbacks of a hybrid target cost what its functions say.
type device struct {
	step     func(b int) time.Duration
	draft    func(depth int) time.Duration
	save     time.Duration // per drafting decoder
	replay   time.Duration // per decoder with a rejected draft
	rollback bool
	// catchUp is the draft model's evaluation of a token it has not seen;
	// every request steps a slot takes a new prompt of prompt tokens,
	// which the draft model has not seen (0: never).
	catchUp         time.Duration
	request, prompt int
	// drift slows every step and drafting by this fraction a step: the
	// context grows as the slots decode.
	drift float64
}

// flat is a device on which a step costs the same up to 16 tokens, then
// grows with them: a memory-bound decode step.
func flat(b int) time.Duration {
	return 10*time.Millisecond + time.Duration(max(b-16, 0))*500*time.Microsecond
}

// linear is a device on which every token costs: a compute-bound step (a
// CPU, or a MoE whose tokens each read their own experts).
func linear(b int) time.Duration { return time.Duration(b) * 2 * time.Millisecond }

// run plays steps steps of decoders slots, each of whose draft tokens is
// accepted with probability accept[slot], and returns the tokens a second
// and the rule's status. A nil planner decodes without drafts. With new
// prompts (request), the first request is a warm-up, not counted: the
// rule's first drafts measure what the draft model's catch-up costs, once
// in an engine's life.
func (dev device) run(t *testing.T, p *Planner, accept []float64, steps int) (float64, Status) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	n := len(accept)
	accs := make([]Acceptance, n)
	ds := make([]Decoder, n)
	lens := make([]int, n)
	behind := make([]int, n)
	var elapsed time.Duration
	tokens := 0
	for step := range steps {
		for i := range ds {
			if dev.request > 0 && step%dev.request == 0 {
				behind[i] = dev.prompt
			}
			ds[i] = Decoder{Acc: &accs[i], Max: 64, Behind: behind[i]}
		}
		clear(lens)
		if p != nil {
			p.Plan(ds, lens)
		}
		s := Step{Tokens: n}
		for i, k := range lens {
			if k == 0 {
				continue
			}
			s.Tokens += k
			s.Depth = max(s.Depth, k)
			s.Drafting++
			s.CatchUpTokens += behind[i]
			behind[i] = 0
		}
		slow := func(d time.Duration) time.Duration { return time.Duration(float64(d) * (1 + dev.drift*float64(step))) }
		if s.Depth > 0 {
			s.CatchUp = dev.catchUp * time.Duration(s.CatchUpTokens)
			s.Draft = slow(dev.draft(s.Depth)) + s.CatchUp
		}
		s.Verify = slow(dev.step(s.Tokens))
		if dev.rollback {
			s.Save = dev.save * time.Duration(s.Drafting)
		}
		for i, k := range lens {
			m := 0
			for m < k && rng.Float64() < accept[i] {
				m++
			}
			tokens += 1 + m
			behind[i] += 1 + m
			if k > 0 {
				p.Record(&accs[i], k, m)
				if m < k && dev.rollback {
					s.Rolled++
				}
			}
		}
		s.Replay = dev.replay * time.Duration(s.Rolled)
		if step < dev.request {
			tokens = 0
		} else {
			elapsed += s.Draft + s.Save + s.Verify + s.Replay
		}
		if p != nil {
			p.Observe(s, true)
		}
	}
	if p == nil {
		return float64(tokens) / elapsed.Seconds(), Status{}
	}
	return float64(tokens) / elapsed.Seconds(), p.Status()
}

func draftCost(per time.Duration) func(int) time.Duration {
	return func(d int) time.Duration { return time.Duration(d) * per }
}

// TestPlannerNeverSlower: whatever the device and the draft, the rule's
// throughput is at least 0.97 of decoding without drafts, and where the
// drafts pay it gains.
func TestPlannerNeverSlower(t *testing.T) {
	b := Bounds{NMax: 8, BatchMax: 64}
	for _, tc := range []struct {
		name      string
		dev       device
		accept    float64
		slots     []int
		wantGain  float64 // the least speedup, 0: none asked
		wantDraft bool    // drafting at the end
	}{
		{"poor draft, memory-bound", device{step: flat, draft: draftCost(3 * time.Millisecond)}, 0.2, []int{1, 4, 8, 16}, 0, false},
		{"close draft, memory-bound, one stream", device{step: flat, draft: draftCost(time.Millisecond)}, 0.9, []int{1}, 1.8, true},
		{"close draft, compute-bound", device{step: linear, draft: draftCost(time.Millisecond)}, 0.9, []int{1, 4, 16}, 0, false},
		{"n-gram, memory-bound", device{step: flat, draft: draftCost(0)}, 0.5, []int{1, 4}, 1.2, true},
		{"hybrid target, poor draft", device{step: flat, draft: draftCost(time.Millisecond), rollback: true,
			save: 2 * time.Millisecond, replay: 8 * time.Millisecond}, 0.3, []int{1, 4, 16}, 0, false},
		{"hybrid target, close draft", device{step: flat, draft: draftCost(time.Millisecond), rollback: true,
			save: time.Millisecond, replay: 4 * time.Millisecond}, 0.95, []int{1}, 1.5, true},
		// A poor draft model as costly as the target (a CPU): each probe
		// first evaluates the new prompt of 2,000 tokens and what followed.
		{"poor draft far behind", device{step: linear, draft: draftCost(2 * time.Millisecond), catchUp: time.Millisecond,
			request: 200, prompt: 2000}, 0.2, []int{1, 4}, 0, false},
		// A close draft whose slots take a new prompt every 300 steps: the
		// catch-up is paid once a request and drafting goes on.
		{"close draft, new prompts", device{step: flat, draft: draftCost(time.Millisecond), catchUp: 20 * time.Microsecond,
			request: 300, prompt: 2000}, 0.9, []int{1}, 1.8, true},
	} {
		for _, n := range tc.slots {
			accept := make([]float64, n)
			for i := range accept {
				accept[i] = tc.accept
			}
			plain, _ := tc.dev.run(t, nil, accept, 3000)
			got, st := tc.dev.run(t, New(b, false, tc.dev.rollback), accept, 3000)
			ratio := got / plain
			t.Logf("%s, %d slots: %.2f× without drafts (plain %.0f tok/s), drafting %v, %d stops, %d probes",
				tc.name, n, ratio, plain, st.Drafting, st.Stops, st.Probes)
			if ratio < 0.97 {
				t.Errorf("%s, %d slots: %.3f× without drafts", tc.name, n, ratio)
			}
			if tc.wantGain > 0 && ratio < tc.wantGain {
				t.Errorf("%s, %d slots: %.2f×, want at least %.2f×", tc.name, n, ratio, tc.wantGain)
			}
			if st.Drafting != tc.wantDraft {
				t.Errorf("%s, %d slots: drafting %v at the end, want %v", tc.name, n, st.Drafting, tc.wantDraft)
			}
		}
	}
}

// TestPlannerDrift: on devices whose steps slow as the context grows, the
// rule stays at 0.97 or more of no drafts. A plain step is measured only
// while the rule does not draft and a verify step only while it does: an
// estimate of the one not measured, left as it was, made the rule resume
// drafts that lose, and stop drafts that pay, again and again.
func TestPlannerDrift(t *testing.T) {
	worst := 9.0
	for _, acc := range []float64{0.3, 0.4, 0.6} {
		for _, drift := range []float64{0.001, 0.003} {
			for _, dc := range []time.Duration{3 * time.Millisecond, 5 * time.Millisecond} {
				for _, step := range []func(int) time.Duration{flat, linear} {
					for _, n := range []int{1, 4} {
						dev := device{step: step, draft: draftCost(dc), catchUp: 200 * time.Microsecond, drift: drift}
						accept := make([]float64, n)
						for i := range accept {
							accept[i] = acc
						}
						plain, _ := dev.run(t, nil, accept, 3000)
						got, st := dev.run(t, New(Bounds{NMax: 8, BatchMax: 64}, false, false), accept, 3000)
						worst = min(worst, got/plain)
						if got/plain < 0.97 {
							t.Errorf("acceptance %.1f, drift %.3f a step, drafts of %v a token, %d slots: %.3f× without drafts, %d stops",
								acc, drift, dc, n, got/plain, st.Stops)
						}
					}
				}
			}
		}
	}
	t.Logf("the worst: %.3f× without drafts", worst)
}

// TestPlannerStops: a draft that paid stops paying (its text turned
// unpredictable): the rule stops drafting, says so, and probes seldom; once
// drafts pay again it resumes.
func TestPlannerStops(t *testing.T) {
	p := New(Bounds{NMax: 8, BatchMax: 64}, false, false)
	dev := device{step: flat, draft: draftCost(2 * time.Millisecond)}
	if _, st := dev.run(t, p, []float64{0.9}, 500); !st.Drafting {
		t.Fatalf("a close draft does not draft: %+v", st)
	}
	_, st := dev.run(t, p, []float64{0.05}, 4000)
	if st.Drafting || st.Stops == 0 {
		t.Fatalf("a poor draft still drafts: %+v", st)
	}
	if st.Probes == 0 || st.Probes > 4000/probeFirst {
		t.Errorf("%d probes in 4000 steps", st.Probes)
	}
	if st.PlainRate <= st.DraftRate {
		t.Errorf("stopped with the plain rate %.1f under the drafting one %.1f", st.PlainRate, st.DraftRate)
	}
	if _, st = dev.run(t, p, []float64{0.95}, 4000); !st.Drafting {
		t.Errorf("a close draft again does not resume: %+v", st)
	}
}

// TestPlannerPerSlot: of two slots, the one whose drafts are accepted gets
// the draft tokens.
func TestPlannerPerSlot(t *testing.T) {
	p := New(Bounds{NMax: 8, BatchMax: 64}, false, false)
	good, poor := Acceptance{}, Acceptance{}
	for range 30 {
		good.Record(8, 8)
		poor.Record(8, 0)
	}
	p.Observe(Step{Tokens: 2, Verify: 10 * time.Millisecond}, true)
	p.Observe(Step{Tokens: 3, Verify: 10 * time.Millisecond, Depth: 1, Draft: time.Millisecond}, true)
	ds := []Decoder{{Acc: &good, Max: 100}, {Acc: &poor, Max: 100}}
	lens := make([]int, 2)
	p.Plan(ds, lens)
	if lens[0] == 0 || lens[1] != 0 {
		t.Errorf("draft lengths %v: want the accepted slot's only", lens)
	}
}

// TestPlannerLimits: draft_max, the decoder's own bound, draft_min and
// draft_batch_max bound the plan; a width never measured is measured
// without drafts first.
func TestPlannerLimits(t *testing.T) {
	p := New(Bounds{NMax: 6, NMin: 3, BatchMax: 8}, false, false)
	a := Acceptance{}
	ds := []Decoder{{Acc: &a, Max: 100}, {Acc: &a, Max: 2}, {Acc: &a, Max: 4, Min: 5}}
	lens := make([]int, 3)
	if p.Plan(ds, lens); lens[0]+lens[1]+lens[2] != 0 {
		t.Fatalf("an unmeasured width drafts %v", lens)
	}
	p.Observe(Step{Tokens: 3, Verify: 10 * time.Millisecond}, true)
	p.Plan(ds, lens)
	if lens[0] > 6 || lens[1] != 0 || lens[2] != 0 || lens[0]+lens[1]+lens[2]+3 > 8 {
		t.Errorf("lens %v: draft_max 6, draft_min 3, a request's n_min 5, batch 8", lens)
	}
	if lens[0] < 3 {
		t.Errorf("lens %v: the free decoder drafts nothing", lens)
	}
}

// TestPlannerAlways: llama-server's rule drafts each decoder's most, its
// share of draft_batch_max, whatever it costs.
func TestPlannerAlways(t *testing.T) {
	p := New(Bounds{NMax: 8, BatchMax: 16}, true, false)
	a := Acceptance{}
	for range 50 {
		a.Record(8, 0)
	}
	for _, tc := range []struct{ decoders, want int }{{1, 8}, {2, 7}, {4, 3}, {8, 1}, {9, 0}} {
		ds := make([]Decoder, tc.decoders)
		for i := range ds {
			ds[i] = Decoder{Acc: &a, Max: 100}
		}
		lens := make([]int, tc.decoders)
		p.Plan(ds, lens)
		if lens[0] != tc.want {
			t.Errorf("%d decoders: %d, want %d", tc.decoders, lens[0], tc.want)
		}
	}
}

// TestSpecBatchShrinks: the plugin's test of draft_batch_max 8 with
// draft_max 6, on the plan alone: a slot alone drafts up to draft_max,
// while four decoding together (8/4 - 1 = 1 token each) draft one token at
// most, a step taking 8 tokens at most.
func TestSpecBatchShrinks(t *testing.T) {
	p := New(Bounds{NMax: 6, BatchMax: 8}, true, false)
	a := Acceptance{}
	alone := []int{0}
	p.Plan([]Decoder{{Acc: &a, Max: 100}}, alone)
	if alone[0] != 6 {
		t.Errorf("alone: drafts %d, want draft_max 6", alone[0])
	}
	ds := make([]Decoder, 4)
	for i := range ds {
		ds[i] = Decoder{Acc: &a, Max: 100}
	}
	lens := make([]int, 4)
	p.Plan(ds, lens)
	perStep := len(ds)
	for i, n := range lens {
		perStep += n
		if n > 1 {
			t.Errorf("decoder %d of four drafts %d, want 1 at most", i, n)
		}
	}
	if perStep > 8 {
		t.Errorf("four slots: %d tokens a step, above draft_batch_max 8", perStep)
	}
}

func TestAcceptance(t *testing.T) {
	var a Acceptance
	if a.Rate(0.3) != 0.3 {
		t.Errorf("no record: %v, want the prior", a.Rate(0.3))
	}
	a.Record(4, 2) // 3 compared, 2 accepted
	if r := a.Rate(1); r < 0.66 || r > 0.67 {
		t.Errorf("rate %.3f, want 2/3", r)
	}
	a.Record(4, 4)
	a.Record(0, 0)
	a.Record(3, 9) // more accepted than drafted: counted as all
	if a.Drafted != 11 || a.Accepted != 9 {
		t.Errorf("totals %d of %d", a.Accepted, a.Drafted)
	}
}

func TestTable(t *testing.T) {
	var tb table
	if _, ok := tb.stepTime(4); ok {
		t.Error("an empty table estimates")
	}
	tb.add(4, 1)
	tb.add(16, 3)
	tb.add(16, 4) // smoothed: 3.2
	for _, tc := range []struct {
		b    int
		want float64
		ok   bool
	}{{2, 0, false}, {4, 1, true}, {10, 2.1, true}, {16, 3.2, true}, {40, 3.2, true}} {
		if v, ok := tb.stepTime(tc.b); ok != tc.ok || (ok && (v < tc.want-1e-9 || v > tc.want+1e-9)) {
			t.Errorf("stepTime(%d) = %v, %v; want %v", tc.b, v, ok, tc.want)
		}
	}
	var dr table
	if dr.draftTime(3) != 0 {
		t.Error("an unmeasured draft costs")
	}
	dr.add(2, 4)
	if v := dr.draftTime(4); v != 8 {
		t.Errorf("draftTime(4) from depth 2's 4: %v, want 8", v)
	}
}

// TestPlannerTotals: the running sums count each decode-only step once, by
// whether it drafted, with each part of its time where Step has it; steps
// that evaluated a prompt are left out; the "always" rule counts alike.
func TestPlannerTotals(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	plain := Step{Tokens: 4, Verify: ms(2)}
	drafted := Step{Tokens: 12, Depth: 3, Drafting: 2, Draft: ms(5), CatchUp: ms(1), CatchUpTokens: 40,
		Save: ms(1), Verify: ms(3), Replay: ms(0.5), Rolled: 1}
	for _, always := range []bool{false, true} {
		p := New(Bounds{NMax: 8, BatchMax: 64}, always, true)
		p.Observe(plain, true)
		p.Observe(plain, true)
		p.Observe(drafted, true)
		p.Observe(Step{Tokens: 600, Verify: ms(80)}, false) // a prompt's chunk
		p.Observe(Step{Tokens: 600, Depth: 2, Draft: ms(9), Verify: ms(80)}, false)
		got := p.Status().Totals
		want := Totals{PlainSteps: 2, DraftSteps: 1, PlainSeconds: 0.004, DraftSeconds: 0.004, CatchUpSeconds: 0.001,
			SaveSeconds: 0.001, VerifySeconds: 0.003, ReplaySeconds: 0.0005}
		near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
		if got.PlainSteps != want.PlainSteps || got.DraftSteps != want.DraftSteps || !near(got.PlainSeconds, want.PlainSeconds) ||
			!near(got.DraftSeconds, want.DraftSeconds) || !near(got.CatchUpSeconds, want.CatchUpSeconds) ||
			!near(got.SaveSeconds, want.SaveSeconds) || !near(got.VerifySeconds, want.VerifySeconds) ||
			!near(got.ReplaySeconds, want.ReplaySeconds) {
			t.Errorf("always %v: %+v, want %+v", always, got, want)
		}
	}
}
