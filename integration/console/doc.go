// Package console holds the web console's tests that drive a real headless
// Chromium through chromedp: the live partition grid and its colours by
// state, the charts of lag and throughput moving, pausing and replaying
// from the page, a hostile payload shown as text, long values that keep the
// pages within the window, and ways back that stay on the console. They use
// the fixture of the console package's own tests (internal/consoletest) and
// live in this module so that the library's go.mod carries no chromedp.
//
// They need Chromium on PATH (Debian: apt-get install chromium; .ci/run
// installs it) and PostgreSQL, as the console package's tests do:
//
//	go test ./integration/console
package console
