//go:build llama && cgo

package llama

// Go callbacks of shim.cpp. A file with //export may only declare things in
// its preamble, hence a file of its own. None may let a panic unwind into
// C++.

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"errors"
	"io"
	"runtime/cgo"
	"unsafe"
)

// hydraSaveDeliver writes a staged chunk (plain writers).
//
//export hydraSaveDeliver
func hydraSaveDeliver(h C.uintptr_t, p unsafe.Pointer, n C.size_t) (ret C.int) {
	s := cgo.Handle(h).Value().(*saveStream)
	defer func() {
		if r := recover(); r != nil {
			ret = s.fail(recovered(r))
		}
	}()
	// The chunk is C memory the shim reuses: a Writer must not retain it,
	// which io.Writer's contract already says.
	k, err := s.w.Write(unsafe.Slice((*byte)(p), int(n)))
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
	s := cgo.Handle(h).Value().(*saveStream)
	defer func() {
		if r := recover(); r != nil {
			ret = s.fail(recovered(r))
		}
	}()
	if commit > 0 {
		s.pin.Unpin()
		if err := s.cw.Commit(int(commit)); err != nil {
			return s.fail(err)
		}
		s.written += int64(commit)
	}
	if p == nil {
		return 0
	}
	b, err := s.cw.Buffer()
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

// hydraLoadNext releases the release bytes C++ took since its last call and
// lends it the unread bytes that follow, at least need of them, contiguous;
// 1 on error (kept in loadStream).
//
//export hydraLoadNext
func hydraLoadNext(h C.uintptr_t, release, need C.size_t, p **C.uint8_t, n *C.size_t) (ret C.int) {
	l := cgo.Handle(h).Value().(*loadStream)
	defer func() {
		if r := recover(); r != nil {
			l.err = recovered(r)
			ret = 1
		}
	}()
	b, err := l.next(int(release), int(need))
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

// hydraLoadHold takes the context lock back (hold 1) or lets it go (0),
// for hydra_state_load.
//
//export hydraLoadHold
func hydraLoadHold(h C.uintptr_t, hold C.int) {
	l := cgo.Handle(h).Value().(*loadStream)
	l.hold(hold != 0)
}

// hydraLog receives llama.cpp's and ggml's log output.
//
//export hydraLog
func hydraLog(level C.int, text *C.char) {
	defer func() { _ = recover() }()
	Log(int(level), C.GoString(text))
}
