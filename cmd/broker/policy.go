package main

import (
	"errors"
	"io"
)

// cmdPolicy is the policy authoring toolbox: test, eval, replay (issue 5).
func cmdPolicy(args []string, stdout, stderr io.Writer) error {
	return errors.New("policy: not implemented yet")
}
