package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// -draft-model and its settings reach both systems under their own names,
// llama-server's alias staying last; without them neither drafts.
func TestSpecArgs(t *testing.T) {
	o, err := parseFlags([]string{"-model", "m.gguf", "-draft-model", "d.gguf", "-draft-max", "8", "-draft-p-min", "0.6"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d := o.draftModel // made absolute
	if got, want := specOurs(o), []string{"draft_model=" + d, "draft_max=8", "draft_p_min=0.6", "draft_n_gpu_layers=-1"}; !slices.Equal(got, want) {
		t.Errorf("ours: %q, want %q", got, want)
	}
	a := llamaServerArgs(o, 1)
	line := strings.Join(a, " ")
	if !strings.Contains(line, "-md "+d+" -ngld 999 --spec-type draft-simple --spec-draft-n-max 8 --spec-draft-p-min 0.6") || a[len(a)-1] != "m" {
		t.Errorf("llama-server: %s", line)
	}
	base, err := parseFlags([]string{"-model", "m.gguf"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(specOurs(base)) != 0 || slices.ContainsFunc(llamaServerArgs(base, 1), func(a string) bool { return a == "-md" || strings.HasPrefix(a, "--spec") }) {
		t.Errorf("without -draft-model: %q, %q", specOurs(base), llamaServerArgs(base, 1))
	}
}

// The final chunk's timings carry the draft counts into the samples, and
// the run's fact line sums them.
func TestDraftCounts(t *testing.T) {
	ev, err := openAIEvent([]byte(`{"choices":[{"text":"x","finish_reason":"length"}],"timings":{"predicted_n":4,"draft_n":6,"draft_n_accepted":3}}`))
	if err != nil || ev.DraftN != 6 || ev.DraftAccepted != 3 {
		t.Fatalf("%+v, %v", ev, err)
	}
	r := &systemRun{Rounds: map[int][]round{1: {{Samples: []sample{{DraftN: 6, DraftAccepted: 3}}}}, 2: {{Samples: []sample{{DraftN: 4, DraftAccepted: 4}, {}}}}}}
	if got := r.draftFact(); got != "draft tokens accepted/verified: 7/10 (0.70); c=1 3/6 (0.50), c=2 4/4 (1.00)" {
		t.Errorf("%q", got)
	}
	if (&systemRun{Rounds: map[int][]round{1: {{Samples: []sample{{}}}}}}).draftFact() != "" {
		t.Error("a run without drafts has a draft line")
	}
}

// The rule's decisions in ours' log become one fact: how often it stopped
// and resumed, and its last line.
func TestSpecRuleFact(t *testing.T) {
	log := "x\n" +
		"... speculative decoding drafts: drafts bring more than they cost: expected_tok_s_drafting=339.0 expected_tok_s_plain=42.4\n" +
		"... speculative decoding stopped: drafts cost more than they bring (probes go on now and then): expected_tok_s_drafting=29.9\n"
	want := "speculative rule: stopped 1 times, resumed 1 times; last: ... speculative decoding stopped: drafts cost more than they bring (probes go on now and then): expected_tok_s_drafting=29.9"
	if got := specRuleFact(log); got != want {
		t.Errorf("%q\nwant %q", got, want)
	}
	if specRuleFact("nothing here\n") != "" {
		t.Error("a fact without a decision")
	}
	if facts := oursFacts(log); len(facts) != 1 || facts[0] != want {
		t.Errorf("oursFacts: %q", facts)
	}
}
