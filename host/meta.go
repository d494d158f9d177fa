package host

import (
	"bytes"
	"encoding/json"

	"github.com/hydra-engine/hydra-engine/iface"
)

// meta builds a compact JSON object whose keys keep insertion order, as the
// C++ engine's replies do (clients parse by key, but the §10 vectors are
// byte-exact).
type meta struct{ buf bytes.Buffer }

func newMeta() *meta { m := &meta{}; m.buf.WriteByte('{'); return m }

// add appends key: value. Values are encoded without HTML escaping.
func (m *meta) add(key string, v any) *meta {
	if m.buf.Len() > 1 {
		m.buf.WriteByte(',')
	}
	writeJSON(&m.buf, key)
	m.buf.WriteByte(':')
	writeJSON(&m.buf, v)
	return m
}

// identity appends the model identity fields.
func (m *meta) identity(id iface.ModelIdentity) *meta {
	return m.add("model_alias", id.Alias).add("model_hash", id.Hash).add("model_path", id.Path)
}

func (m *meta) bytes() []byte {
	b := append(bytes.Clone(m.buf.Bytes()), '}')
	return b
}

func writeJSON(buf *bytes.Buffer, v any) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only unsupported types fail; every caller passes plain values.
		panic("host: meta value not encodable: " + err.Error())
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// errorMeta is the meta of an error reply.
func errorMeta(msg string) []byte { return newMeta().add("error", msg).bytes() }
