package host

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestParseSlotKey(t *testing.T) {
	ok := map[string]int{"0": 0, "1": 1, " 3": 3, "+4": 4, "-1": -1, "12abc": 12, "\t7 ": 7, "2147483647": 2147483647}
	for k, want := range ok {
		if got, err := parseSlotKey(k); err != nil || got != want {
			t.Errorf("parseSlotKey(%q) = %d, %v; want %d", k, got, err, want)
		}
	}
	for _, k := range []string{"", " ", "abc", "-", "+", "worker-1", "2147483648", "99999999999999999999"} {
		if _, err := parseSlotKey(k); err == nil {
			t.Errorf("parseSlotKey(%q) accepted", k)
		}
	}
	if engineKey("worker-7") != 0 || engineKey("") != 0 || engineKey("3") != 3 {
		t.Error("engineKey must map a non-numeric key to slot 0")
	}
}

func TestParseSwapQuant(t *testing.T) {
	// §10 vector.
	p := []byte{0x0c, 0x00}
	p = append(p, "Q6_K/experts"...)
	p = append(p, `blk\.5\.ffn_.*_exps`...)
	k, pat, err := parseSwapQuant(p)
	if err != nil || k != "Q6_K/experts" || pat != `blk\.5\.ffn_.*_exps` {
		t.Fatalf("%q %q %v", k, pat, err)
	}
	for _, bad := range [][]byte{nil, {1}, {5, 0, 'a'}, {0xff, 0xff}} {
		if _, _, err := parseSwapQuant(bad); err == nil {
			t.Errorf("% x accepted", bad)
		}
	}
	long := append([]byte{1, 0, 'k'}, strings.Repeat("(", MaxTensorPattern+1)...)
	if _, _, err := parseSwapQuant(long); err == nil || !strings.Contains(err.Error(), "longer than 4096") {
		t.Errorf("a pattern of %d bytes: %v", MaxTensorPattern+1, err)
	}
	if _, _, err := parseSwapQuant(long[:len(long)-1]); err != nil {
		t.Errorf("a pattern of %d bytes: %v", MaxTensorPattern, err)
	}
	if got := abbreviate(strings.Repeat("é", 100)); !strings.HasSuffix(got, "… (200 bytes)") || len(got) > 150 || !utf8.ValidString(got) {
		t.Errorf("abbreviate: %q", got)
	}
}

func tokBytes(ids ...uint32) []byte {
	var b []byte
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

func TestParsePrefill(t *testing.T) {
	r, err := ParsePrefill([]byte(`{"model":"m","stream":false,"n_predict":0,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}]}`), 2, iface.BackendInfo{})
	if err != nil || len(r.Messages) != 2 || r.Messages[1].Content != "hi there" || r.Model != "m" || r.Slot != 2 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = ParsePrefill(tokBytes(1, 2, 3, 4, 5), 0, iface.BackendInfo{})
	if err != nil || len(r.Tokens) != 5 || r.Tokens[4] != 5 {
		t.Fatalf("%+v %v", r, err)
	}
	// A first token whose low byte is '{' is still tokens.
	r, err = ParsePrefill(tokBytes('{', 7), 0, iface.BackendInfo{})
	if err != nil || len(r.Tokens) != 2 || r.Tokens[0] != '{' {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range [][]byte{nil, []byte("{}"), []byte(`{"messages":[]}`), []byte(`{"messages":[{"content":"x"}]}`),
		[]byte(`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`), []byte("abc"), []byte("{bad json"), tokBytes(0x80000000)} {
		if _, err := ParsePrefill(bad, 0, iface.BackendInfo{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseDecode(t *testing.T) {
	d, err := parseDecode([]byte(`{"n_predict":10,"messages":null}`), 1, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.nPredict != 10 || d.prefill != nil {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = parseDecode([]byte(`{"n_predict":3,"messages":[{"role":"user","content":"x"}],"temperature":0.5,"seed":9}`), 1, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.prefill == nil || d.prefill.Slot != 1 || d.sampler.Temperature != 0.5 || d.sampler.Seed != 9 {
		t.Fatalf("%+v %v", d, err)
	}
	// E1: [i32 n_predict] and optional tokens.
	d, err = parseDecode(tokBytes(10), 0, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.nPredict != 10 || d.prefill != nil {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = parseDecode(tokBytes(2, 5, 6), 0, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.nPredict != 2 || len(d.prefill.Tokens) != 2 {
		t.Fatalf("%+v %v", d, err)
	}
	for _, bad := range [][]byte{nil, {1, 2}, []byte(`{}`), []byte(`{"n_predict":-1}`), []byte(`{"n_predict":"x"}`),
		[]byte(`{"n_predict":1,"messages":[]}`), tokBytes(0xffffffff), append(tokBytes(1), 1, 2)} {
		if _, err := parseDecode(bad, 0, NewTunables().Sampler(), iface.BackendInfo{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The meta builder's order and escaping are tested with it, in transport.
func TestPipelineAttachMeta(t *testing.T) {
	if len(pipelineAttachMeta) != 103 {
		t.Fatalf("PIPELINE_ATTACH meta is %d bytes, §10 says 103", len(pipelineAttachMeta))
	}
}

// TestParseDecodeChat: a DECODE body's chat renders as PREFILL's (tools,
// kwargs), its response_format or grammar constrains the tokens, and a
// required tool choice, which DECODE cannot answer as parsed calls, is
// refused.
func TestParseDecodeChat(t *testing.T) {
	body := `{"n_predict":4,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"chat_template_kwargs":{"a":1},"response_format":{"type":"json_object"}}`
	d, err := parseDecode([]byte(body), 2, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.prefill == nil || len(d.prefill.Tools) != 1 || d.prefill.TemplateKwargs != `{"a":1}` ||
		d.output == nil || d.output.JSONSchema != `{"type":"object"}` || d.output.Chat != nil {
		t.Fatalf("%+v (prefill %+v, output %+v) %v", d, d.prefill, d.output, err)
	}
	pre, err := ParsePrefill([]byte(body), 2, iface.BackendInfo{})
	if pre.Model = ""; err != nil || !reflect.DeepEqual(*d.prefill, pre) {
		t.Fatalf("DECODE renders from %+v, PREFILL from %+v (%v)", *d.prefill, pre, err)
	}
	d, err = parseDecode([]byte(`{"n_predict":4,"grammar":"root ::= \"a\""}`), 2, NewTunables().Sampler(), iface.BackendInfo{})
	if err != nil || d.output == nil || d.output.Grammar != `root ::= "a"` {
		t.Fatalf("grammar: %+v %v", d.output, err)
	}
	for _, bad := range []string{
		`{"n_predict":4,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`,
		`{"n_predict":4,"json_schema":{},"grammar":"root ::= \"a\""}`,
		`{"n_predict":4,"response_format":{"type":"yaml"}}`,
	} {
		if _, err := parseDecode([]byte(bad), 0, NewTunables().Sampler(), iface.BackendInfo{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
