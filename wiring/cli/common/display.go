package common

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Display returns s as a table or a text listing shows it: as it is when
// every rune is printable (letters, marks, numbers, punctuation, symbols,
// ASCII space) and it does not start with a double quote; else Go-quoted,
// so a control character in an untrusted name (a model or pod) cannot
// split a row or reach the terminal, and a quoted name cannot be mistaken
// for a plain one. JSON output needs none of this.
func Display(s string) string {
	if s != "" && !strings.HasPrefix(s, `"`) && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return s
	}
	return strconv.Quote(s)
}
