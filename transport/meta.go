package transport

import (
	"bytes"
	"encoding/json"
)

// Meta builds a reply's meta: a compact JSON object whose keys keep
// insertion order, as the C++ engine's replies do (clients parse by key, but
// the §10 vectors are byte-exact).
type Meta struct{ buf bytes.Buffer }

// NewMeta starts an empty object.
func NewMeta() *Meta { m := &Meta{}; m.buf.WriteByte('{'); return m }

// Add appends key: value. Values are encoded without HTML escaping; v must
// be JSON-encodable (plain values, slices, maps, structs), else Add panics.
func (m *Meta) Add(key string, v any) *Meta {
	if m.buf.Len() > 1 {
		m.buf.WriteByte(',')
	}
	writeJSON(&m.buf, key)
	m.buf.WriteByte(':')
	writeJSON(&m.buf, v)
	return m
}

// AddFields appends the members of v, which must encode as a JSON object (a
// struct with json tags, such as a model's identity), in their order.
func (m *Meta) AddFields(v any) *Meta {
	var obj bytes.Buffer
	writeJSON(&obj, v)
	b := obj.Bytes()
	if len(b) < 2 || b[0] != '{' {
		panic("transport: meta fields are not a JSON object: " + string(b))
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

// Bytes returns the object, closed; m may be added to afterwards.
func (m *Meta) Bytes() []byte {
	return append(bytes.Clone(m.buf.Bytes()), '}')
}

func writeJSON(buf *bytes.Buffer, v any) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only unsupported types fail; every caller passes plain values.
		panic("transport: meta value not encodable: " + err.Error())
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// ErrorMeta is the meta of an error reply: {"error":msg}.
func ErrorMeta(msg string) []byte { return NewMeta().Add("error", msg).Bytes() }
