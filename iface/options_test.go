package iface

import (
	"errors"
	"testing"
)

func TestParseOptions(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
		ok   bool
	}{{"on", true, true}, {"OFF", false, true}, {" true ", true, true}, {"0", false, true}, {"1", true, true}, {"yes", false, false}, {"", false, false}} {
		got, err := ParseBoolOption("k", c.v)
		if (err == nil) != c.ok || got != c.want || err != nil && !errors.Is(err, ErrBadRequest) {
			t.Errorf("ParseBoolOption(%q) = %v, %v", c.v, got, err)
		}
	}
	for _, c := range []struct {
		v    string
		want int
		ok   bool
	}{{"5", 5, true}, {" 7", 7, true}, {"-1", -1, true}, {"-2", 0, false}, {"11", 0, false}, {"x", 0, false}, {"1e3", 0, false}} {
		got, err := ParseIntOption("k", c.v, -1, 10)
		if (err == nil) != c.ok || got != c.want || err != nil && !errors.Is(err, ErrBadRequest) {
			t.Errorf("ParseIntOption(%q) = %v, %v", c.v, got, err)
		}
	}
	for _, c := range []struct {
		a, b []int32
		n    int
	}{{nil, nil, 0}, {[]int32{1, 2, 3}, []int32{1, 2, 4}, 2}, {[]int32{1, 2}, []int32{1, 2, 3}, 2}, {[]int32{9}, []int32{1}, 0}} {
		if got := CommonPrefix(c.a, c.b); got != c.n {
			t.Errorf("CommonPrefix(%v, %v) = %d, want %d", c.a, c.b, got, c.n)
		}
	}
}
