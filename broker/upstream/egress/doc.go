// Package egress decides which way out a connection takes: through one of
// the operator's configured upstream proxies, or direct.
//
// It holds two deciders and nothing else: NoProxy (the operator's no_proxy
// list, matched on the destination's name, port and checked address) and
// PAC (a proxy auto-config script, evaluated in a sandboxed JavaScript
// runtime with a timeout and a per-host cache). Both are pure: they never
// dial, resolve or read anything on their own; resolution for the PAC
// helpers is the caller's Resolve function, or none at all.
//
// A PAC script may only choose among the proxies the operator configured
// (PACOptions.Proxies) or DIRECT; anything else is an error, and the caller
// applies the operator's fallback. The decision is the operator's: nothing
// here reads the environment (HTTP_PROXY, NO_PROXY) of this process or of
// the sandbox.
package egress
