//go:build linux

package shm

import "testing"

// TestTouch: the warmer loads at most ahead bytes past the write position, a
// step at a time, slides with the position (wrapping at the ring's end) and
// only loads what has not been loaded since.
func TestTouch(t *testing.T) {
	const ring, ahead, step = 1 << 20, 256 << 10, 16 << 10
	w := newWarmer(make([]byte, ring), ahead)
	calls := 0
	for w.touch(0, step) {
		calls++
	}
	if calls != ahead/step || w.pos != ahead {
		t.Fatalf("%d touches to pos %d, want %d to %d", calls, w.pos, ahead/step, ahead)
	}
	// 100 KiB written: that much more to load.
	if !w.touch(100<<10, step) || w.pos != ahead-100<<10+step {
		t.Fatalf("after 100 KiB, pos %d", w.pos)
	}
	for w.touch(100<<10, step) {
	}
	if w.pos != ahead {
		t.Fatalf("pos %d, want %d", w.pos, ahead)
	}
	// Near the ring's end, further than ahead: from scratch.
	at := ring - 10<<10
	for w.touch(at, step) {
	}
	if w.pos != ahead || w.at != at {
		t.Fatalf("at the ring's end: pos %d at %d", w.pos, w.at)
	}
	// The position wrapped round to the ring's start.
	if !w.touch(6<<10, step) || w.pos != ahead-16<<10+step {
		t.Fatalf("after wrapping: pos %d", w.pos)
	}
	// A ring smaller than ahead is loaded once round, not more.
	small := newWarmer(make([]byte, 64<<10), ahead)
	n := 0
	for small.touch(0, step) {
		n++
	}
	if n != 4 {
		t.Fatalf("a 64 KiB ring took %d touches, want 4", n)
	}
}
