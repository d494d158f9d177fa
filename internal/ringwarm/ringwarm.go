// Package ringwarm keeps the next bytes of a ring buffer in the reading
// core's cache while a socket reader waits, so the kernel's copy into them
// lands in cached memory (iface/shm_warm_linux.go; recv-bench -warmN).
package ringwarm

// Warmer loads the bytes of a ring ahead of a write position.
type Warmer struct {
	mem   []byte
	ahead int
	pos   int  // bytes loaded past the write position at
	at    int  // the write position pos counts from (an offset into mem)
	sink  byte // keeps the loads
}

// New is a Warmer of mem that keeps ahead bytes loaded.
func New(mem []byte, ahead int) *Warmer {
	return &Warmer{mem: mem, ahead: min(ahead, len(mem))}
}

// Touch loads one byte a cache line of up to step more bytes ahead of the
// write position at (an offset into the ring, wrapping at its end); false
// once ahead bytes past at are loaded. Moving at forward by n keeps what
// was loaded beyond it.
func (w *Warmer) Touch(at, step int) bool {
	if at != w.at {
		w.pos = max(w.pos-(at-w.at+len(w.mem))%len(w.mem), 0)
		w.at = at
	}
	if w.pos >= w.ahead {
		return false
	}
	end := min(w.pos+step, w.ahead)
	for p := w.pos; p < end; p += 64 {
		w.sink += w.mem[(at+p)%len(w.mem)]
	}
	w.pos = end
	return true
}
