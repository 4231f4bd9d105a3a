// Package celltest holds the in-process tests of kvindex's cells
// (docs/DESIGN.md "Cells"): several real cells (an embedded etcd, an
// ingester and an indexd each, one kfake broker with a topic per cell)
// against a single-cell reference fed the same records.
package celltest
