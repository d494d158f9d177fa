package pluginproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PluginSpec is how to start a backend plugin process.
type PluginSpec struct {
	Name string   // backend name, for logs
	Path string   // executable
	Args []string // arguments after the executable
	// Variant is the x86-64 level of the executable ResolvePlugin chose
	// among the builds beside hydra-plugin-NAME ("x86-64-v3"; "x86-64" for
	// the baseline), and VariantWhy why, for the log; both are empty where
	// there was nothing to choose (no variants, or a path given).
	Variant, VariantWhy string
}

// EmbeddedPluginArg is the argument with which the engine binary re-executes
// itself as its built-in mock backend.
const EmbeddedPluginArg = "__plugin"

// VariantLevels are the x86-64 levels a plugin may be built for beside its
// baseline, best first: hydra-plugin-NAME.x86-64-v4 and so on.
var VariantLevels = []CPULevel{LevelV4, LevelV3, LevelV2}

// ResolvePlugin turns --backend into a command: a value with a path
// separator is an executable, run as named; a name resolves to
// hydra-plugin-NAME in pluginDir, then beside the engine binary, and where
// builds of it for x86-64 levels lie beside it (hydra-plugin-NAME.x86-64-v3,
// …), to the best one this CPU runs. The mock falls back to the copy
// embedded in the engine binary, so a lone engine binary runs.
func ResolvePlugin(backend, pluginDir string) (PluginSpec, error) {
	return resolvePlugin(backend, pluginDir, DetectCPU())
}

func resolvePlugin(backend, pluginDir string, host HostCPU) (PluginSpec, error) {
	if backend == "" {
		return PluginSpec{}, errors.New("no backend given")
	}
	if strings.ContainsRune(backend, os.PathSeparator) {
		p, err := filepath.Abs(backend)
		if err != nil {
			return PluginSpec{}, err
		}
		if err := checkExecutable(p); err != nil {
			return PluginSpec{}, err
		}
		return PluginSpec{Name: strings.TrimPrefix(filepath.Base(p), "hydra-plugin-"), Path: p}, nil
	}
	self, err := os.Executable()
	if err != nil {
		return PluginSpec{}, err
	}
	file := "hydra-plugin-" + backend
	var dirs []string
	if pluginDir != "" {
		dirs = append(dirs, pluginDir)
	}
	dirs = append(dirs, filepath.Dir(self))
	for _, d := range dirs {
		p, err := filepath.Abs(filepath.Join(d, file))
		if err != nil {
			continue
		}
		if checkExecutable(p) == nil {
			return chooseVariant(PluginSpec{Name: backend, Path: p}, host), nil
		}
	}
	if backend == "mock" {
		return PluginSpec{Name: backend, Path: self, Args: []string{EmbeddedPluginArg, "mock"}}, nil
	}
	return PluginSpec{}, fmt.Errorf("backend %q: no executable %s in %s", backend, file, strings.Join(dirs, " or "))
}

// chooseVariant replaces the baseline executable with the build beside it
// for the highest x86-64 level host runs, falling back level by level to the
// baseline: a variant compiled for a level the CPU lacks dies of an illegal
// instruction, and one that is missing or not executable is skipped.
func chooseVariant(spec PluginSpec, host HostCPU) PluginSpec {
	var present, skipped []string
	found := map[CPULevel]string{}
	for _, l := range VariantLevels {
		p := spec.Path + "." + l.String()
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := checkExecutable(p); err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		found[l] = p
		present = append(present, l.String())
	}
	if len(present) == 0 && len(skipped) == 0 {
		return spec // a plugin without variants: nothing to choose, nothing to log
	}
	why := "CPU " + host.describe() + "; variants present: " + orNone(present)
	if len(skipped) > 0 {
		why += "; skipped: " + strings.Join(skipped, "; ")
	}
	spec.Variant = LevelV1.String()
	for _, l := range VariantLevels {
		if l > host.Level {
			continue
		}
		if p, ok := found[l]; ok {
			spec.Path, spec.Variant = p, l.String()
			break
		}
	}
	switch {
	case host.Level == LevelUnknown:
		why += "; not an x86-64 CPU: the baseline"
	case spec.Variant == LevelV1.String():
		why += "; none at or below the CPU's level: the baseline"
	case spec.Variant == host.Level.String():
		why += "; the CPU's own level"
	default:
		why += "; none for " + host.Level.String() + ": the next lower one"
	}
	spec.VariantWhy = why
	return spec
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}
