package transparent

import (
	"fmt"
	"net/netip"
	"testing"
)

func testPools() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00:cb::/64")}
}

func TestNamesAssignStableAcrossRestart(t *testing.T) {
	a := NewNames(testPools())
	v4, ok := a.Assign("API.example.com.", false)
	if !ok || !v4.Is4() || !a.InPool(v4) {
		t.Fatalf("Assign v4 = %v %v", v4, ok)
	}
	v6, ok := a.Assign("api.example.com", true)
	if !ok || !v6.Is6() || !a.InPool(v6) {
		t.Fatalf("Assign v6 = %v %v", v6, ok)
	}
	if again, _ := a.Assign("api.example.com", false); again != v4 {
		t.Fatalf("second Assign = %v, want %v", again, v4)
	}
	if name, ok := a.Name(v4); !ok || name != "api.example.com" {
		t.Fatalf("Name(%v) = %q %v", v4, name, ok)
	}
	// A new table (the broker started again) accepts the old answer for the same name only.
	b := NewNames(testPools())
	if b.Matches("other.example.com", v4) {
		t.Fatal("a restarted table matched another name to the address")
	}
	if !b.Matches("api.example.com", v4) || !b.Matches("api.example.com", v6) {
		t.Fatal("a restarted table refused the name's own addresses")
	}
	if b.Matches("other.example.com", v4) {
		t.Fatal("after matching, another name matched the same address")
	}
	if b.Matches("api.example.com", netip.MustParseAddr("203.0.113.7")) {
		t.Fatal("matched an address outside the pools")
	}
}

func TestNamesDistinctAndBounded(t *testing.T) {
	n := NewNames([]netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")})
	seen := map[netip.Addr]string{}
	for i := 0; i < 200; i++ {
		name := fmt.Sprintf("h%d.example", i)
		a, ok := n.Assign(name, false)
		if !ok {
			t.Fatalf("Assign %s failed after %d names", name, i)
		}
		if a == netip.MustParseAddr("198.18.0.0") || a == netip.MustParseAddr("198.18.0.255") {
			t.Fatalf("assigned the pool's first or last address %v", a)
		}
		if other, dup := seen[a]; dup {
			t.Fatalf("%s and %s share %v", name, other, a)
		}
		seen[a] = name
	}
	if _, ok := n.Assign("x.example", true); ok {
		t.Fatal("assigned an IPv6 address with no IPv6 pool")
	}
}
