package host

import (
	"github.com/hydra-engine/hydra-engine/iface"
)

// CheckMessageCountJSON is CheckMessageCount on a JSON body before it is
// decoded: it counts the top-level "messages" array's elements with a scan
// that stops once they are more than a slot holds, since decoding 10^5
// messages costs far more than refusing them. A body it cannot read is left
// to the decoder, whose error is the one to give.
func CheckMessageCountJSON(body []byte, info iface.BackendInfo) error {
	limit := info.SlotCtx()
	if limit <= 0 {
		return nil
	}
	if n, ok := countMessages(body, limit+1); ok && n > limit {
		return CheckMessageCount(n, info)
	}
	return nil
}

// countMessages counts the elements of the top-level object's "messages"
// array, up to stop; ok is false where the body is not an object whose
// scan reaches that array.
func countMessages(b []byte, stop int) (n int, ok bool) {
	s := &jsonScan{b: b}
	if !s.byteIs('{') {
		return 0, false
	}
	for {
		key, ok := s.str()
		if !ok || !s.byteIs(':') {
			return 0, false
		}
		if key == "messages" {
			return s.countArray(stop)
		}
		if !s.skipValue(0) {
			return 0, false
		}
		if !s.byteIs(',') {
			return 0, false
		}
	}
}

// jsonScan reads just enough JSON to find and count an array: strings
// (escapes skipped, not decoded), nesting, and the separators between.
type jsonScan struct {
	b   []byte
	off int
}

func (s *jsonScan) ws() {
	for s.off < len(s.b) && (s.b[s.off] == ' ' || s.b[s.off] == '\t' || s.b[s.off] == '\n' || s.b[s.off] == '\r') {
		s.off++
	}
}

// byteIs consumes c after white space.
func (s *jsonScan) byteIs(c byte) bool {
	s.ws()
	if s.off < len(s.b) && s.b[s.off] == c {
		s.off++
		return true
	}
	return false
}

// str reads a string; its text is returned only where it holds no escape
// (a key of interest holds none).
func (s *jsonScan) str() (string, bool) {
	if !s.byteIs('"') {
		return "", false
	}
	start, escaped := s.off, false
	for s.off < len(s.b) {
		switch s.b[s.off] {
		case '\\':
			escaped = true
			s.off += 2
			continue
		case '"':
			s.off++
			if escaped {
				return "", true
			}
			return string(s.b[start : s.off-1]), true
		}
		s.off++
	}
	return "", false
}

// maxScanDepth bounds the nesting the scan follows: deeper bodies are left
// to the decoder (which has its own limit).
const maxScanDepth = 1000

// skipValue skips one value.
func (s *jsonScan) skipValue(depth int) bool {
	if depth > maxScanDepth {
		return false
	}
	s.ws()
	if s.off >= len(s.b) {
		return false
	}
	switch s.b[s.off] {
	case '"':
		_, ok := s.str()
		return ok
	case '{', '[':
		close := byte('}')
		if s.b[s.off] == '[' {
			close = ']'
		}
		s.off++
		if s.byteIs(close) {
			return true
		}
		for {
			if close == '}' {
				if _, ok := s.str(); !ok || !s.byteIs(':') {
					return false
				}
			}
			if !s.skipValue(depth + 1) {
				return false
			}
			if s.byteIs(close) {
				return true
			}
			if !s.byteIs(',') {
				return false
			}
		}
	}
	for s.off < len(s.b) { // a number, true, false or null
		switch s.b[s.off] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return true
		}
		s.off++
	}
	return true
}

// countArray counts an array's elements, up to stop.
func (s *jsonScan) countArray(stop int) (int, bool) {
	if !s.byteIs('[') {
		return 0, false
	}
	if s.byteIs(']') {
		return 0, true
	}
	for n := 1; ; n++ {
		if n >= stop {
			return n, true
		}
		if !s.skipValue(0) {
			return 0, false
		}
		if s.byteIs(']') {
			return n, true
		}
		if !s.byteIs(',') {
			return 0, false
		}
	}
}
