package pgcluster

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// asRoot skips the test unless the process runs as root, and fails it
// under CI=true, where it must run; why says what needs root.
func asRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs root (%s): run CI as root", why)
	}
	t.Skipf("SKIPPED: runs as root only (%s)", why)
}

// publicTempDir points the temporary directory (where clusters and mirrors
// go) at a fresh directory of its own that every user may enter, so that
// the test sees only its own mirrors.
func publicTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-mirror-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", dir)
	return dir
}

// linkedTree makes, in a directory only root may enter, a tree whose bin
// holds links to the installed PostgreSQL's initdb, pg_ctl and postgres:
// a tree the server's user cannot reach, which the mirror (a copy, links
// and all) makes runnable.
func linkedTree(t *testing.T, name string) string {
	t.Helper()
	sys, err := SystemBinDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this test runs the installed PostgreSQL: %v", err)
		}
		t.Skipf("SKIPPED: this test runs the installed PostgreSQL: %v", err)
	}
	hidden, err := os.MkdirTemp("", "pgcluster-private-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hidden) })
	tree := filepath.Join(hidden, name)
	if err := os.MkdirAll(filepath.Join(tree, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if err := os.Symlink(filepath.Join(sys, b), filepath.Join(tree, "bin", b)); err != nil {
			t.Fatal(err)
		}
	}
	return tree
}

func answers(t *testing.T, ctx context.Context, c *Cluster) {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatal(err)
	}
}

