// Package prompt turns a rendered prompt into the pieces llama.cpp tokenizes:
// it splits the text at the vocabulary's special tokens as llama.cpp's
// tokenizer does before BPE (llama_vocab::impl::tokenizer_st_partition), and
// leaves the control tokens a chat message's content spells out as text.
//
// llama.cpp's own split walks a linked list from its head for every match,
// so its time grows with the square of the special tokens in a prompt
// (80,000 of them: minutes of CPU); Split is linear in the text for each
// special token of the vocabulary and stops at a limit of matches.
package prompt

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Token is a vocabulary's special token: llama.cpp's control, user-defined
// and unknown tokens (its cache_special_tokens).
type Token struct {
	ID   int32
	Text string
	// Control marks control and unknown tokens, which are matched only when
	// special tokens are parsed; user-defined ones always are.
	Control bool
	// LStrip and RStrip drop the whitespace before and after a match
	// (LLAMA_TOKEN_ATTR_LSTRIP, _RSTRIP).
	LStrip, RStrip bool
}

// Vocab is the special tokens of a vocabulary, longest first, as llama.cpp
// matches them.
type Vocab struct {
	tokens []Token
}

// NewVocab orders tokens as llama.cpp does: by text length, longest first
// (ties: by id, where llama.cpp's sort leaves them unspecified). Tokens with
// no text never match and are dropped.
func NewVocab(tokens []Token) *Vocab {
	v := &Vocab{}
	for _, t := range tokens {
		if t.Text != "" {
			v.tokens = append(v.tokens, t)
		}
	}
	slices.SortStableFunc(v.tokens, func(a, b Token) int {
		if d := len(b.Text) - len(a.Text); d != 0 {
			return d
		}
		return int(a.ID) - int(b.ID)
	})
	return v
}

// Tokens is the vocabulary's special tokens, longest first.
func (v *Vocab) Tokens() []Token { return slices.Clone(v.tokens) }

// Piece is a special token (Special, ID) or text to tokenize with special
// tokens not parsed.
type Piece struct {
	Special bool
	ID      int32
	Text    string
}

// ErrTooManySpecial: the text holds more special tokens than the limit.
var ErrTooManySpecial = errors.New("too many special tokens")

// Split splits text at the special tokens of v as llama.cpp's tokenizer
// does: for each special token, longest first, every match in the text left
// so far, left to right; parseControl matches control tokens too (llama.cpp's
// parse_special). With a marker, control texts that Protect marked are not
// matched, and the marker is dropped from the text pieces. More than limit
// matches (limit > 0) is ErrTooManySpecial: the prompt cannot fit a context
// of limit tokens.
func (v *Vocab) Split(text string, parseControl bool, m Marker, limit int) ([]Piece, error) {
	frags := []fragment{{raw: true, start: 0, end: len(text)}}
	matches := 0
	for _, tok := range v.tokens {
		if tok.Control && !parseControl {
			continue
		}
		if !strings.Contains(text, tok.Text) {
			continue
		}
		next := make([]fragment, 0, len(frags))
		for _, f := range frags {
			if !f.raw {
				next = append(next, f)
				continue
			}
			n := 0
			next, n = splitFragment(next, text, f, tok)
			if matches += n; limit > 0 && matches > limit {
				return nil, fmt.Errorf("%w: more than %d", ErrTooManySpecial, limit)
			}
		}
		frags = next
	}
	pieces := make([]Piece, 0, len(frags))
	for _, f := range frags {
		if !f.raw {
			pieces = append(pieces, Piece{Special: true, ID: f.id})
			continue
		}
		s := text[f.start:f.end]
		if m != "" {
			s = strings.ReplaceAll(s, string(m), "")
		}
		if s != "" {
			pieces = append(pieces, Piece{Text: s})
		}
	}
	return pieces, nil
}

// fragment is a span of the text: raw text not yet split, or a special token.
type fragment struct {
	raw        bool
	start, end int
	id         int32
}

// splitFragment appends to out the pieces of raw fragment f around every
// match of tok, left to right, and returns how many it matched.
func splitFragment(out []fragment, text string, f fragment, tok Token) ([]fragment, int) {
	n := 0
	start, end := f.start, f.end
	for start < end {
		i := strings.Index(text[start:end], tok.Text)
		if i < 0 {
			break
		}
		match := start + i
		left := match
		if tok.LStrip {
			for left > start && isSpace(text[left-1]) {
				left--
			}
		}
		if left > start {
			out = append(out, fragment{raw: true, start: start, end: left})
		}
		out = append(out, fragment{id: tok.ID})
		n++
		start = match + len(tok.Text)
		if tok.RStrip {
			for start < end && isSpace(text[start]) {
				start++
			}
		}
	}
	if start < end {
		out = append(out, fragment{raw: true, start: start, end: end})
	}
	return out, n
}

// isSpace is C's isspace in the "C" locale, which llama.cpp's strip uses.
func isSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// Marker is a run of private-use characters, random per prompt, that
// Protect puts inside the control-token texts of a message's content so that
// Split leaves them as text.
type Marker string

// NewMarker returns a fresh marker: four characters of Unicode's
// supplementary private use area A, 80 bits of chance that content holds it.
func NewMarker() Marker {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var sb strings.Builder
	for i := range 4 {
		r := rune(0xF0000 | int(b[2*i])<<8 | int(b[2*i+1]))
		if r > 0xFFFFD {
			r = 0xFFFFD
		}
		sb.WriteRune(r)
	}
	return Marker(sb.String())
}

// Protect returns s with m after the first character of every control-token
// text in it, so that none of them matches in Split; the user-defined tokens
// (such as <think>) stay, as Hugging Face's tokenizers match them in any
// text. A chat prompt protects each message's content before the template
// renders it: the template's own markup stays special, what a user typed
// stays text.
func (v *Vocab) Protect(s string, m Marker) string {
	if m == "" || s == "" {
		return s
	}
	var cuts []int // byte offsets to put m at
	for _, tok := range v.tokens {
		if !tok.Control {
			continue
		}
		_, first := utf8.DecodeRuneInString(tok.Text)
		for off := 0; ; {
			i := strings.Index(s[off:], tok.Text)
			if i < 0 {
				break
			}
			cuts = append(cuts, off+i+first)
			off += i + len(tok.Text)
		}
	}
	if len(cuts) == 0 {
		return s
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var sb strings.Builder
	sb.Grow(len(s) + len(cuts)*len(m))
	prev := 0
	for _, c := range cuts {
		sb.WriteString(s[prev:c])
		sb.WriteString(string(m))
		prev = c
	}
	sb.WriteString(s[prev:])
	return sb.String()
}
