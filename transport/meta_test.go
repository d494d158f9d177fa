package transport

import (
	"math"
	"strings"
	"testing"
)

func TestMetaOrderAndEscaping(t *testing.T) {
	got := string(NewMeta().Add("success", true).Add("state_chunk_size_applied", uint64(2097152)).Bytes())
	if got != `{"success":true,"state_chunk_size_applied":2097152}` {
		t.Fatal(got)
	}
	if got := string(NewMeta().Add("t", "<a&b>").Bytes()); got != `{"t":"<a&b>"}` {
		t.Fatal(got)
	}
	if got := string(NewMeta().Bytes()); got != `{}` {
		t.Fatal(got)
	}
	id := struct {
		Alias string `json:"model_alias"`
		Hash  string `json:"model_hash"`
		Path  string `json:"model_path"`
	}{"mock", "ab", "/m"}
	m := NewMeta().Add("n_past", 3).AddFields(id)
	if got := string(m.Bytes()); got != `{"n_past":3,"model_alias":"mock","model_hash":"ab","model_path":"/m"}` {
		t.Fatal(got)
	}
	// Bytes does not close m for good.
	if got := string(m.Add("x", nil).Bytes()); got != `{"n_past":3,"model_alias":"mock","model_hash":"ab","model_path":"/m","x":null}` {
		t.Fatal(got)
	}
	if got := string(NewMeta().AddFields(struct{}{}).AddFields(map[string]int{"b": 2, "a": 1}).Bytes()); got != `{"a":1,"b":2}` {
		t.Fatal(got)
	}
	if got := string(ErrorMeta(`bad "key"`)); got != `{"error":"bad \"key\""}` {
		t.Fatal(got)
	}
}

// TestMetaUnencodableValue: a value JSON cannot hold is left out and
// reported, and the object stays valid JSON.
func TestMetaUnencodableValue(t *testing.T) {
	m := NewMeta().Add("a", 1).Add("t", float32(math.Inf(1))).Add("b", "x").AddFields(make(chan int))
	if err := m.Err(); err == nil || !strings.Contains(err.Error(), `"t"`) {
		t.Fatalf("Err() = %v, want one naming \"t\"", err)
	}
	if got := string(m.Bytes()); got != `{"a":1,"b":"x"}` {
		t.Fatalf("Bytes() = %s", got)
	}
	if err := NewMeta().AddFields([]int{1}).Err(); err == nil {
		t.Fatal("AddFields of an array: no error")
	}
}
