package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestEtcdLeaseRulesAsDocumented pins what docs/security.md says etcd
// allows each kvindex role beyond its key permissions, on a real etcd
// with auth on and the two roles as documented: each rule is checked
// both ways, the doc states it and etcd does it. indexd's user writes no
// key, yet grants a lease; both users revoke another application's lease
// that has no keys; neither revokes one whose keys lie outside the prefix.
func TestEtcdLeaseRulesAsDocumented(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(raw)), " ")

	e := testutil.StartEtcd(t)
	ctx := testutil.Context(t, time.Minute)
	root := e.Client
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	prefix := keyspace.Default().Prefix()
	end := clientv3.GetPrefixRangeEnd(prefix)
	must(root.RoleAdd(ctx, ingesterRole))
	must(root.RoleGrantPermission(ctx, ingesterRole, prefix, end, clientv3.PermissionType(clientv3.PermReadWrite)))
	must(root.RoleAdd(ctx, indexdRole))
	must(root.RoleGrantPermission(ctx, indexdRole, prefix, end, clientv3.PermissionType(clientv3.PermRead)))
	for user, role := range map[string]string{"kvindex-ingester": ingesterRole, "kvindex-indexd": indexdRole, "root": "root"} {
		must(root.UserAdd(ctx, user, user+"-password"))
		must(root.UserGrantRole(ctx, user, role))
	}
	// Another application's leases: one with a key outside the prefix,
	// two with none (granted, not yet used).
	keyed, err := root.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	must(root.Put(ctx, "/other-app/session", "x", clientv3.WithLease(keyed.ID)))
	var keyless [2]clientv3.LeaseID
	for i := range keyless {
		l, err := root.Grant(ctx, 3600)
		if err != nil {
			t.Fatal(err)
		}
		keyless[i] = l.ID
	}
	must(root.AuthEnable(ctx))
	login := func(user string) *clientv3.Client {
		t.Helper()
		c, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: testutil.Timeout(5 * time.Second),
			Username: user, Password: user + "-password"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ingester, indexd := login("kvindex-ingester"), login("kvindex-indexd")
	denied := func(err error) bool { return errors.Is(err, rpctypes.ErrPermissionDenied) }

	for _, rule := range []struct {
		name  string
		doc   []string // what docs/security.md says, whitespace folded
		holds func(context.Context) (bool, error)
	}{
		{
			name: "indexd_writes_no_key",
			doc:  []string{"it cannot write or delete a key in etcd"},
			holds: func(ctx context.Context) (bool, error) {
				_, err := indexd.Put(ctx, prefix+"forged", "y")
				return denied(err), err
			},
		},
		{
			name: "indexd_grants_leases",
			doc:  []string{"it can grant leases without limit", "Any authenticated user can grant leases", "Both kvindex users can, indexd's included"},
			holds: func(ctx context.Context) (bool, error) {
				_, err := indexd.Grant(ctx, 60)
				return err == nil, err
			},
		},
		{
			name: "both_revoke_a_foreign_keyless_lease",
			doc:  []string{"both kvindex users can revoke another application's lease that has no keys"},
			holds: func(ctx context.Context) (bool, error) {
				if _, err := indexd.Revoke(ctx, keyless[0]); err != nil {
					return false, err
				}
				_, err := ingester.Revoke(ctx, keyless[1])
				return err == nil, err
			},
		},
		{
			name: "neither_revokes_a_foreign_keyed_lease",
			doc:  []string{"Another application's lease with keys outside the prefix is safe from both"},
			holds: func(ctx context.Context) (bool, error) {
				_, err := indexd.Revoke(ctx, keyed.ID)
				if !denied(err) {
					return false, err
				}
				_, err = ingester.Revoke(ctx, keyed.ID)
				return denied(err), err
			},
		},
	} {
		t.Run(rule.name, func(t *testing.T) {
			for _, s := range rule.doc {
				if !strings.Contains(doc, s) {
					t.Errorf("docs/security.md does not say %q", s)
				}
			}
			if ok, err := rule.holds(ctx); !ok {
				t.Errorf("etcd does not do what docs/security.md says: %v", err)
			}
		})
	}
	// The old claim, which etcd's lease rules contradict.
	if strings.Contains(doc, "it cannot write to etcd") {
		t.Errorf("docs/security.md still says indexd %q", "cannot write to etcd")
	}
}
