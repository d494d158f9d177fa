package transport

import "testing"

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
