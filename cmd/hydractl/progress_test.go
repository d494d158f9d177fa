package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgressTo(&buf, 4<<20, "slot 0 →")
	for range 4 {
		p.Write(make([]byte, 1<<20))
		time.Sleep(120 * time.Millisecond) // past the redraw throttle
	}
	p.done(nil)
	out := buf.String()
	for _, want := range []string{"slot 0 →", "100%", "4.2 MB", "B/s", "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q: %q", want, out)
		}
	}
	if !strings.Contains(out, ":") || !strings.Contains(out, "[") { // [elapsed:ETA]
		t.Errorf("bar shows no elapsed/ETA: %q", out)
	}

	// A failed transfer leaves the bar where it stopped and ends the line.
	buf.Reset()
	p = newProgressTo(&buf, 100, "x")
	p.Write(make([]byte, 40))
	p.done(errors.New("broken"))
	if out := buf.String(); strings.Contains(out, "100%") || !strings.HasSuffix(out, "\n") {
		t.Errorf("failed bar: %q", out)
	}

	// nil is a silent bar, and bars stay off when stderr is no terminal.
	var none *progress
	if n, err := none.Write([]byte("abc")); n != 3 || err != nil {
		t.Error("nil progress write")
	}
	none.done(nil)
	o := &output{stderr: &buf, progress: isTerminal(&buf)}
	if o.newProgress(10, "x") != nil {
		t.Error("progress bar on a non-terminal")
	}
}

func TestMigrateAndBenchUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"migrate", "--slot", "0"}, "needs --to URL"},
		{[]string{"migrate", "--to", "tcp://127.0.0.1:1", "--slot", "-2"}, "--slot must be >= 0"},
		{[]string{"migrate", "--to", "tcp://127.0.0.1:1", "extra"}, "unexpected argument"},
		{[]string{"bench", "--rounds", "0"}, "--rounds must be >= 1"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.err) || stdout.Len() != 0 {
			t.Errorf("hydractl %q: exit %d, %q", c.args, code, stderr.String())
		}
	}
}
