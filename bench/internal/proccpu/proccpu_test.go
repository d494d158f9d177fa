package proccpu

import (
	"math"
	"os"
	"testing"
	"time"
)

func TestStat(t *testing.T) {
	// The command name may contain spaces and parentheses.
	stat := "4242 (hydra (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 9 0 100 1262000000 4969 18446744073709551615"
	got, err := Stat(stat)
	if err != nil || math.Abs(got-3.8) > 1e-9 {
		t.Fatalf("Stat = %v, %v; want 3.8", got, err)
	}
	if _, err := Stat("4242 (x) S 1"); err == nil {
		t.Error("a short stat line parsed")
	}
}

// TestOfSelf: this process's CPU time grows with work done, and read from
// /proc it agrees with getrusage to the /proc file's 10 ms ticks.
func TestOfSelf(t *testing.T) {
	before := Self()
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for Self()-before < 0.05 && time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x ^= i * i
		}
	}
	if Self()-before < 0.05 {
		t.Fatalf("Self grew by %v s in 5 s of work (x=%d)", Self()-before, x)
	}
	proc, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := Self() - proc; d < -0.02 || d > 0.05 {
		t.Fatalf("Of = %v, Self = %v", proc, Self())
	}
	if _, err := Of(-1); err == nil {
		t.Error("a process that cannot exist had a CPU time")
	}
}
