// Package mavenrepo stands in for Maven Central where it cannot be reached:
// it builds, from the PostgreSQL installed on the machine, a jar laid out as
// the io.zonky.test.postgres:embedded-postgres-binaries-* artifacts that
// embedded-postgres fetches are, and serves it over HTTP in a Maven
// repository's layout, counting the requests.
//
// The jar holds one .txz (tar, xz-compressed, made with the xz command):
// bin/initdb, bin/pg_ctl and bin/postgres, the server's modules and its
// share directory. It must work wherever it is unpacked, as the real
// binaries do. PostgreSQL finds its share and lib directories relative to
// its own executable, symbolic links resolved, by replacing the tail of the
// configured bindir (after the configured directories' common prefix) with
// theirs; Debian's are /usr/lib/postgresql/15/bin, /usr/lib/postgresql/15/lib
// and /usr/share/postgresql/15. So the tree keeps their paths below that
// prefix (lib/postgresql/15/bin, lib/postgresql/15/lib, share/postgresql/15)
// and bin/ holds symbolic links into lib/postgresql/15/bin. (A tree that did
// not would still start on a machine with PostgreSQL installed, from the
// compiled-in absolute paths, and prove nothing.)
package mavenrepo

import (
	"archive/tar"
	"archive/zip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
)

// ErrUnavailable is returned when the jar cannot be built here: no
// PostgreSQL installed with its pg_config, or no xz command.
var ErrUnavailable = errors.New("mavenrepo: cannot build a PostgreSQL archive on this machine")

// Jar builds the jar from the PostgreSQL server whose bin directory is
// bindir (its pg_config tells where share and lib are) into dir and returns
// its path.
func Jar(bindir, dir string) (string, error) {
	if _, err := exec.LookPath("xz"); err != nil {
		return "", fmt.Errorf("%w: no xz command: %v", ErrUnavailable, err)
	}
	conf := func(flag string) (string, error) {
		out, err := exec.Command(filepath.Join(bindir, "pg_config"), flag).Output()
		if err != nil {
			return "", fmt.Errorf("%w: %s/pg_config %s: %v", ErrUnavailable, bindir, flag, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	share, err := conf("--sharedir")
	if err != nil {
		return "", err
	}
	pkglib, err := conf("--pkglibdir")
	if err != nil {
		return "", err
	}
	confBin, err := conf("--bindir")
	if err != nil {
		return "", err
	}
	prefix := commonDir(confBin, share, pkglib)
	rel := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, prefix), "/") }

	txz := filepath.Join(dir, "postgres-linux.txz")
	if err := writeTxz(txz, func(tw *tar.Writer) error {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if err := addFile(tw, filepath.Join(bindir, b), path.Join(rel(confBin), b)); err != nil {
				return err
			}
			if rel(confBin) != "bin" {
				link := "../" + path.Join(rel(confBin), b)
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + b, Linkname: link, Mode: 0o777}); err != nil {
					return err
				}
			}
		}
		mods, err := filepath.Glob(filepath.Join(pkglib, "*.so"))
		if err != nil {
			return err
		}
		for _, m := range mods {
			if strings.HasPrefix(filepath.Base(m), "llvmjit") {
				continue // JIT: not needed, and it would need LLVM's bitcode too
			}
			if err := addFile(tw, m, path.Join(rel(pkglib), filepath.Base(m))); err != nil {
				return err
			}
		}
		return filepath.WalkDir(share, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			r, _ := filepath.Rel(share, p)
			name := path.Join(rel(share), filepath.ToSlash(r))
			if d.IsDir() {
				return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755})
			}
			return addFile(tw, p, name) // symbolic links followed
		})
	}); err != nil {
		return "", err
	}

	jar := filepath.Join(dir, "embedded-postgres-binaries.jar")
	f, err := os.Create(jar)
	if err != nil {
		return "", err
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	if w, err := zw.Create("META-INF/MANIFEST.MF"); err != nil {
		return "", err
	} else if _, err := io.WriteString(w, "Manifest-Version: 1.0\r\n"); err != nil {
		return "", err
	}
	w, err := zw.CreateHeader(&zip.FileHeader{Name: filepath.Base(txz), Method: zip.Store})
	if err != nil {
		return "", err
	}
	in, err := os.Open(txz)
	if err != nil {
		return "", err
	}
	defer in.Close()
	if _, err := io.Copy(w, in); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return jar, f.Close()
}

// commonDir is the longest directory path that all paths are in.
func commonDir(paths ...string) string {
	parts := strings.Split(filepath.Clean(paths[0]), "/")
	for _, p := range paths[1:] {
		q := strings.Split(filepath.Clean(p), "/")
		n := 0
		for n < len(parts) && n < len(q) && parts[n] == q[n] {
			n++
		}
		parts = parts[:n]
	}
	return strings.Join(parts, "/") + "/"
}

// writeTxz writes the tar that fill makes, compressed by the xz command,
// to name.
func writeTxz(name string, fill func(*tar.Writer) error) error {
	out, err := os.Create(name)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command("xz", "-1", "-c", "-T1")
	cmd.Stdout = out
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tw := tar.NewWriter(stdin)
	ferr := fill(tw)
	if ferr == nil {
		ferr = tw.Close()
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("xz: %v: %s", err, stderr.String())
	}
	if ferr != nil {
		return ferr
	}
	return out.Close()
}

func addFile(tw *tar.Writer, src, name string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return nil
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(st.Mode().Perm()), Size: st.Size(), ModTime: st.ModTime()}); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// Repo serves one jar as version Version of the artifact for this machine
// (embedded-postgres-binaries-linux-<arch>), with its .sha256, under
// /maven2; everything else is 404. It counts the requests.
type Repo struct {
	Version string
	jar     []byte
	sum     string
	jars    atomic.Int64
	all     atomic.Int64
}

// NewRepo serves the jar at path as version.
func NewRepo(jarPath, version string) (*Repo, error) {
	b, err := os.ReadFile(jarPath)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return &Repo{Version: version, jar: b, sum: hex.EncodeToString(sum[:])}, nil
}

// Artifact is the path of the jar in the repository, below its base URL.
func (r *Repo) Artifact() string {
	arch := runtime.GOARCH
	if arch == "arm64" {
		arch += "v8"
	}
	a := "embedded-postgres-binaries-" + runtime.GOOS + "-" + arch
	return "/io/zonky/test/postgres/" + a + "/" + r.Version + "/" + a + "-" + r.Version + ".jar"
}

// ServeHTTP serves /maven2 + Artifact() and its .sha256.
func (r *Repo) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.all.Add(1)
	switch req.URL.Path {
	case "/maven2" + r.Artifact():
		r.jars.Add(1)
		w.Header().Set("Content-Type", "application/java-archive")
		w.Header().Set("Content-Length", strconv.Itoa(len(r.jar))) // as Maven Central does
		_, _ = w.Write(r.jar)
	case "/maven2" + r.Artifact() + ".sha256":
		_, _ = io.WriteString(w, r.sum)
	default:
		http.NotFound(w, req)
	}
}

// Requests counts the requests served, and those of the jar.
func (r *Repo) Requests() (all, jars int64) { return r.all.Load(), r.jars.Load() }
