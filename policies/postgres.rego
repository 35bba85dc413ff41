# Postgres front door (docs/postgres.md): phase "postgres", input.postgres.
#
# data.settings.postgres.databases (policies/data.yaml) lists the databases agents may reach,
# each with:
#   role        the Vault database role their users are issued from
#   agents      the agent ids that may connect (absent: every agent)
#   access      "read" (read-only: reads and transaction control), "write" (reads and writes;
#               DDL refused) or "ask" (reads and writes; DDL held for a person's approval)
#   schemas     optional schema allow-list: every table must be in one of them (an unqualified
#               name is taken as public, and changing search_path is refused)
#
# Whatever the settings, a statement that changes who the session is (SET ROLE, SET SESSION
# AUTHORIZATION), runs code the broker cannot read (DO, COPY ... PROGRAM, a server file) or
# reaches outside the database (the functions in `refused_functions`) is refused.
package postgres

import data.settings

pg := input.postgres

db := settings.postgres.databases[pg.database]

default decision := {"allow": false, "reason": "the policy does not know this Postgres request"}

decision := {"allow": false, "reason": sprintf("database %q is not listed in policies/data.yaml (settings.postgres.databases)", [pg.database])} if {
	not db
} else := {"allow": false, "reason": sprintf("agent %s may not connect to database %q", [input.agent.id, pg.database])} if {
	db.agents
	not input.agent.id in db.agents
} else := {"allow": true, "role": db.role} if {
	not pg.statement
} else := statement

st := pg.statement

# The connection's identity is the broker's choice, and code the broker cannot read is not run.
refusal := sprintf("%s is not allowed: the database role is chosen by the broker", [st.command]) if {
	st.command in {"SET ROLE", "RESET ROLE", "SET SESSION AUTHORIZATION", "RESET SESSION AUTHORIZATION"}
} else := sprintf("%s is not allowed: it runs code or reads files the broker cannot see", [st.command]) if {
	st.command in {"DO", "COPY PROGRAM", "COPY FILE", "CALL"}
} else := sprintf("function %s is not allowed", [f]) if {
	some f in st.functions
	f in refused_functions
} else := sprintf("tables outside the schemas %v are not allowed: %v", [db.schemas, outside]) if {
	db.schemas
	count(outside) > 0
} else := "changing search_path is not allowed where a schema allow-list applies" if {
	db.schemas
	st.setting == "search_path"
} else := sprintf("database %q is read-only: %s (%s) is not allowed", [pg.database, st.command, st.kind]) if {
	db.access == "read"
	not st.kind in {"read", "other"}
} else := sprintf("database %q is read-only: %s is not allowed", [pg.database, st.command]) if {
	db.access == "read"
	st.kind == "other"
	not st.command in read_only_other
} else := sprintf("schema changes (%s) are not allowed on database %q", [st.command, pg.database]) if {
	db.access == "write"
	st.kind == "ddl"
}

refused_functions := {
	"set_config", "dblink", "dblink_exec", "dblink_connect", "lo_import", "lo_export",
	"pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_terminate_backend",
	"pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile", "pg_promote", "pg_file_write",
}

# Statements of kind "other" a read-only connection may run: transaction control and
# harmless session state.
read_only_other := {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "SET", "RESET", "DISCARD", "DEALLOCATE", "CLOSE"}

schema_of(t) := split(t, ".")[0] if contains(t, ".")

else := "public"

outside := {t | some t in st.tables; not schema_of(t) in db.schemas}

statement := {"allow": false, "reason": refusal} if {
	refusal
} else := {"ask": {"reason": sprintf("%s on database %q", [st.command, pg.database]), "timeout": "2m"}} if {
	db.access == "ask"
	st.kind == "ddl"
} else := {"allow": true}
