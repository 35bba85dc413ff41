// Command broker is capbroker's binary: see `broker --help` and the README.
package main

import "os"

func main() {
	os.Exit(runCLI(os.Args[1:], os.Stdout, os.Stderr))
}
