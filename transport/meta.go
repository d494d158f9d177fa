package transport

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Meta builds a reply's meta: a compact JSON object whose keys keep
// insertion order, as the C++ engine's replies do (clients parse by key, but
// the §10 vectors are byte-exact).
type Meta struct {
	buf bytes.Buffer
	err error // the first value that could not be encoded
}

// NewMeta starts an empty object.
func NewMeta() *Meta { m := &Meta{}; m.buf.WriteByte('{'); return m }

// Add appends key: value, encoded without HTML escaping. A value JSON cannot
// hold (a NaN or an infinity, a channel) is left out and recorded in Err, so
// that a reply which cannot be written is an error reply, never a crash.
func (m *Meta) Add(key string, v any) *Meta {
	b, err := encodeJSON(v)
	if err != nil {
		m.fail(fmt.Errorf("meta value %q: %w", key, err))
		return m
	}
	k, _ := encodeJSON(key)
	if m.buf.Len() > 1 {
		m.buf.WriteByte(',')
	}
	m.buf.Write(k)
	m.buf.WriteByte(':')
	m.buf.Write(b)
	return m
}

// AddFields appends the members of v, which must encode as a JSON object (a
// struct with json tags, such as a model's identity), in their order; else
// nothing is added and Err says why.
func (m *Meta) AddFields(v any) *Meta {
	b, err := encodeJSON(v)
	switch {
	case err != nil:
		m.fail(fmt.Errorf("meta fields: %w", err))
		return m
	case len(b) < 2 || b[0] != '{':
		m.fail(fmt.Errorf("meta fields are not a JSON object: %.40s", b))
		return m
	}
	if b = b[1 : len(b)-1]; len(b) == 0 {
		return m
	}
	if m.buf.Len() > 1 {
		m.buf.WriteByte(',')
	}
	m.buf.Write(b)
	return m
}

func (m *Meta) fail(err error) {
	if m.err == nil {
		m.err = err
	}
}

// Err is the first value Add or AddFields could not encode; the meta is then
// not the reply that was meant.
func (m *Meta) Err() error { return m.err }

// Bytes returns the object, closed; m may be added to afterwards.
func (m *Meta) Bytes() []byte {
	return append(bytes.Clone(m.buf.Bytes()), '}')
}

func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil // Encode's newline
}

// ErrorMeta is the meta of an error reply: {"error":msg}.
func ErrorMeta(msg string) []byte { return NewMeta().Add("error", msg).Bytes() }
