package chattmpl

import (
	"strconv"
	"strings"
	"time"
)

// strftime formats t like Python's time.strftime on Linux (glibc), which is
// what chat templates are written against: the C-locale directives, the "-"
// flag that drops padding (%-d), and an unknown directive kept as written.
// It walks the format itself rather than translating it into a Go layout,
// because literal text in the format ("Cutoff 2024") is not a layout.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		j := i + 1
		noPad := format[j] == '-' && j+1 < len(format)
		if noPad {
			j++
		}
		if s, ok := directive(t, format[j], noPad); ok {
			b.WriteString(s)
		} else {
			b.WriteString(format[i : j+1])
		}
		i = j
	}
	return b.String()
}

// directive is one conversion, ok false for one it does not know.
func directive(t time.Time, c byte, noPad bool) (string, bool) {
	switch c {
	case 'a':
		return t.Format("Mon"), true
	case 'A':
		return t.Format("Monday"), true
	case 'b', 'h':
		return t.Format("Jan"), true
	case 'B':
		return t.Format("January"), true
	case 'p':
		return t.Format("PM"), true
	case 'Z':
		return t.Format("MST"), true
	case 'z':
		return t.Format("-0700"), true
	case 'Y':
		return strconv.Itoa(t.Year()), true
	case '%':
		return "%", true
	}
	if n, width, ok := number(t, c); ok {
		return pad(n, width, noPad), true
	}
	return "", false
}

// number is a numeric conversion's value and its padded width.
func number(t time.Time, c byte) (n, width int, ok bool) {
	switch c {
	case 'd':
		return t.Day(), 2, true
	case 'e':
		return t.Day(), -2, true // space-padded
	case 'm':
		return int(t.Month()), 2, true
	case 'y':
		return t.Year() % 100, 2, true
	case 'H':
		return t.Hour(), 2, true
	case 'I':
		return (t.Hour()+11)%12 + 1, 2, true
	case 'M':
		return t.Minute(), 2, true
	case 'S':
		return t.Second(), 2, true
	case 'j':
		return t.YearDay(), 3, true
	case 'w':
		return int(t.Weekday()), 1, true
	}
	return 0, 0, false
}

// pad writes n zero-padded to width (space-padded for a negative width),
// or bare with the "-" flag.
func pad(n, width int, noPad bool) string {
	s := strconv.Itoa(n)
	if noPad {
		return s
	}
	fill := "0"
	if width < 0 {
		fill, width = " ", -width
	}
	if len(s) < width {
		s = strings.Repeat(fill, width-len(s)) + s
	}
	return s
}