// As root, two clusters of a tree the server's user cannot reach share one
// copy of it in the temporary directory; the first Stop leaves it to the
// other, the last Stop removes it, its lock file too.
func TestAsRootTheMirrorOfATreeGoesWithItsLastCluster(t *testing.T) {
	asRoot(t, "only root's servers run as another user, for whom binaries are mirrored")
	tree := linkedTree(t, "15.99.0")
	tmp := publicTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func() *Cluster {
		t.Helper()
		c, err := Start(ctx, Options{BinDir: filepath.Join(tree, "bin"), Movable: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return c
	}
	first, second := start(), start()
	mirror := filepath.Dir(first.BinDir())
	if mirror == tree || filepath.Dir(mirror) != tmp {
		t.Fatalf("the cluster runs %s: want a mirror of %s in %s", first.BinDir(), tree, tmp)
	}
	if second.BinDir() != first.BinDir() {
		t.Fatalf("the clusters run %s and %s: want one mirror", first.BinDir(), second.BinDir())
	}
	answers(t, ctx, first)
	answers(t, ctx, second)

	first.Stop()
	if _, err := os.Stat(filepath.Join(mirror, "bin", "postgres")); err != nil {
		t.Fatalf("the first Stop took the mirror from the other cluster: %v", err)
	}
	answers(t, ctx, second)

	second.Stop()
	for _, p := range []string{mirror, mirror + ".lock"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("after the last Stop %s is still there (%v)", p, err)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the temporary directory holds %d entries after the last Stop: %v", len(left), left)
	}
}

// exists reports whether path is there (not following a link).
func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// A mirror's users share it: a release while another user holds it leaves
// it; the last release removes it and its lock file; the next user makes
// it again. Users that come at once make it once.
func TestAMirrorIsSharedAndRemovedByItsLastUser(t *testing.T) {
	tree := filepath.Dir(fakeTree(t, filepath.Join(t.TempDir(), "15.13.0"), true))
	tmp := publicTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const users = 4
	dirs := make([]string, users)
	releases := make([]func(), users)
	errs := make([]error, users)
	var wg sync.WaitGroup
	for i := range users {
		wg.Go(func() { dirs[i], releases[i], errs[i] = mirrorTree(ctx, tree) })
	}
	wg.Wait()
	for i := range users {
		if errs[i] != nil {
			t.Fatalf("user %d: %v", i, errs[i])
		}
		if dirs[i] != dirs[0] {
			t.Fatalf("user %d got %s, user 0 %s: want one mirror", i, dirs[i], dirs[0])
		}
	}
	mirror := dirs[0]
	if filepath.Dir(mirror) != tmp || !exists(t, filepath.Join(mirror, "bin", "postgres")) {
		t.Fatalf("the mirror %s is not a copy of %s in %s", mirror, tree, tmp)
	}
	if got := entries(t, tmp); len(got) != 2 { // the mirror and its lock file: no second copy
		t.Fatalf("the temporary directory holds %v", got)
	}

	for i, release := range releases[:users-1] {
		release()
		if !exists(t, filepath.Join(mirror, "bin", "postgres")) || !exists(t, mirror+".lock") {
			t.Fatalf("release %d of %d removed the mirror from the others", i+1, users)
		}
	}
	releases[users-1]()
	releases[users-1]() // a second call changes nothing
	if got := entries(t, tmp); len(got) != 0 {
		t.Fatalf("after the last release the temporary directory holds %v", got)
	}

	again, release, err := mirrorTree(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	if again != mirror || !exists(t, filepath.Join(again, "bin", "postgres")) {
		t.Fatalf("the next user got %s, want %s made again", again, mirror)
	}
	release()
	if got := entries(t, tmp); len(got) != 0 {
		t.Fatalf("after the release the temporary directory holds %v", got)
	}
}

// When a tree is fetched again, its next mirror removes the mirrors of it
// as it was that no one uses (a mirror left by a process that died, or made
// before mirrors were removed); one still in use stays until its last user
// goes, and so does the mirror of another tree of the same name.
func TestANewMirrorRemovesTheStaleMirrorsOfItsTree(t *testing.T) {
	tree := filepath.Dir(fakeTree(t, filepath.Join(t.TempDir(), "15.13.0"), true))
	other := filepath.Dir(fakeTree(t, filepath.Join(t.TempDir(), "15.13.0"), true))
	tmp := publicTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	otherMirror, releaseOther, err := mirrorTree(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	inUse, releaseInUse, err := mirrorTree(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	// Left behind: a mirror of the tree as it was, with no lock file, as
	// before mirrors were removed or after its user was killed.
	leftStamp := tree + "\n1 1\n"
	left := mirrorName(tree, leftStamp)
	if err := os.MkdirAll(filepath.Join(left, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, mirrorStampFile), []byte(leftStamp), 0o644); err != nil {
		t.Fatal(err)
	}

	// Fetched again: another postgres.
	if err := os.WriteFile(filepath.Join(tree, "bin", "postgres"), []byte("#!/bin/sh\n# fetched again\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	fresh, releaseFresh, err := mirrorTree(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == inUse {
		t.Fatalf("the tree fetched again got the mirror of before, %s", fresh)
	}
	if exists(t, left) {
		t.Errorf("the stale mirror no one uses, %s, is still there", left)
	}
	if !exists(t, filepath.Join(inUse, "bin", "postgres")) {
		t.Errorf("the stale mirror still in use, %s, was removed", inUse)
	}
	if !exists(t, filepath.Join(otherMirror, "bin", "postgres")) {
		t.Errorf("the mirror of another tree of the same name, %s, was removed", otherMirror)
	}

	releaseInUse()
	if exists(t, inUse) {
		t.Errorf("the stale mirror %s outlived its last user", inUse)
	}
	releaseFresh()
	releaseOther()
	if got := entries(t, tmp); len(got) != 0 {
		t.Fatalf("after the last releases the temporary directory holds %v", got)
	}
}

// As root, a lock file of someone else where the mirror's goes makes the
// copy this caller's alone, removed by its release; the file stays.
func TestAsRootSomeoneElsesFileInTheWayGivesAPrivateCopy(t *testing.T) {
	asRoot(t, "only root can give a file to someone else")
	tree := filepath.Dir(fakeTree(t, filepath.Join(t.TempDir(), "15.13.0"), true))
	tmp := publicTempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stamp, err := treeStamp(tree)
	if err != nil {
		t.Fatal(err)
	}
	foreign := mirrorName(tree, stamp) + ".lock"
	if err := os.WriteFile(foreign, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil { // nobody
		t.Fatal(err)
	}
	dir, release, err := mirrorTree(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	if dir == mirrorName(tree, stamp) || !exists(t, filepath.Join(dir, "bin", "postgres")) {
		t.Fatalf("got %s, want a copy of its own", dir)
	}
	release()
	if got := entries(t, tmp); len(got) != 1 || got[0] != filepath.Base(foreign) {
		t.Fatalf("after the release the temporary directory holds %v, want only the foreign file", got)
	}
}
