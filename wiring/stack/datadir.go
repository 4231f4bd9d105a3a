package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvindex/kvindex/internal/etcdembed"
)

// ErrNestedDataDir reports a Config.DataDir inside another stack's etcd
// data directory or Kafka log directory. The two would not share a lock
// file (each stack locks its own etcd directory), so nothing else would
// stop the second stack from writing its files among the first's.
var ErrNestedDataDir = errors.New("stack: data dir inside another stack's data")

// checkNotNested returns an error wrapping ErrNestedDataDir when dir is,
// or lies inside, a directory an embedded etcd keeps its data in (one
// holding etcdembed.LockFile) or the Kafka log directory beside one (a
// "kafka" directory whose sibling "etcd" holds the lock file). dir may be
// a stack's own data directory (the lock file is in its etcd directory):
// that is a restart, or a second stack the etcd lock refuses.
func checkNotNested(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("stack: data dir %s: %w", dir, err)
	}
	has := func(p string) bool { _, err := os.Stat(p); return err == nil }
	where := func(d string) string {
		if d == abs {
			return dir + " is"
		}
		return dir + " is inside " + d + ","
	}
	for d := abs; ; d = filepath.Dir(d) {
		switch {
		case has(filepath.Join(d, etcdembed.LockFile)):
			return fmt.Errorf("%w: %s an etcd data directory", ErrNestedDataDir, where(d))
		case filepath.Base(d) == "kafka" && has(filepath.Join(filepath.Dir(d), "etcd", etcdembed.LockFile)):
			return fmt.Errorf("%w: %s a stack's Kafka log directory", ErrNestedDataDir, where(d))
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
