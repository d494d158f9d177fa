//go:build llama && cgo

package llama

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/cgo"
	"sync"
)

// ChunkWriter is a state's destination that lends the buffers the state is
// written into (the data plane's shared-memory chunks, as shm.ChunkWriter),
// which saves a copy of every byte: Buffer lends the next, never empty, and
// Commit says that the first n bytes of the last one are written.
type ChunkWriter interface {
	io.Writer
	Buffer() ([]byte, error)
	Commit(n int) error
}

// StateSource lends a restore's bytes where they lie, which saves a copy of
// every byte: Next releases the release bytes read since its last call and
// returns the unread bytes that follow, at least need of them, contiguous,
// valid until the next call, and outside Go memory (C keeps pointers into
// them).
type StateSource interface {
	Next(release, need int) ([]byte, error)
}

// ErrStateRefused is a restore's error where llama.cpp, or the checks of
// the state's structure as it reads it, refused the bytes, because the
// caller tells that apart from its source's failures.
var ErrStateRefused = errors.New("llama.cpp refused the state")

// saveStream is one StatePlan.Save: where the chunks go, and what went there.
type saveStream struct {
	w       io.Writer
	cw      ChunkWriter    // w as a ChunkWriter, or nil
	pin     runtime.Pinner // pins the ChunkWriter buffer C++ is filling
	written int64
	err     error // the first of w's errors, or a callback's panic
}

func (s *saveStream) fail(err error) C.int {
	if s.err == nil {
		s.err = err
	}
	return 1
}

// loadStream is one LoadState: where its bytes come from, and the context
// lock it lets go and takes back (LoadParams.Lock).
type loadStream struct {
	src  StateSource
	err  error
	lock sync.Locker // nil: never let go
	held bool
	// holdFrom is LoadParams.HoldFrom; taken, the bytes C++ took so far.
	holdFrom, taken int64
}

// hold takes the lock back (on) or lets it go.
func (l *loadStream) hold(on bool) {
	if l.lock == nil || on == l.held {
		return
	}
	if on {
		l.lock.Lock()
	} else {
		l.lock.Unlock()
	}
	l.held = on
}

// next lends C++ the next bytes, letting the lock go while it waits for
// them unless they reach holdFrom (or it is let go already: a KV part's rows).
func (l *loadStream) next(release, need int) ([]byte, error) {
	l.taken += int64(release)
	if !l.held || l.taken+int64(need) > l.holdFrom {
		return l.src.Next(release, need)
	}
	l.hold(false)
	defer l.hold(true)
	return l.src.Next(release, need)
}

func recovered(r any) error { return fmt.Errorf("panic in a state stream callback: %v", r) }

// StatePlan is a sequence's state as llama.cpp's walk of its cells found
// it: the metadata bytes, a recurrent state's bytes (copied during the
// walk: other sequences' decodes move its cell), and the KV caches' ranges
// its data lies in, which Save reads. It is valid while the sequence's KV
// cells are neither changed nor moved, and must be freed.
type StatePlan struct {
	c *Context
	p *C.hydra_state_plan
}

// PlanState walks sequence seq's state, as one KV stream, the way
// llama_state_seq_get_data does. The caller holds the context lock: the
// walk reads the memory's cells, which other sequences' decodes change.
func (c *Context) PlanState(seq int) (*StatePlan, error) {
	var msg [512]C.char
	p := C.hydra_state_plan_new(c.p, C.llama_seq_id(seq), C.uint32_t(c.nStream), C.size_t(c.StateSize(seq)), &msg[0], C.size_t(len(msg)))
	if p == nil {
		return nil, fmt.Errorf("llama.cpp state write failed: %s", C.GoString(&msg[0]))
	}
	return &StatePlan{c: c, p: p}, nil
}

// Free releases the plan.
func (p *StatePlan) Free() { C.hydra_state_plan_free(p.p) }

