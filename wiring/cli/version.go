package cli

import (
	"runtime/debug"
	"strings"
)

// version describes the running binary for `kvindex --version`, from the
// build information the Go toolchain embeds: the main module's version
// ("(devel)" for a build from a checkout) and, when the build recorded
// them, the VCS revision, its commit time and whether the tree had local
// changes, as "(devel) (revision 1a2b3c4d5e6f, 2026-11-30T08:00:00Z, modified)".
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information)"
	}
	return describeBuild(info)
}

// describeBuild is version for the given build information.
func describeBuild(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v == "" {
		v = "unknown"
	}
	var rev, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	parts := []string{"revision " + rev}
	if at != "" {
		parts = append(parts, at)
	}
	if modified {
		parts = append(parts, "modified")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}
