package run

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

// TestDecodeField: a field's value decodes into the field of that JSON key,
// an embedded struct's included; a value of the wrong type is the 400
// DecodeJSON gives for a body holding it.
func TestDecodeField(t *testing.T) {
	type Inner struct {
		Temp *float64 `json:"temperature"`
	}
	type hidden struct {
		NMax *int64 `json:"speculative.n_max"`
	}
	type body struct {
		Inner
		hidden
		Stop json.RawMessage `json:"stop"`
		Seed *int64          `json:"seed"`
	}
	var b body
	for k, v := range map[string]string{"temperature": `0.5`, "speculative.n_max": `3`, "stop": `["x"]`, "seed": `null`} {
		if err := DecodeField(&b, k, json.RawMessage(v)); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if b.Temp == nil || *b.Temp != 0.5 || b.NMax == nil || *b.NMax != 3 || string(b.Stop) != `["x"]` || b.Seed != nil {
		t.Errorf("decoded %+v", b)
	}
	for _, c := range []struct{ key, raw string }{
		{"temperature", `"hot"`}, {"temperature", `1e400`}, {"seed", `1.5`}, {"seed", `99999999999999999999`},
	} {
		want := DecodeJSON([]byte(`{"`+c.key+`":`+c.raw+`}`), &body{})
		err := DecodeField(&body{}, c.key, json.RawMessage(c.raw))
		var e, w *Error
		if !errors.As(err, &e) || !errors.As(want, &w) || e.Status != http.StatusBadRequest || *e != *w {
			t.Errorf("%s %s: %#v, want %#v", c.key, c.raw, err, want)
		}
	}
	if err := DecodeField(&body{}, "top_k", json.RawMessage(`1`)); err == nil {
		t.Error("a key of no field is an error")
	}
}