// Save streams the planned state to w, in chunks of at most chunk bytes:
// written in place into w's buffers where w is a ChunkWriter, else staged
// in the context's (pinned, on a GPU) buffers and handed to w.Write, which
// must not keep them. It needs no context lock: it reads only the planned
// ranges, while other sequences decode; one Save at a time per context (the
// staging buffers are the context's). It returns the bytes written, also on
// error; w's errors come back as they are. w's methods run on the calling
// goroutine, between the copies.
func (p *StatePlan) Save(chunk int, w io.Writer) (int64, error) {
	s := &saveStream{w: w}
	mode := C.int(0)
	if cw, ok := w.(ChunkWriter); ok {
		s.cw, mode = cw, 1
	}
	h := cgo.NewHandle(s)
	defer h.Delete()
	defer s.pin.Unpin()
	var msg [512]C.char
	n := C.hydra_state_plan_save(p.c.io, p.p, C.uintptr_t(h), C.size_t(chunk), mode, &msg[0], C.size_t(len(msg)))
	switch {
	case n >= 0 && int64(n) != s.written:
		return s.written, fmt.Errorf("state stream: %d bytes produced, %d written", int64(n), s.written)
	case n >= 0:
		return s.written, nil
	case s.err != nil:
		return s.written, s.err
	}
	return s.written, fmt.Errorf("llama.cpp state write failed: %s", C.GoString(&msg[0]))
}

// LoadParams are what a restore is checked against and how it streams.
type LoadParams struct {
	// Size is the state's bytes (one KV stream), which a cache of a KV
	// stream per sequence needs to restore it into the sequence's own.
	Size int64
	// StreamMin, when > 0, makes K/V runs of at least StreamMin bytes stream:
	// uploaded in pieces of at least PieceMin bytes as they arrive, where the
	// source holds them.
	StreamMin, PieceMin int64
	// Rules are the state's parts' (one KV stream only), for a sequence of
	// NTokens.
	Rules   []PartRule
	NTokens int
	// Lock, when set, is the context lock the caller holds. The restore lets
	// it go while it writes the rows of a KV part whose rule has its Fields
	// (cells its metadata gave the sequence, which other sequences' decodes
	// neither take nor read unmasked), and while it waits for bytes that
	// start before HoldFrom (a recurrent part's cell moves when other
	// sequences decode: from its first byte on, the lock stays); it holds
	// the lock again when LoadState returns.
	Lock     sync.Locker
	HoldFrom int64
}

// LoadState restores sequence seq from the bytes src lends, in place (the
// restore ring or the data plane's buffers, pinned on a GPU), and returns
// the state bytes llama.cpp consumed. src's errors come back as they are;
// a refusal of the bytes is ErrStateRefused with llama.cpp's reason. On
// failure the sequence may be half-restored and the caller must clear it.
// src runs on the calling goroutine, between llama.cpp's reads.
func (c *Context) LoadState(seq int, src StateSource, p LoadParams) (int64, error) {
	l := &loadStream{src: src, lock: p.Lock, held: p.Lock != nil, holdFrom: p.HoldFrom}
	defer l.hold(true) // C++ takes it back before returning; a panic in a callback may not have
	h := cgo.NewHandle(l)
	defer h.Delete()
	cr, freeRules := cRules(p.Rules)
	defer freeRules()
	var msg [512]C.char
	ClearError()
	got := C.hydra_state_load(c.io, c.p, C.llama_seq_id(seq), C.uint32_t(c.nStream), C.size_t(p.Size),
		C.uintptr_t(h), C.size_t(p.StreamMin), C.size_t(p.PieceMin),
		cr, C.int(len(p.Rules)), C.int32_t(p.NTokens), &msg[0], C.size_t(len(msg)))
	llamaErr := LastError()
	switch {
	case got < 0 && l.err != nil:
		return 0, l.err
	case got < 0:
		return 0, fmt.Errorf("%w: %s%s", ErrStateRefused, C.GoString(&msg[0]), llamaErr)
	}
	return int64(got), nil
}

// PinnedStaging reports whether the buffers StatePlan.Save staged chunks in so
// far are pinned (from the GPU's host buffer type).
func (c *Context) PinnedStaging() bool { return C.hydra_io_pinned(c.io) != 0 }

// Streamed counts the K/V blocks restores streamed and the runs of them
// llama.cpp read (more than one a block where it scatters the block).
func (c *Context) Streamed() (blocks, runs uint64) {
	var r C.uint64_t
	b := C.hydra_io_streamed(c.io, &r)
	return uint64(b), uint64(r)
}
