// Command serve runs a stand-in for Maven Central (package mavenrepo) until
// interrupted: an archive of the installed PostgreSQL, served as
// embedded-postgres's binaries of the version given, to prove the fetch
// path where Maven Central cannot be reached:
//
//	go run ./internal/mavenrepo/serve -addr 127.0.0.1:8765 -version 15.13.0 &
//	OUTBOX_POSTGRES_REPOSITORY=http://127.0.0.1:8765/maven2 OUTBOX_POSTGRES_IGNORE_SYSTEM=1 go run ./cmd/outbox-demo
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/millrace/watermill-outbox/internal/pgcluster"
	"github.com/millrace/watermill-outbox/pgtemp"
	"github.com/millrace/watermill-outbox/pgtemp/internal/mavenrepo"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	version := flag.String("version", pgtemp.DefaultVersion, "version to serve the archive as")
	flag.Parse()
	os.Unsetenv(pgcluster.EnvIgnoreSystem) // the archive is made of the installed PostgreSQL
	bindir, err := pgcluster.SystemBinDir()
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "mavenrepo-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	jar, err := mavenrepo.Jar(bindir, dir)
	if err != nil {
		log.Fatal(err)
	}
	repo, err := mavenrepo.NewRepo(jar, *version)
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	st, _ := os.Stat(jar)
	fmt.Printf("serving %s (%d bytes, from %s) at http://%s/maven2%s\n", *version, st.Size(), bindir, l.Addr(), repo.Artifact())
	log.Fatal(http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo.ServeHTTP(w, r)
		log.Printf("%s %s", r.Method, r.URL.Path)
	})))
}
