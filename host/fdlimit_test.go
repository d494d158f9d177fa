package host

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestFitConns: the limit per listener is what the descriptor limit leaves
// after the open ones, the reserve and each listener's refusals; a limit
// that fits is kept; too few descriptors are an error naming the fix.
func TestFitConns(t *testing.T) {
	reserve := fdReserve(4)
	for _, c := range []struct {
		soft            uint64
		open, want, lis int
		fit             int
		err             string
	}{
		{soft: 1 << 20, open: 20, want: 1024, lis: 3, fit: 1024},
		{soft: 1024, open: 20, want: 1024, lis: 2, fit: (1024-20-reserve)/2 - maxRefusing},
		{soft: 4096, open: 10, want: 2048, lis: 3, fit: (4096-10-reserve)/3 - maxRefusing},
		{soft: 4096, open: 10, want: 100, lis: 3, fit: 100},
		{soft: 256, open: 10, want: 1024, lis: 2, err: "raise it (ulimit -n"},
		{soft: 1 << 62, open: 10, want: 1024, lis: 2, fit: 1024},
	} {
		fit, err := fitConns(c.soft, c.open, c.want, c.lis, 4)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("fitConns(%d, %d, %d, %d) = %d, %v; want an error with %q", c.soft, c.open, c.want, c.lis, fit, err, c.err)
			}
			continue
		}
		if err != nil || fit != c.fit {
			t.Errorf("fitConns(%d, %d, %d, %d) = %d, %v; want %d", c.soft, c.open, c.want, c.lis, fit, err, c.fit)
		}
	}
}

// TestFitConnLimitWarns: a limit that does not fit this process is lowered
// with one WARN line; one that fits is kept silently.
func TestFitConnLimitWarns(t *testing.T) {
	soft, ok := nofileLimit()
	if !ok {
		t.Skip("no RLIMIT_NOFILE here")
	}
	var logs bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	if got, err := FitConnLimit(log, 8, 1, 4); err != nil || got != 8 || logs.Len() != 0 {
		t.Fatalf("FitConnLimit(8) = %d, %v, log %q; want 8 and no log", got, err, logs.String())
	}
	want := int(min(soft, 1<<30))
	got, err := FitConnLimit(log, want, 1, 4)
	if err != nil || got >= want || got < minFitConns {
		t.Fatalf("FitConnLimit(%d) under RLIMIT_NOFILE %d = %d, %v; want it lowered", want, soft, got, err)
	}
	if n := strings.Count(logs.String(), "[WARN]"); n != 1 || !strings.Contains(logs.String(), "effective=") {
		t.Fatalf("want one WARN line with the effective limit:\n%s", logs.String())
	}
}
