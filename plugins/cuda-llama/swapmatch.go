package cudallama

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
)

// matchWeights is the indices of the weight names that pattern matches
// anywhere in them (searched, as llama.cpp's tensor overrides search). The
// pattern is Go's regexp (RE2 syntax: no backreferences or lookaround), so
// matching takes time linear in the names whatever the pattern, and one
// nested too deeply to compile is refused; std::regex, which matched
// before, backtracks exponentially on (.*)*… and overflows its stack on
// 50,000 nested groups.
func matchWeights(pattern string, names []string) ([]int, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		// regexp's error quotes the part at fault whole: it may be the
		// whole pattern, up to 4 KiB of it.
		why := err.Error()
		if se := (*syntax.Error)(nil); errors.As(err, &se) {
			why = fmt.Sprintf("%s: %q", se.Code, truncate(se.Expr, 40))
		}
		return nil, fmt.Errorf("%q is not a regular expression (Go's RE2 syntax: no backreferences or lookaround): %s",
			truncate(pattern, 80), why)
	}
	var hit []int
	for i, n := range names {
		if re.MatchString(n) {
			hit = append(hit, i)
		}
	}
	return hit, nil
}

// truncate is s cut to n bytes, marked when cut, for messages.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
