package request

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestIDArray(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int64
		ok   bool
	}{
		{"[1,2,3]", []int64{1, 2, 3}, true},
		{" [ 0 ,\n\t-7 , 151668 ] ", []int64{0, -7, 151668}, true},
		{"[]", []int64{}, true},
		{"[-0]", []int64{0}, true},
		{"[999999999999999999]", []int64{999999999999999999}, true},
		{"[1000000000000000000]", nil, false}, // 19 digits: encoding/json decides
		{"[1.0]", nil, false},
		{"[1e3]", nil, false},
		{"[01]", nil, false},
		{"[1,]", nil, false},
		{"[,1]", nil, false},
		{"[1 2]", nil, false},
		{"[1", nil, false},
		{"[1]x", nil, false},
		{`[1,"a"]`, nil, false},
		{"[null]", nil, false},
		{"[-]", nil, false},
		{`"text"`, nil, false},
		{"", nil, false},
	} {
		got, ok := IDArray([]byte(c.in))
		if ok != c.ok || ok && !slices.Equal(got, c.want) {
			t.Errorf("IDArray(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// FuzzIDArray: whatever IDArray reads, encoding/json reads alike.
func FuzzIDArray(f *testing.F) {
	for _, s := range []string{"[1,2,3]", " [ 0 , -7 ] ", "[]", "[1.5]", "[01]", `[1,"a"]`, "[1e2]", strings.Repeat("[", 3)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := IDArray(raw)
		if !ok {
			return
		}
		var want []int64
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("IDArray read %q as %v; encoding/json refuses it: %v", raw, got, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("IDArray(%q) = %v; encoding/json reads %v", raw, got, want)
		}
	})
}
