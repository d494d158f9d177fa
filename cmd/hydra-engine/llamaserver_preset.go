package main

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

// llama-server's router mode reads model presets from an INI file
// (--models-preset): sections named after models, [*] for options every
// model shares, lines "key = value" with keys that are llama-server's
// parameters without their dashes, comments after ; or #. This is its
// grammar (llama.cpp's common/preset.cpp), read with the standard library:
// the format is a few line shapes, not worth a dependency.

// presetFile is a parsed presets file.
type presetFile struct {
	global  map[string]string            // [*]
	presets map[string]map[string]string // section → key → value; "default" holds keys before any section
}

// names are the presets' names, sorted.
func (f presetFile) names() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for n := range f.presets {
			if !yield(n) {
				return
			}
		}
	})
}

// presetKey is llama.cpp's ident: a letter or '_', then letters, digits,
// '_', '.', '-'.
var presetKey = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_.-]*$`)

// readPresetFile parses the presets file at path; a line of no known shape
// is an error naming it.
func readPresetFile(path string) (presetFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return presetFile{}, err
	}
	f := presetFile{global: map[string]string{}, presets: map[string]map[string]string{}}
	section := "default"
	for n, line := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n") {
		line = strings.TrimSpace(stripPresetComment(line))
		switch {
		case line == "":
		case strings.HasPrefix(line, "["):
			name, ok := strings.CutSuffix(line[1:], "]")
			if name = strings.TrimSpace(name); !ok || name == "" || strings.ContainsAny(name, "[]") {
				return presetFile{}, fmt.Errorf("%s:%d: %q is not a [section] header", path, n+1, line)
			}
			section = name
			f.section(section)
		default:
			key, value, ok := strings.Cut(line, "=")
			if key = strings.TrimSpace(key); !ok || !presetKey.MatchString(key) {
				return presetFile{}, fmt.Errorf("%s:%d: %q is not key = value (a key is a llama-server parameter without its dashes)", path, n+1, line)
			}
			f.section(section)[key] = strings.TrimSpace(value)
		}
	}
	return f, nil
}

// section is the options of the named section, [*] being the global ones.
func (f presetFile) section(name string) map[string]string {
	if name == "*" {
		return f.global
	}
	if f.presets[name] == nil {
		f.presets[name] = map[string]string{}
	}
	return f.presets[name]
}

// stripPresetComment cuts a line at its first ';' or '#', which starts a
// comment wherever it is in llama.cpp's grammar (a value ends before it).
func stripPresetComment(line string) string {
	if i := strings.IndexAny(line, ";#"); i >= 0 {
		return line[:i]
	}
	return line
}

// modelPreset is a model the engine can switch to when a request names its
// alias: the file, and the backend options it loads with.
type modelPreset struct {
	alias string
	model string
	opts  map[string]string
}

// presetsOf turns a presets file into models to switch to: each section's
// keys (over [*]'s) read as llama-server's parameters would be, over base,
// the backend options of the command line. A section's name is its alias
// unless it sets alias.
func presetsOf(f presetFile, base map[string]string) ([]modelPreset, error) {
	var out []modelPreset
	for _, name := range f.names() {
		if _, model := f.presets[name]["model"]; name == "default" && !model {
			continue // the file's header (version = 1), no model
		}
		keys := maps.Clone(f.global)
		maps.Copy(keys, f.presets[name])
		ls, err := readLlamaServerArgs(presetArgs(keys))
		if err != nil {
			return nil, fmt.Errorf("preset [%s]: %w", name, err)
		}
		if ls.rpcEngine != "" || ls.ggmlRPCPort != "" { // the engine's, kept by no model's load
			return nil, fmt.Errorf("preset [%s]: rpc-engine and ggml-rpc-port are the engine's, not a model's: give them on the command line", name)
		}
		p := modelPreset{alias: name, opts: maps.Clone(base)}
		if p.opts == nil {
			p.opts = map[string]string{}
		}
		maps.Copy(p.opts, ls.opts)
		if m, ok := ls.settings["model"].(string); ok {
			p.model = m
		}
		if p.model == "" {
			return nil, fmt.Errorf("preset [%s] names no model (model = PATH.gguf)", name)
		}
		if a := p.opts["alias"]; a != "" {
			p.alias = a
		} else {
			p.opts["alias"] = name
		}
		out = append(out, p)
	}
	return out, nil
}

// presetArgs is a section's keys as a command line: --key value, a "true"
// boolean bare, in sorted order.
func presetArgs(keys map[string]string) []string {
	var args []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		switch v := keys[k]; strings.ToLower(v) {
		case "true":
			args = append(args, "--"+k)
		default:
			args = append(args, "--"+k, v)
		}
	}
	return args
}
