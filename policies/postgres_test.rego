package postgres_test

import data.postgres

settings := {"postgres": {"databases": {
	"app": {"role": "readonly", "access": "read"},
	"rw": {"role": "readwrite", "access": "write"},
	"ask": {"role": "readwrite", "access": "ask", "agents": ["coder-1"]},
	"pub": {"role": "readwrite", "access": "write", "schemas": ["public", "reports"]},
}}}

conn(db) := {"phase": "postgres", "agent": {"id": "coder-1", "labels": {}}, "postgres": {"database": db, "upstream": db, "user": "coder-1", "application_name": "psql", "tls": true}}

stmt(db, kind, command, tables, functions) := object.union(conn(db), {"postgres": object.union(conn(db).postgres, {"statement": {"kind": kind, "command": command, "setting": "", "tables": tables, "functions": functions}})})

set_stmt(db, setting) := object.union(conn(db), {"postgres": object.union(conn(db).postgres, {"statement": {"kind": "other", "command": "SET", "setting": setting, "tables": [], "functions": []}})})

cases := {
	"connect names the role": {"input": conn("app"), "want": {"allow": true, "role": "readonly"}},
	"unknown database": {"input": conn("nope"), "want": {"allow": false, "reason": "database \"nope\" is not listed in policies/data.yaml (settings.postgres.databases)"}},
	"read-only select": {"input": stmt("app", "read", "SELECT", ["users"], ["count"]), "want": {"allow": true}},
	"read-only begin": {"input": stmt("app", "other", "BEGIN", [], []), "want": {"allow": true}},
	"read-only insert": {"input": stmt("app", "write", "INSERT", ["users"], []), "want": {"allow": false, "reason": "database \"app\" is read-only: INSERT (write) is not allowed"}},
	"read-only ddl": {"input": stmt("app", "ddl", "CREATE TABLE", ["t"], []), "want": {"allow": false, "reason": "database \"app\" is read-only: CREATE TABLE (ddl) is not allowed"}},
	"read-only listen": {"input": stmt("app", "other", "LISTEN", [], []), "want": {"allow": false, "reason": "database \"app\" is read-only: LISTEN is not allowed"}},
	"set role": {"input": stmt("rw", "other", "SET ROLE", [], []), "want": {"allow": false, "reason": "SET ROLE is not allowed: the database role is chosen by the broker"}},
	"session authorization": {"input": stmt("rw", "other", "SET SESSION AUTHORIZATION", [], []), "want": {"allow": false, "reason": "SET SESSION AUTHORIZATION is not allowed: the database role is chosen by the broker"}},
	"do": {"input": stmt("rw", "other", "DO", [], ["do"]), "want": {"allow": false, "reason": "DO is not allowed: it runs code or reads files the broker cannot see"}},
	"copy program": {"input": stmt("rw", "other", "COPY PROGRAM", [], []), "want": {"allow": false, "reason": "COPY PROGRAM is not allowed: it runs code or reads files the broker cannot see"}},
	"set_config": {"input": stmt("app", "read", "SELECT", [], ["set_config"]), "want": {"allow": false, "reason": "function set_config is not allowed"}},
	"write db insert": {"input": stmt("rw", "write", "INSERT", ["users"], []), "want": {"allow": true}},
	"write db ddl": {"input": stmt("rw", "ddl", "DROP TABLE", ["users"], []), "want": {"allow": false, "reason": "schema changes (DROP TABLE) are not allowed on database \"rw\""}},
	"ask ddl": {"input": stmt("ask", "ddl", "CREATE TABLE", ["t"], []), "want": {"ask": {"reason": "CREATE TABLE on database \"ask\"", "timeout": "2m"}}},
	"schema allowed": {"input": stmt("pub", "read", "SELECT", ["reports.daily", "users"], []), "want": {"allow": true}},
	"schema outside": {"input": stmt("pub", "read", "SELECT", ["secret.keys", "users"], []), "want": {"allow": false, "reason": "tables outside the schemas [\"public\", \"reports\"] are not allowed: {\"secret.keys\"}"}},
	"search_path": {"input": set_stmt("pub", "search_path"), "want": {"allow": false, "reason": "changing search_path is not allowed where a schema allow-list applies"}},
}

test_decisions[name] if {
	some name, c in cases
	d := postgres.decision with input as c.input with data.settings as settings
	d == c.want
}

test_agent_not_listed if {
	d := postgres.decision with input as object.union(conn("ask"), {"agent": {"id": "other", "labels": {}}}) with data.settings as settings
	d == {"allow": false, "reason": "agent other may not connect to database \"ask\""}
}
