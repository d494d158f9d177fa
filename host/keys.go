package host

import (
	"errors"
	"math"
	"strings"
)

var errBadKey = errors.New("key is not a slot id")

// parseSlotKey reads a slot id the way the C++ engine's std::stoi did, so the
// coordinator's keys mean the same here: leading blanks and a sign allowed,
// at least one digit, trailing junk ignored, int32 range.
func parseSlotKey(key string) (int, error) {
	s := strings.TrimLeft(key, " \t\n\v\f\r")
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	n, digits := int64(0), 0
	for ; digits < len(s) && s[digits] >= '0' && s[digits] <= '9'; digits++ {
		n = n*10 + int64(s[digits]-'0')
		if n > math.MaxInt32+1 {
			return 0, errBadKey
		}
	}
	if digits == 0 {
		return 0, errBadKey
	}
	if neg {
		n = -n
	}
	if n > math.MaxInt32 || n < math.MinInt32 {
		return 0, errBadKey
	}
	return int(n), nil
}

// engineKey is the key rule of the engine-wide ops (INFO, CONFIGURE,
// SET_EXPERT_MODE, SWAP_QUANT): a slot id if one parses, else slot 0, since
// clients send "" or a worker name there.
func engineKey(key string) int {
	if n, err := parseSlotKey(key); err == nil {
		return n
	}
	return 0
}
