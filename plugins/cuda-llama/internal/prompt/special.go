// Package prompt turns a rendered prompt into the pieces llama.cpp tokenizes:
// it splits the text at the vocabulary's special tokens as llama.cpp's
// tokenizer does before BPE (llama_vocab::impl::tokenizer_st_partition), and
// leaves the control tokens a chat message's content spells out as text.
//
// llama.cpp's own split walks a linked list from its head for every match,
// so its time grows with the square of the special tokens in a prompt
// (80,000 of them: minutes of CPU); Split finds the special tokens in one
// pass over the text (a trie of their texts), splits at those present, each
// in one walk over the fragments, and stops at a limit of matches.
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
// matches them, and a trie of their texts that finds every occurrence of
// all of them in one pass over a text (time: the text's length times the
// longest prefix of a token it holds at one place), where a search per
// token would scan the text once for each (Llama 3 has 256).
type Vocab struct {
	tokens []Token
	root   [256]int32 // the trie node after each first byte; 0: none
	nodes  []node     // nodes[0] is unused: 0 means no node
}

// node is a trie node: the tokens whose text ends here (indices into
// tokens) and the nodes one byte further.
type node struct {
	ends []int32
	next []edge
}

type edge struct {
	b  byte
	to int32
}

// child is the node after b, 0 if none.
func (n *node) child(b byte) int32 {
	for _, e := range n.next {
		if e.b == b {
			return e.to
		}
	}
	return 0
}

// add puts token i's text into the trie.
func (v *Vocab) add(i int) {
	text := v.tokens[i].Text
	n := v.root[text[0]]
	if n == 0 {
		n = int32(len(v.nodes))
		v.nodes = append(v.nodes, node{})
		v.root[text[0]] = n
	}
	for k := 1; k < len(text); k++ {
		c := v.nodes[n].child(text[k])
		if c == 0 {
			c = int32(len(v.nodes))
			v.nodes = append(v.nodes, node{})
			v.nodes[n].next = append(v.nodes[n].next, edge{text[k], c})
		}
		n = c
	}
	v.nodes[n].ends = append(v.nodes[n].ends, int32(i))
}

// occurrences is, for each token that want keeps, the byte offsets of all
// its occurrences in text, overlapping ones included, ascending; nil for a
// token that does not occur.
func (v *Vocab) occurrences(text string, want func(Token) bool) [][]int {
	var occ [][]int
	for i := 0; i < len(text); i++ {
		n := v.root[text[i]]
		for j := i + 1; n != 0; j++ {
			for _, t := range v.nodes[n].ends {
				if want(v.tokens[t]) {
					if occ == nil {
						occ = make([][]int, len(v.tokens))
					}
					occ[t] = append(occ[t], i)
				}
			}
			if j == len(text) {
				break
			}
			n = v.nodes[n].child(text[j])
		}
	}
	return occ
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
	v.nodes = make([]node, 1, 1+len(v.tokens))
	for i := range v.tokens {
		v.add(i)
	}
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
	occ := v.occurrences(text, func(t Token) bool { return parseControl || !t.Control })
	for i, tok := range v.tokens {
		if occ == nil || len(occ[i]) == 0 {
			continue
		}
		next := make([]fragment, 0, len(frags))
		at := occ[i]
		for _, f := range frags {
			if !f.raw {
				next = append(next, f)
				continue
			}
			n := 0
			next, at, n = splitFragment(next, text, f, tok, at)
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
// match of tok, left to right, as repeated searches from the end of the last
// match find them; at is tok's occurrences in the text from f on
// (ascending), and what is left of them after f is returned with the number
// of matches.
func splitFragment(out []fragment, text string, f fragment, tok Token, at []int) ([]fragment, []int, int) {
	n := 0
	start, end := f.start, f.end
	for len(at) > 0 && at[0] < start {
		at = at[1:]
	}
	for ; len(at) > 0 && at[0]+len(tok.Text) <= end; at = at[1:] {
		match := at[0]
		if match < start { // overlaps the last match, or in the whitespace it stripped
			continue
		}
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
	return out, at, n
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
	for i, at := range v.occurrences(s, func(t Token) bool { return t.Control }) {
		if len(at) == 0 {
			continue
		}
		_, first := utf8.DecodeRuneInString(v.tokens[i].Text)
		for _, off := range at {
			cuts = append(cuts, off+first)
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
