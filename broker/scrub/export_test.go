package scrub

// SearchAtOnceFrom makes New search for the patterns at once when there are at least n of
// them (1: always; a large n: never), until the returned function restores it. Tests that
// call it must not run in parallel.
func SearchAtOnceFrom(n int) (restore func()) {
	old := multiFrom
	multiFrom = n
	return func() { multiFrom = old }
}

// NewOneByOne is New, searching for each pattern on its own however many there are.
func NewOneByOne(oldnew ...string) *Replacer { return build(1<<30, oldnew) }
