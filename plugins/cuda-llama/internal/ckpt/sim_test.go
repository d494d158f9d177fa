package ckpt_test

import (
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt/ckpttest"
)

// server is llama-server's defaults with its batch sizes.
var server = ckpt.Rules{Max: ckpt.DefaultMax, MinStep: ckpt.DefaultMinStep, NBatch: 2048, NUBatch: 512}

func ramp(from, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(from + i)
	}
	return t
}

// The three cases of llama-server's own measurement (the table):
// prompt A of N tokens and 4 generated, then A + 64, A again, A cut 200
// before its end + 64.
func TestThreeCasesAsLlamaServer(t *testing.T) {
	for _, n := range []int{600, 3000, 32768} {
		a := ramp(0, n)
		cases := []struct {
			name   string
			prompt []int32
			want   int
		}{
			{"extends", append(slices.Clone(a), ramp(50000, 64)...), 68},
			{"same", a, 4},
			{"cut", append(slices.Clone(a[:n-200]), ramp(50000, 64)...), 380},
		}
		for _, c := range cases {
			s := ckpttest.NewSim(t, server)
			if got := s.Prompt(a, ckpt.Spans{}, 4); got != n {
				t.Fatalf("N=%d: first prompt evaluated %d", n, got)
			}
			if want := []int{n - 516, n - 4}; !slices.Equal(s.Taken, want) {
				t.Fatalf("N=%d: checkpoints at %v, want %v", n, s.Taken, want)
			}
			if got := s.Prompt(c.prompt, ckpt.Spans{}, 4); got != c.want {
				t.Errorf("N=%d %s: evaluated %d, want %d (llama-server's)", n, c.name, got, c.want)
			}
		}
	}
}

// Without checkpoints a prompt that parts from the sequence starts over.
func TestNoCheckpointsStartsOver(t *testing.T) {
	r := server
	r.Max = 0
	s := ckpttest.NewSim(t, r)
	a := ramp(0, 3000)
	s.Prompt(a, ckpt.Spans{}, 4)
	if got := s.Prompt(a, ckpt.Spans{}, 0); got != 3000 {
		t.Fatalf("evaluated %d, want 3000", got)
	}
	if len(s.Taken) != 0 {
		t.Fatalf("took %v", s.Taken)
	}
}

// A prompt that extends what the memory holds keeps it all: no restore.
func TestExtendKeepsAll(t *testing.T) {
	s := ckpttest.NewSim(t, server)
	a := ramp(0, 1000)
	s.Prompt(a, ckpt.Spans{}, 0)
	if got := s.Prompt(append(slices.Clone(a), 7, 8, 9), ckpt.Spans{}, 0); got != 3 {
		t.Fatalf("evaluated %d, want 3", got)
	}
	if st := s.Store.Stats(); st.Restored != 0 {
		t.Fatalf("restored %d", st.Restored)
	}
}

// A prompt parting before every checkpoint starts over, and the
// checkpoints past the point are dropped.
func TestPartBeforeAll(t *testing.T) {
	s := ckpttest.NewSim(t, server)
	a := ramp(0, 3000)
	s.Prompt(a, ckpt.Spans{}, 4)
	b := append(slices.Clone(a[:100]), ramp(9000, 50)...)
	if got := s.Prompt(b, ckpt.Spans{}, 0); got != 150 {
		t.Fatalf("evaluated %d, want 150", got)
	}
	// The two checkpoints of a were dropped (their positions are past 0);
	// b is shorter than n_ubatch + 4, so only N − 4 was taken.
	if n, _ := s.Store.Slot(0); n != 1 {
		t.Fatalf("%d checkpoints held, want 1 (b's)", n)
	}
}

// User messages: the last one's start always gets a checkpoint; earlier
// ones only when at least MinStep past the newest.
func TestUserStartCheckpoints(t *testing.T) {
	r := server
	r.MinStep = 1000
	s := ckpttest.NewSim(t, r)
	n := 5000
	spans := ckpt.Spans{UserStarts: []int{10, 500, 1700, 2000, 4100}}
	s.Prompt(ramp(0, n), spans, 0)
	// 10: the first chunk ends there, nothing in memory to save. 500: the
	// chunk from 10 starts a user message and the slot has no checkpoint:
	// taken at 10. 1700 is over MinStep past 10: the chunk from 500 ends
	// there, but 500 is not, so none at 500; taken at 1700. 2000: within the
	// step of 1700. 4100: the last user message. Then n−516 and n−4.
	want := []int{10, 1700, 4100, n - 516, n - 4}
	if !slices.Equal(s.Taken, want) {
		t.Fatalf("checkpoints at %v, want %v", s.Taken, want)
	}
	// The next turn parts inside the last user message: it resumes at its
	// start.
	b := append(ramp(0, 4300), ramp(70000, 20)...)
	if got := s.Prompt(b, spans, 0); got != 4320-4100 {
		t.Fatalf("evaluated %d, want %d", got, 4320-4100)
	}
}
