package common

import "testing"

func TestDisplay(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{name: "plain", in: "team-a/vllm 0@10.0.0.5:8000", want: "team-a/vllm 0@10.0.0.5:8000"},
		{name: "printable_unicode", in: "modèle-日本", want: "modèle-日本"},
		{name: "newline", in: "a\nb", want: `"a\nb"`},
		{name: "nul", in: "a\x00", want: `"a\x00"`},
		{name: "escape_sequence", in: "\x1b[2J", want: `"\x1b[2J"`},
		{name: "invalid_utf8", in: "a\xffb", want: `"a\xffb"`},
		{name: "no_break_space", in: "a\u00a0b", want: `"a\u00a0b"`},
		{name: "leading_quote", in: `"x"`, want: `"\"x\""`},
		{name: "empty", in: "", want: `""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Display(tc.in); got != tc.want {
				t.Fatalf("Display(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}
