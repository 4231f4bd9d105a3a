// Package doccheck holds a test that keeps the house rule "every exported
// identifier has a doc comment, every package has a package doc" true for
// the whole module. It has no code of its own.
package doccheck
