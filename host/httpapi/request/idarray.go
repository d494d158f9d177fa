package request

// IDArray reads raw as a JSON array of integers in one pass, the shape of a
// prompt given as token ids; ok is false for anything else (floats,
// exponents, strings, nulls, more than 18 digits, bad JSON), which the
// caller reads with encoding/json instead. encoding/json reads a long
// prompt of ids slowly, and the paths that check a prompt took several
// passes: this one reads it at memory speed.
func IDArray(raw []byte) (ids []int64, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	ids = make([]int64, 0, len(raw)/7)
	if i < len(raw) && raw[i] == ']' {
		return ids, skipSpace(raw, i+1) == len(raw)
	}
	for {
		var v int64
		if v, i, ok = readInt(raw, i); !ok {
			return nil, false
		}
		ids = append(ids, v)
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return ids, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// readInt reads a JSON integer at raw[i:]: an optional minus, then 0 or a
// digit 1–9 followed by at most 17 more digits; ok is false where a fraction
// or exponent follows (the number is not an integer literal).
func readInt(raw []byte, i int) (v int64, next int, ok bool) {
	neg := i < len(raw) && raw[i] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
		v = v*10 + int64(raw[i]-'0')
		i++
	}
	n := i - start
	if n == 0 || n > 18 || n > 1 && raw[start] == '0' {
		return 0, i, false
	}
	if i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E') {
		return 0, i, false
	}
	if neg {
		v = -v
	}
	return v, i, true
}

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}
