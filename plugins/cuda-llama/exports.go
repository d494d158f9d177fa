//go:build llama && cgo

package cudallama

// Go callbacks of shim.cpp. A file with //export may only declare things in
// its preamble, hence a file of its own. None may let a panic unwind into C++.

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/cgo"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// saveCall is one StateGet: where the chunks go.
type saveCall struct {
	ctx     context.Context
	w       io.Writer
	cw      shm.ChunkWriter // w as a ChunkWriter, or nil
	pin     runtime.Pinner  // pins the ChunkWriter buffer C++ is filling
	lock    *sched.Lock     // the context lock, let go while the chunks wait on their reader
	written int64
	err     error
}

// unlocked runs f without the context lock, which the caller of the shim
// holds: a transfer waiting on its peer lets the other slots' steps run.
func unlocked(lock *sched.Lock, f func()) {
	lock.Unlock()
	defer lock.Lock()
	f()
}

func (s *saveCall) fail(err error) C.int {
	if s.err == nil {
		s.err = err
	}
	return 1
}

func recovered(r any) error { return fmt.Errorf("panic in a state stream callback: %v", r) }

// hydraSaveDeliver writes a staged chunk (plain writers).
//
//export hydraSaveDeliver
func hydraSaveDeliver(h C.uintptr_t, p unsafe.Pointer, n C.size_t) (ret C.int) {
	s := cgo.Handle(h).Value().(*saveCall)
	defer func() {
		if r := recover(); r != nil {
			ret = s.fail(recovered(r))
		}
	}()
	if err := s.ctx.Err(); err != nil {
		return s.fail(err)
	}
	// The chunk is C memory the shim reuses: a Writer must not retain it,
	// which io.Writer's contract already says.
	var k int
	var err error
	unlocked(s.lock, func() { k, err = s.w.Write(unsafe.Slice((*byte)(p), int(n))) })
	s.written += int64(k)
	if err == nil && k < int(n) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return s.fail(err)
	}
	return 0
}

// hydraSaveBuffer commits the bytes written into the current ChunkWriter
// buffer (commit > 0) and, when p is not NULL, hands C++ the next buffer.
//
//export hydraSaveBuffer
func hydraSaveBuffer(h C.uintptr_t, commit C.size_t, p **C.uint8_t, n *C.size_t) (ret C.int) {
	s := cgo.Handle(h).Value().(*saveCall)
	defer func() {
		if r := recover(); r != nil {
			ret = s.fail(recovered(r))
		}
	}()
	if commit > 0 {
		s.pin.Unpin()
		var err error
		unlocked(s.lock, func() { err = s.cw.Commit(int(commit)) })
		if err != nil {
			return s.fail(err)
		}
		s.written += int64(commit)
	}
	if p == nil {
		return 0
	}
	if err := s.ctx.Err(); err != nil {
		return s.fail(err)
	}
	var b []byte
	var err error
	unlocked(s.lock, func() { b, err = s.cw.Buffer() })
	if err != nil {
		return s.fail(err)
	}
	if len(b) == 0 {
		return s.fail(errors.New("the chunk writer returned an empty buffer"))
	}
	// C++ fills the buffer after we return: pinned, a Go buffer may be held
	// by C (a shared-memory one is not Go memory, and Pin ignores it).
	s.pin.Pin(&b[0])
	*p = (*C.uint8_t)(unsafe.Pointer(&b[0]))
	*n = C.size_t(len(b))
	return 0
}

// loadCall is one StatePut: where its bytes come from (the data plane's
// buffers in place, or the restore ring).
type loadCall struct {
	pf   restoreSource
	lock *sched.Lock // the context lock, let go while waiting for bytes
	err  error
}

// hydraLoadNext releases the release bytes C++ took since its last call and
// lends it the unread bytes that follow, at least need of them, contiguous;
// 1 on error (kept in loadCall).
//
//export hydraLoadNext
func hydraLoadNext(h C.uintptr_t, release, need C.size_t, p **C.uint8_t, n *C.size_t) (ret C.int) {
	l := cgo.Handle(h).Value().(*loadCall)
	defer func() {
		if r := recover(); r != nil {
			l.err = recovered(r)
			ret = 1
		}
	}()
	var b []byte
	var err error
	unlocked(l.lock, func() { b, err = l.pf.next(int(release), int(need)) })
	if err != nil {
		l.err = err
		return 1
	}
	// Not Go memory: the rings and the staging buffer are mmaps, and C may
	// hold pointers into them.
	*p = (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(b)))
	*n = C.size_t(len(b))
	return 0
}

// hydraLog receives llama.cpp's and ggml's log output.
//
//export hydraLog
func hydraLog(level C.int, text *C.char) {
	defer func() { _ = recover() }()
	llamaLogText(int(level), C.GoString(text))
}
