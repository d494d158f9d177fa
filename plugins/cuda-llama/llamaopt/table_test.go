package llamaopt

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A default written as a value must be the default: the option set to it
// parses to the options of none set.
func TestTableDefaults(t *testing.T) {
	none, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range table {
		if o.doc == "" || o.def == "" {
			t.Errorf("%s: no help or no default", o.key)
		}
		if descriptive(o) {
			continue
		}
		got, err := Parse(map[string]string{o.key: o.def})
		if err != nil || !reflect.DeepEqual(got, none) {
			t.Errorf("%s=%s is not the default: %+v, %v", o.key, o.def, got, err)
		}
	}
}

// descriptive says whether a default is told in words, or as another
// option's value, rather than as a value the option takes.
func descriptive(o option) bool {
	_, another := optionParsers[o.def] // the default is another option's value
	// combined_pattern's is applied at load; the parsed field stays empty.
	return strings.ContainsAny(o.def, " '") || o.def == "none" || another || o.key == OptCombinedPattern
}

// Every key in the table is in the plugin's README's table of options, and
// every key there is one the table parses.
func TestTableMatchesREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	start := strings.Index(sec, "## Options (`--backend-opt key=value`)")
	if start < 0 {
		t.Fatal("README.md has no options section")
	}
	sec = sec[start:]
	sec = sec[:strings.Index(sec, "|\n\n")+1] // the first table
	var documented []string
	for _, row := range regexp.MustCompile(`(?m)^\| ([^|]+) \|`).FindAllStringSubmatch(sec, -1) {
		for _, k := range regexp.MustCompile("`([A-Za-z_.]+)`").FindAllStringSubmatch(row[1], -1) {
			documented = append(documented, k[1])
		}
	}
	help := Help()
	for _, o := range table {
		key := o.key
		if slices.Contains(prefixes, key) {
			key += "KEY"
		}
		if !slices.Contains(documented, key) && !slices.Contains(documented, strings.TrimPrefix(key, "spec_ngram_simple")) &&
			!slices.Contains(documented, strings.TrimPrefix(key, "spec_ngram_map_k")) {
			t.Errorf("%s is not in README.md's table of options", key)
		}
		if !strings.Contains(help, "  "+key+" ") || !strings.Contains(help, o.doc+" (default: "+o.def+")") {
			t.Errorf("%s is not in Help", key)
		}
	}
	for _, k := range documented {
		if err := applyOption(&Options{}, k, ""); err != nil && strings.Contains(err.Error(), "unknown option") && !strings.HasPrefix(k, "_size") {
			t.Errorf("README.md documents %s, which no option parses", k)
		}
	}
}
