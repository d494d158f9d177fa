package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Encode is the token ids of pieces as llama_tokenize with add_special gives
// them for the text the pieces were split from: prefix (what the vocabulary
// adds at the start: BOS, CLS), each text piece through text (llama_tokenize
// of that piece alone, special tokens not parsed, nothing added), each
// special piece as its id, then suffix (EOS, SEP). llama.cpp tokenizes every
// text fragment of its own partition on its own too, so the ids are the same
// as one call's wherever the partition is.
func Encode(pieces []Piece, prefix, suffix []int32, text func(string) ([]int32, error)) ([]int32, error) {
	out := slices.Clone(prefix)
	for _, p := range pieces {
		if p.Special {
			out = append(out, p.ID)
			continue
		}
		ids, err := text(p.Text)
		if err != nil {
			return nil, err
		}
		out = append(out, ids...)
	}
	return append(out, suffix...), nil
}

// MinTokens is the fewest tokens pieces can take when no token stands for
// more than maxBytes bytes of text (0: not known, text counted as no
// tokens): one per special, a text piece's bytes over maxBytes rounded up.
func MinTokens(pieces []Piece, maxBytes int) int {
	n := 0
	for _, p := range pieces {
		switch {
		case p.Special:
			n++
		case maxBytes > 0:
			n += (len(p.Text) + maxBytes - 1) / maxBytes
		}
	}
	return n
}

// Around finds the tokens a tokenizer adds around a text: with is the text's
// ids with them added, without its ids alone; prefix and suffix are what
// with holds before and after without. ok is false when without is not a
// run of with (no tokenizer this plugin knows does that).
func Around(with, without []int32) (prefix, suffix []int32, ok bool) {
	if len(without) == 0 {
		return nil, nil, false
	}
	for i := 0; i+len(without) <= len(with); i++ {
		if slices.Equal(with[i:i+len(without)], without) {
			return slices.Clone(with[:i]), slices.Clone(with[i+len(without):]), true
		}
	}
	return nil, nil, false
}

// ProtectJSON is raw, a JSON value a template parses (a tool definition, a
// tool call's arguments), with every string in it, object keys included,
// protected as Protect does, so that the control tokens a request spells in
// it stay text once the template writes it out; escapes (\u003c) are decoded
// first, so they cannot hide a control token. Keys keep their order and
// numbers their digits; raw comes back unchanged when no string held a
// control token.
func (v *Vocab) ProtectJSON(raw []byte, m Marker) ([]byte, error) {
	if m == "" {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	w := jsonWriter{v: v, m: m, dec: dec}
	if err := w.value(0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("JSON: data after the value")
	}
	if !w.changed {
		return raw, nil
	}
	return w.out.Bytes(), nil
}

// maxJSONDepth is encoding/json's own nesting limit, which its Decoder's
// Token does not apply: deeper input would only grow the stack.
const maxJSONDepth = 10000

// jsonWriter re-writes a JSON value token by token with its strings
// protected.
type jsonWriter struct {
	v       *Vocab
	m       Marker
	dec     *json.Decoder
	out     bytes.Buffer
	changed bool
}

// value copies one JSON value, depth containers deep.
func (w *jsonWriter) value(depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("JSON: nested more than %d deep", maxJSONDepth)
	}
	tok, err := w.dec.Token()
	if err != nil {
		return fmt.Errorf("JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim: // '{' or '[': Token checks the closing ones match
		w.out.WriteByte(byte(t))
		for i := 0; w.dec.More(); i++ {
			if i > 0 {
				w.out.WriteByte(',')
			}
			if t == '{' {
				k, err := w.dec.Token()
				if err != nil {
					return fmt.Errorf("JSON: %w", err)
				}
				w.str(k.(string)) // Token returns object keys as strings
				w.out.WriteByte(':')
			}
			if err := w.value(depth + 1); err != nil {
				return err
			}
		}
		end, err := w.dec.Token()
		if err != nil {
			return fmt.Errorf("JSON: %w", err)
		}
		w.out.WriteByte(byte(end.(json.Delim)))
	case string:
		w.str(t)
	case json.Number:
		w.out.WriteString(t.String())
	case bool:
		w.out.WriteString(fmt.Sprint(t))
	case nil:
		w.out.WriteString("null")
	}
	return nil
}

// str writes s protected, as a JSON string.
func (w *jsonWriter) str(s string) {
	p := w.v.Protect(s, w.m)
	w.changed = w.changed || p != s
	writeJSONString(&w.out, p)
}

// writeJSONString writes s as a JSON string, <, > and & as they are (a
// template may write the text out again; HTML escapes would be noise).
func writeJSONString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a Go string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

// ProtectValue is x, a value encoding/json decoded (template variables a
// request sends), with every string in it, map keys included, protected as
// Protect does; other values stay as they are.
func (v *Vocab) ProtectValue(x any, m Marker) any {
	if m == "" {
		return x
	}
	switch t := x.(type) {
	case string:
		return v.Protect(t, m)
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = v.ProtectValue(e, m)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[v.Protect(k, m)] = v.ProtectValue(e, m)
		}
		return out
	}
	return x
}
