package iface

import (
	"fmt"
	"strconv"
	"strings"
)

// Backend options (LoadRequest.Options) are KEY=VALUE strings. Every backend
// reads a value of one kind the same way, so that an option an operator
// writes for one backend means the same for another; a value that does not
// parse is ErrBadRequest naming the option.

// ParseIntOption reads an integer option in [lo, hi].
func ParseIntOption(key, v string, lo, hi int) (int, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: option %s=%q: not an integer", ErrBadRequest, key, v)
	}
	if n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("%w: option %s=%d: out of range [%d, %d]", ErrBadRequest, key, n, lo, hi)
	}
	return int(n), nil
}

// ParseBoolOption reads a boolean option: strconv's forms and on/off (any
// case), as llama-server's flags take on/off beside true/false.
func ParseBoolOption(key, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%w: option %s=%q: not a boolean (true/false, 1/0, on/off)", ErrBadRequest, key, v)
	}
	return b, nil
}

// CommonPrefix is the number of leading tokens a and b share: what a prompt
// can reuse of a slot's sequence (PrefillResult.Reused, at most).
func CommonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
