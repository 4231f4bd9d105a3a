package cli

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestDescribeBuild(t *testing.T) {
	for _, tc := range []struct {
		name     string
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{name: "release_without_vcs", version: "v1.2.3", want: "v1.2.3"},
		{name: "checkout_with_vcs", version: "(devel)", settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "1a2b3c"}, {Key: "vcs.time", Value: "2026-11-30T08:00:00Z"}, {Key: "vcs.modified", Value: "false"},
		}, want: "(devel) (revision 1a2b3c, 2026-11-30T08:00:00Z)"},
		{name: "modified_tree", version: "(devel)", settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "1a2b3c"}, {Key: "vcs.modified", Value: "true"},
		}, want: "(devel) (revision 1a2b3c, modified)"},
		{name: "no_version", want: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/kvindex/kvindex", Version: tc.version}, Settings: tc.settings}
			if got := describeBuild(info); got != tc.want {
				t.Fatalf("describeBuild = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "kvindex version ") || !strings.Contains(got, version()) {
		t.Fatalf("--version printed %q", got)
	}
}
