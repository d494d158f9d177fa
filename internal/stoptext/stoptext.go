// Package stoptext turns generated token pieces into the text a client is
// shown: cut at the first stop string, never ending inside a UTF-8 sequence.
// The host's completions and the llama backend's parsed replies share it.
package stoptext

import (
	"strings"
	"unicode/utf8"
)

// Stream turns generated token pieces into the text a client is shown.
// It ends the text at the first stop string and holds back any tail that may
// still grow into one, or that ends inside a UTF-8 sequence (byte tokens
// split characters), so a streamed chunk never shows what a later token
// would take back.
type Stream struct {
	Stops []string
	// Matched is the stop string that ended the text, once one has.
	Matched string
	pending string // received, not yet released
	stopped bool
}

// Push adds a piece and returns the text that is now final. Once a stop
// string has matched, stopped is true and further pieces are ignored.
func (t *Stream) Push(piece string) (out string, stopped bool) {
	if t.stopped {
		return "", true
	}
	t.pending += piece
	first := -1
	for _, s := range t.Stops {
		if i := strings.Index(t.pending, s); i >= 0 && (first < 0 || i < first) {
			first, t.Matched = i, s
		}
	}
	if first >= 0 {
		out, t.pending, t.stopped = t.pending[:first], "", true
		return out, true
	}
	hold := 0
	for _, s := range t.Stops {
		for k := min(len(s)-1, len(t.pending)); k > hold; k-- {
			if strings.HasSuffix(t.pending, s[:k]) {
				hold = k
				break
			}
		}
	}
	cut := completeUTF8(t.pending[:len(t.pending)-hold])
	out, t.pending = t.pending[:cut], t.pending[cut:]
	return out, false
}

// Flush releases what is held back: generation ended without a stop match.
func (t *Stream) Flush() string {
	out := t.pending
	t.pending = ""
	return out
}

// completeUTF8 is the length of the longest prefix of s that does not end
// inside a multi-byte UTF-8 sequence. Invalid bytes count as complete.
func completeUTF8(s string) int {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if utf8.FullRuneInString(s[i:]) {
				return len(s)
			}
			return i
		}
	}
	return len(s)
}
