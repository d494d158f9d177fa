package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal: progress bars are drawn only
// there, never into a pipe or a log.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress is a byte-counting progress bar with throughput and ETA. It is an
// io.Writer, to sit beside a transfer's destination (io.MultiWriter) or
// behind its source (io.TeeReader). A nil *progress is a valid, silent one.
type progress struct {
	bar *progressbar.ProgressBar
	w   io.Writer
}

// newProgress returns a bar for total bytes, or nil when bars are off or
// there is nothing to show.
func (o *output) newProgress(total uint64, desc string) *progress {
	if !o.progress || total == 0 {
		return nil
	}
	return newProgressTo(o.stderr, int64(total), desc)
}

func newProgressTo(w io.Writer, total int64, desc string) *progress {
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true), // throughput
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true), // ETA
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionFullWidth(),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	return &progress{bar: bar, w: w}
}

func (p *progress) Write(b []byte) (int, error) {
	if p != nil {
		_ = p.bar.Add(len(b)) // drawing errors must not fail the transfer
	}
	return len(b), nil
}

// done closes the bar: complete on success; on failure it stays where the
// transfer stopped and the error goes on the next line.
func (p *progress) done(err error) {
	if p == nil {
		return
	}
	if err == nil {
		_ = p.bar.Finish()
		return
	}
	_ = p.bar.Exit()
}

// teeTo wraps a transfer's source so the bar follows it.
func (p *progress) teeTo(r io.Reader) io.Reader {
	if p == nil {
		return r
	}
	return io.TeeReader(r, p)
}

// alongside wraps a transfer's destination so the bar follows it.
func (p *progress) alongside(w io.Writer) io.Writer {
	if p == nil {
		return w
	}
	return io.MultiWriter(w, p)
}
